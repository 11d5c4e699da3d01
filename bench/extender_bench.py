"""Benchmark (not a test): filter + prioritize latency of the extender at 1k, 5k, 15k nodes.

Each size runs two servers built the same way (the real aiohttp app, wire
models and state) on 127.0.0.1: Headroom's extender over a state pre-populated
with GPU nodes, pods and fresh GPUNodeReports, and a *floor* extender that
parses the same request and passes every node with score 0. One request pair
is what kube-scheduler sends per pod with ``nodeCacheCapable: true``: /filter
with every candidate's name, then /prioritize with the survivors.

Between requests node reports are replaced, each with new figures (so none
is skipped as an unchanged heartbeat), and the lazy re-accounting of the
touched nodes is inside the timed requests. Two rates:

* *realistic*: every node's agent writes ``REPORT_WRITES_PER_NODE_MINUTE``
  times a minute (the agent's idle heartbeat, agent/reporter.py), spread over
  the bench's wall-clock time: 167 writes/s at 5,000 nodes, so about one
  report per request pair at this bench's request rate;
* *stress*: ``STRESS_REPORTS_PER_REQUEST`` reports before every request pair,
  whatever the rate: ~250x the realistic rate at 5,000 nodes.

The extender is measured with one pod declaration for every request (the pods
of one Deployment: per-node answers are reused, except on the nodes that
changed) at both rates, and *cold* (realistic rate), cycling through more
declarations than it keeps answers for, so every request works out every
reason and score afresh. Request bodies are
pre-encoded and responses are read but not parsed, so the figures are the
server's work plus a loopback round trip (client and server share one event
loop). The machine's load average is printed with the figures: on a shared
machine the p99 follows the load.

Prints a table, then one JSON object on its last line: the 5,000-node figures
at the top level (``p50_ms``/``p99_ms`` at the realistic rate, ``stress_*``
at the stress rate). Run: ``.venv/bin/python bench/extender_bench.py [--rounds N]``.
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender.collector import freeze_all, run_collector
from extender.server import make_app
from extender.state import ClusterState
from extender.verbs import Extender
from extender.verdicts import KEEP
from extender.wire import ExtenderArgs, ExtenderFilterResult, host_priority_item, json_array
from tests.extender.objects import GIB, gpu_node, gpu_pod, gpu_report, uid_of

SIZES = (1000, 5000, 15000)
REPORT_WRITES_PER_NODE_MINUTE = 2.0
"""The agent's heartbeat with its defaults (30 s): the realistic report rate."""
STRESS_REPORTS_PER_REQUEST = 5


class Churn:
    """Replaces node reports between requests: a fixed number per request, or at a rate.

    At a rate, the reports owed for the wall-clock time since the last call
    are written, so the bench's own request rate decides how many land
    between two requests. Every write changes the figures (a GPU's
    unattributed memory moves by 256 MiB), so each one re-accounts its node.
    """

    def __init__(
        self, reports: list[dict[str, Any]], *, per_second: float = 0.0, per_request: int = 0
    ) -> None:
        self._reports = reports
        self._per_second = per_second
        self._per_request = per_request
        self._owed = 0.0
        self._last: float | None = None
        self._rng = random.Random(7)
        self.written = 0

    def __call__(self, state: ClusterState) -> None:
        if not self._reports:
            return
        now = time.perf_counter()
        count = self._per_request
        if self._per_second:
            if self._last is not None:
                self._owed += (now - self._last) * self._per_second
            count = int(self._owed)
            self._owed -= count
        self._last = now
        for report in self._rng.sample(self._reports, min(count, len(self._reports))):
            gpu = report["status"]["gpus"][0]
            gpu["unattributedBytes"] ^= 256 * 2**20
            state.on_report("MODIFIED", report)
        self.written += count


class FloorExtender(Extender):
    """Same parsing and serving, no decisions: every node passes with score 0.

    Its prioritize answer is joined from per-name JSON items made once, the
    least work an answer can take, so the floor stays a floor.
    """

    def __init__(self, state: ClusterState) -> None:
        super().__init__(state, _refuse_binds)
        self._items: dict[str, str] = {}

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        names = args.NodeNames or []
        return ExtenderFilterResult.model_construct(
            Nodes=None, NodeNames=names, FailedNodes={}, FailedAndUnresolvableNodes={}, Error=""
        )

    def prioritize(self, args: ExtenderArgs) -> bytes:
        items = self._items
        return json_array([items.get(name) or self._item(name) for name in args.NodeNames or []])

    def _item(self, name: str) -> str:
        item = self._items[name] = host_priority_item(name, 0)
        return item


async def _refuse_binds(namespace: str, name: str, uid: str, node: str) -> None:
    raise AssertionError("the benchmark does not bind")


def populate(state: ClusterState, size: int, rng: random.Random) -> list[dict[str, Any]]:
    """GPU nodes with 1-8 GPUs, 0-3 pods each, and a fresh report per node."""
    reports = []
    for i in range(size):
        name = f"gpu-{i:05d}"
        gpus = rng.choice((1, 1, 2, 4, 8))
        state.on_node("ADDED", gpu_node(name, gpus=gpus))
        usage: dict[int, dict[str, int]] = {g: {} for g in range(gpus)}
        for p in range(rng.randint(0, 3)):
            pod = gpu_pod(f"w-{i}-{p}", node=name, declared=f"{rng.choice((4, 8, 10, 16))}Gi")
            state.on_pod("ADDED", pod)
            usage[rng.randrange(gpus)][uid_of(pod)] = rng.randint(1, 20) * GIB
        report = gpu_report(name, usage, unattributed={0: rng.randint(0, 4) * GIB})
        state.on_report("ADDED", report)
        reports.append(report)
    return reports


def bench_pods(distinct: int) -> list[dict[str, Any]]:
    """Pods to schedule, one per request in turn: ``distinct`` different declarations.

    One declaration is the pods of one Deployment; more declarations than the
    extender keeps per-node answers for (extender.verdicts.KEEP) make every
    request work its answers out afresh.
    """
    return [gpu_pod(f"bench-{k}", declared=f"{10 * 1024 + 64 * k}Mi") for k in range(distinct)]


async def measure(
    extender: Extender,
    names: list[str],
    rounds: int,
    churn: Churn,
    pods: list[dict[str, Any]],
) -> list[float]:
    """Milliseconds per /filter + /prioritize pair, for ``rounds`` pairs after a warm-up."""
    filter_bodies = [
        json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode() for pod in pods
    ]
    prioritize_bodies: list[bytes] = []
    warmup = len(pods) + 5
    runner = web.AppRunner(make_app(extender), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    headers = {"Content-Type": "application/json"}
    timings = []
    try:
        async with ClientSession() as session:
            for round_ in range(rounds + warmup):
                which = round_ % len(pods)
                churn(extender.state)
                started = time.perf_counter()
                async with session.post(
                    f"{url}/filter", data=filter_bodies[which], headers=headers
                ) as r:
                    body = await r.read()
                if round_ < len(pods):  # the scheduler sends the survivors; untimed
                    passed = json.loads(body)["NodeNames"]
                    args = {"Pod": pods[which], "Nodes": None, "NodeNames": passed}
                    prioritize_bodies.append(json.dumps(args).encode())
                async with session.post(
                    f"{url}/prioritize", data=prioritize_bodies[which], headers=headers
                ) as r:
                    await r.read()
                if round_ >= warmup:
                    timings.append((time.perf_counter() - started) * 1000)
    finally:
        await runner.cleanup()
    return timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench_size(size: int, rounds: int) -> dict[str, float]:
    rng = random.Random(size)
    state = ClusterState(margin=512 * 2**20, stale_after=1e9)
    reports = populate(state, size, rng)
    freeze_all()  # as extender/service.py does once the caches have synced
    names = sorted(state.nodes)
    pods = bench_pods(KEEP + 4)
    headroom = Extender(state, _refuse_binds)
    floor = FloorExtender(ClusterState(margin=0, stale_after=1e9))
    rate = size * REPORT_WRITES_PER_NODE_MINUTE / 60
    realistic = Churn(reports, per_second=rate)
    collector = asyncio.create_task(run_collector())  # as the service runs it
    try:
        ours = await measure(headroom, names, rounds, realistic, bench_pods(1))
        requests = rounds + len(bench_pods(1)) + 5
        stress = await measure(
            headroom,
            names,
            rounds,
            Churn(reports, per_request=STRESS_REPORTS_PER_REQUEST),
            bench_pods(1),
        )
        cold = await measure(headroom, names, rounds, Churn(reports, per_second=rate), pods)
        base = await measure(floor, names, rounds, Churn([]), bench_pods(1))
    finally:
        collector.cancel()
    passed = sum(
        1 for n in names if (a := state.account(n)) is not None and a.shared_headroom >= 10 * GIB
    )
    return {
        "nodes": size,
        "feasible": passed,
        "p50_ms": round(statistics.median(ours), 3),
        "p99_ms": round(percentile(ours, 0.99), 3),
        "reports_per_s": round(rate, 1),
        "reports_per_request": round(realistic.written / requests, 2),
        "stress_p50_ms": round(statistics.median(stress), 3),
        "stress_p99_ms": round(percentile(stress, 0.99), 3),
        "stress_reports_per_request": STRESS_REPORTS_PER_REQUEST,
        "cold_p50_ms": round(statistics.median(cold), 3),
        "cold_p99_ms": round(percentile(cold, 0.99), 3),
        "floor_p50_ms": round(statistics.median(base), 3),
        "floor_p99_ms": round(percentile(base, 0.99), 3),
    }


async def main(rounds: int, sizes: tuple[int, ...]) -> None:
    load_before = os.getloadavg()[0]
    rows = []
    for size in sizes:
        rows.append(await bench_size(size, rounds if size <= 5000 else max(rounds // 3, 30)))
    load_after = os.getloadavg()[0]
    print(
        f"{'nodes':>6} {'feasible':>8} {'reports/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'stress p50':>10} {'stress p99':>10} {'cold p50':>9} {'cold p99':>9} "
        f"{'floor p50':>10} {'floor p99':>10} {'p99 ratio':>9}"
    )
    for row in rows:
        ratio = row["p99_ms"] / row["floor_p99_ms"]
        print(
            f"{row['nodes']:>6} {row['feasible']:>8} {row['reports_per_s']:>9.0f} "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
            f"{row['stress_p50_ms']:>10.2f} {row['stress_p99_ms']:>10.2f} "
            f"{row['cold_p50_ms']:>9.2f} {row['cold_p99_ms']:>9.2f} "
            f"{row['floor_p50_ms']:>10.2f} {row['floor_p99_ms']:>10.2f} {ratio:>9.2f}"
        )
    print(
        f"p50/p99/cold: {REPORT_WRITES_PER_NODE_MINUTE:g} report writes per node per minute "
        f"(realistic); stress: {STRESS_REPORTS_PER_REQUEST} per request pair"
    )
    print(f"load average (1 min) before {load_before:.2f}, after {load_after:.2f}")
    headline = next((row for row in rows if row["nodes"] == 5000), rows[0])
    summary = {
        "benchmark": "extender filter+prioritize, nodeCacheCapable true",
        **{k: v for k, v in headline.items() if k != "feasible"},
        "p99_ratio": round(headline["p99_ms"] / headline["floor_p99_ms"], 2),
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "sizes": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="timed request pairs per size")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=SIZES, help="node counts (default: %(default)s)"
    )
    options = parser.parse_args()
    asyncio.run(main(options.rounds, tuple(options.sizes)))
