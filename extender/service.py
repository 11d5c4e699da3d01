"""The running extender: watches, state, verbs and HTTP server, wired together."""

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass

from aiohttp import web
from kubernetes import client

from extender.binding import api_binder
from extender.cache import Caches
from extender.capacity import CapacityAdvertiser, api_patcher
from extender.collector import freeze_all, run_collector
from extender.server import make_app
from extender.state import ClusterState
from extender.verbs import Extender
from headroom.accounting import DEFAULT_MARGIN_BYTES, DEFAULT_STALE_AFTER_SECONDS
from kube.config import api_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8888
    kubeconfig: str | None = None
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    assume_ttl_seconds: float = 60.0
    advertise_capacity: bool = True


async def _collect_after_sync(caches: Caches) -> None:
    """Once the caches have synced, keep garbage collection off the request path.

    Thousands of cached nodes and pods make every full collection a pause of
    hundreds of milliseconds (measured by bench/extender_bench.py), longer than
    kube-scheduler's extender timeout allows: see extender/collector.py.
    """
    await asyncio.gather(*(informer.synced.wait() for informer in caches.informers))
    freeze_all()
    log.info("caches synced; %d objects frozen out of garbage collection", gc.get_freeze_count())
    await run_collector()


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT. Raises KubeConfigError on bad credentials."""
    api = api_client(settings.kubeconfig)
    state = ClusterState(
        margin=settings.margin_bytes,
        stale_after=settings.stale_after_seconds,
        assume_ttl=settings.assume_ttl_seconds,
    )
    advertiser = (
        CapacityAdvertiser(api_patcher(api), settings.margin_bytes)
        if settings.advertise_capacity
        else None
    )
    caches = Caches(api, state, advertiser)
    caches.start()
    extender = Extender(state, api_binder(client.CoreV1Api(api)), ready=caches.ready)
    runner = web.AppRunner(make_app(extender), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port).start()
    collector = asyncio.create_task(_collect_after_sync(caches))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log.info(
        "headroom extender serving http://%s:%d (margin %d bytes, reports stale after %.0fs)",
        settings.host,
        settings.port,
        settings.margin_bytes,
        settings.stale_after_seconds,
    )
    try:
        await stopping.wait()
    finally:
        collector.cancel()
        caches.stop()
        await runner.cleanup()
        api.close()
