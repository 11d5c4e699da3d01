"""``python -m devcluster.deviceplugin``: the test device plugin standing in for NVIDIA's.

    python -m devcluster.deviceplugin --kubelet-dir /var/lib/kubelet \\
        --node gpu-real-0 --gpus 1 --replicas 4 \\
        --product NVIDIA-A100-SXM4-40GB --memory-mib 40960 --health-port 18080

Runs until SIGTERM or SIGINT, then ends its ListAndWatch streams, stops
serving and removes its socket. With ``--health-port``, ``GET /readyz`` on
``--health-host`` answers 200 once kubelet accepted the registration and the
socket is in place, 503 with the reason otherwise; ``GET /healthz`` answers
200 while the process runs.
"""

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from devcluster.deviceplugin.plugin import DevicePlugin, Paths, Server
from devcluster.deviceplugin.replicas import RESOURCE_NAME, Inventory

log = logging.getLogger("devcluster.deviceplugin")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devcluster.deviceplugin",
        description=(
            f"A test device plugin standing in for NVIDIA's: advertises {RESOURCE_NAME} "
            "time-slicing replicas to kubelet over the real Device Plugin API (v1beta1)."
        ),
    )
    parser.add_argument(
        "--kubelet-dir",
        default="/var/lib/kubelet",
        help=(
            "the sockets live in its device-plugins/; kubelet serves registration in "
            "/var/lib/kubelet whatever its --root-dir (default %(default)s)"
        ),
    )
    parser.add_argument("--node", required=True, help="node name; fixes the GPU UUIDs")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (default %(default)s)")
    parser.add_argument(
        "--replicas", type=int, default=4, help="replicas per GPU (default %(default)s)"
    )
    parser.add_argument(
        "--product",
        default="NVIDIA-A100-SXM4-40GB",
        help="the GPU model, for the log only (GFD labels come from kubelet's --node-labels)",
    )
    parser.add_argument(
        "--memory-mib", type=int, default=40960, help="GPU memory, for the log only"
    )
    parser.add_argument("--health-host", default="127.0.0.1")
    parser.add_argument(
        "--health-port", type=int, default=0, help="serve /readyz and /healthz here (0: off)"
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=0.5,
        help="how often to look for a kubelet restart (default %(default)s)",
    )
    return parser.parse_args(argv)


def health_app(server: Server) -> web.Application:
    async def readyz(request: web.Request) -> web.Response:
        ready, why = server.ready()
        return web.Response(status=200 if ready else 503, text=why + "\n")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/healthz", healthz)
    return app


async def run(args: argparse.Namespace) -> None:
    try:
        inventory = Inventory.of(args.node, args.gpus, args.replicas)
    except ValueError as error:
        raise SystemExit(f"devcluster.deviceplugin: {error}") from error
    log.info(
        "stand-in for NVIDIA's device plugin: node %s, %d x %s (%d MiB), %d replicas each",
        args.node,
        args.gpus,
        args.product,
        args.memory_mib,
        args.replicas,
    )
    for index, gpu in enumerate(inventory.gpus):
        log.info("GPU %d: %s", index, gpu)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = Server(DevicePlugin(inventory), Paths(Path(args.kubelet_dir)), args.poll_seconds)
    runner: web.AppRunner | None = None
    if args.health_port:
        runner = web.AppRunner(health_app(server), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.health_host, args.health_port).start()
        log.info("readiness on http://%s:%d/readyz", args.health_host, args.health_port)
    try:
        await server.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
