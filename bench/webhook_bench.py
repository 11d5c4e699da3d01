"""Admission latency of the webhook over TLS, against a floor in the same run.

Not a test: run it, read the table. The server is the real app (real
admission, real ``decide``, real metrics) over real TLS with certificates from
``headroom certs generate``, in a subprocess of its own so that the load
generator does not share its event loop. The same server also answers
``/floor``: read the body, read the uid, answer "allowed" -- the least any
correct webhook does -- so ``ratio`` is the cost of Headroom's work.

The load is open-loop at a fixed rate (each request starts at its scheduled
time whether or not earlier ones finished) from a keep-alive aiohttp session,
and latency is counted from the scheduled start, so a stall shows in the tail
instead of hiding (no coordinated omission). Floor and real runs alternate in
short rounds, so that noise from a busy machine lands on both.

    .venv/bin/python bench/webhook_bench.py [--seconds 8] [--rates 50,200,500]

The last line is one JSON object: p50_ms, p99_ms, floor_p50_ms, floor_p99_ms
and ratio_p50 for 200 requests/s, then every rate under "rates".
"""

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
REVIEW = ROOT / "tests" / "data" / "admission" / "deployment-pod-shared.json"
POLICIES = ROOT / "tests" / "data" / "admission" / "policies.yaml"
NAMESPACE, POLICY = "ml-team", "shared-default"
ROUNDS = 4
"""Each rate's time is split into this many floor/real round pairs."""


# --- the server (subprocess) ---------------------------------------------


async def floor(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": body["request"]["uid"], "allowed": True},
    }
    return web.Response(
        body=json.dumps(answer, separators=(",", ":")), content_type="application/json"
    )


async def serve(cert_dir: Path, port_file: Path) -> None:
    import yaml

    from webhook.admission import Admission
    from webhook.cache import ClusterCache
    from webhook.metrics import WebhookMetrics
    from webhook.server import create_app
    from webhook.service import reviewer
    from webhook.tls import ReloadingContext

    cache = ClusterCache(watch_nodes=False)
    labels = {"headroom.dev/policy": POLICY}
    cache.on_namespace("ADDED", {"metadata": {"name": NAMESPACE, "labels": labels}})
    for document in yaml.safe_load_all(POLICIES.read_text()):
        if document:
            cache.on_policy("ADDED", document)
    app = create_app(reviewer(cache, Admission(cache)), metrics=WebhookMetrics())
    app.router.add_post("/floor", floor)
    tls = ReloadingContext(cert_dir)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock, ssl_context=tls.context).start()
    await asyncio.to_thread(port_file.write_text, str(sock.getsockname()[1]))
    await asyncio.Event().wait()


# --- the load generator ----------------------------------------------------


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, scheduled: float, out: list[float]
) -> None:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        answer = await r.read()
    if r.status != 200 or b'"allowed":true' not in answer:
        raise RuntimeError(f"{url}: HTTP {r.status}: {answer[:200]!r}")
    out.append((time.perf_counter() - scheduled) * 1000)


async def open_loop(
    session: aiohttp.ClientSession, url: str, body: bytes, rate: float, seconds: float
) -> list[float]:
    latencies: list[float] = []
    tasks = []
    start = time.perf_counter() + 0.05
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(session, url, body, scheduled, latencies)))
    await asyncio.gather(*tasks)
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux), to price each request apart from noise."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(
    session: aiohttp.ClientSession, url: str, body: bytes, rate: float, seconds: float, pid: int
) -> tuple[list[float], float]:
    """Latencies, and the server's CPU seconds spent meanwhile."""
    before = cpu_seconds(pid)
    latencies = await open_loop(session, url, body, rate, seconds)
    return latencies, cpu_seconds(pid) - before


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float], cpu: float) -> dict[str, float]:
    return {
        "server_cpu_us_per_request": round(cpu / len(values) * 1e6, 1),
        "p50_ms": round(statistics.median(values), 3),
        "p90_ms": round(percentile(values, 0.90), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
        "max_ms": round(max(values), 3),
        "n": len(values),
    }


async def measure(
    base: str, ca_file: Path, rates: list[int], seconds: float, pid: int
) -> dict[str, Any]:
    body = REVIEW.read_bytes()
    context = ssl.create_default_context(cafile=str(ca_file))
    connector = aiohttp.TCPConnector(ssl=context, limit=256)
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=connector) as session:
        for url in (f"{base}/mutate", f"{base}/floor"):  # warm up connections and code paths
            await open_loop(session, url, body, 200, 1.0)
        for rate in rates:
            real: list[float] = []
            floor_: list[float] = []
            cpu = {"floor": 0.0, "mutate": 0.0}
            for _ in range(ROUNDS):
                for path, into in (("floor", floor_), ("mutate", real)):
                    latencies, used = await timed(
                        session, f"{base}/{path}", body, rate, seconds / ROUNDS, pid
                    )
                    into += latencies
                    cpu[path] += used
            results[str(rate)] = {
                "webhook": summary(real, cpu["mutate"]),
                "floor": summary(floor_, cpu["floor"]),
            }
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'rate/s':>7} {'handler':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'n':>6} {'p50 ratio':>10} {'server CPU us/req':>18}",
    ]
    for rate, pair in results.items():
        for name in ("floor", "webhook"):
            row = pair[name]
            ratio = row["p50_ms"] / pair["floor"]["p50_ms"]
            lines.append(
                f"{rate:>7} {name:>8} {row['p50_ms']:>8.3f} {row['p90_ms']:>8.3f} "
                f"{row['p99_ms']:>8.3f} {row['max_ms']:>8.3f} {row['n']:>6} {ratio:>10.2f} "
                f"{row['server_cpu_us_per_request']:>18.0f}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per rate (default 8)")
    parser.add_argument("--rates", default="50,200,500", help="requests/s (default 50,200,500)")
    parser.add_argument("--serve", type=Path, metavar="CERT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.port_file))
        return 0
    rates = [int(r) for r in args.rates.split(",")]
    if 200 not in rates:
        rates.append(200)
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        from cli.main import main as headroom

        generate = ["certs", "generate", "--service", "headroom-webhook", "--namespace", "bench"]
        if headroom([*generate, "--ip", "127.0.0.1", "--out", str(cert_dir)]) != 0:
            return 1
        port_file = Path(tmp) / "port"
        command = [
            sys.executable,
            __file__,
            "--serve",
            str(cert_dir),
            "--port-file",
            str(port_file),
        ]
        server = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if server.poll() is not None or time.monotonic() > deadline:
                    print("the benchmark server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            base = f"https://127.0.0.1:{port_file.read_text()}"
            results = asyncio.run(
                measure(base, cert_dir / "ca.crt", rates, args.seconds, server.pid)
            )
        finally:
            server.terminate()
            server.wait(10)
    load = os.getloadavg()[0]
    print(
        f"admission latency over TLS, {os.cpu_count()} CPUs (load {load:.1f}), "
        f"open loop, {args.seconds}s per rate"
    )
    print(table(results))
    at200 = results["200"]
    figures = {
        "p50_ms": at200["webhook"]["p50_ms"],
        "p99_ms": at200["webhook"]["p99_ms"],
        "floor_p50_ms": at200["floor"]["p50_ms"],
        "floor_p99_ms": at200["floor"]["p99_ms"],
        "ratio_p50": round(at200["webhook"]["p50_ms"] / at200["floor"]["p50_ms"], 3),
        "ratio_p99": round(at200["webhook"]["p99_ms"] / at200["floor"]["p99_ms"], 3),
        "rates": results,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
