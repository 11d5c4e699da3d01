"""The running extender: watches, state, verbs and HTTP server, wired together."""

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass

from aiohttp import web

from extender.binding import ApiCalls, api_binder, api_reader
from extender.cache import WATCH_CONNECTIONS, Caches
from extender.capacity import CapacityAdvertiser, api_patcher
from extender.collector import freeze_all, run_collector
from extender.leadership import Leadership
from extender.preemption import Budgets, Offers, api_recorder
from extender.requeue import RoomNotifier, api_stamper
from extender.server import METRICS, make_app, metrics_app
from extender.state import ClusterState
from extender.verbs import Extender
from headroom.accounting import DEFAULT_MARGIN_BYTES, DEFAULT_STALE_AFTER_SECONDS
from headroom.names import HEADROOM_SCHEDULER
from headroom.preemption import BUDGET_SECONDS
from kube.config import credentials
from kube.informer import LIST_TIMEOUT_SECONDS, Informer
from kube.rest import Rest
from serving.site import serve_plain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8888
    kubeconfig: str | None = None
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    verify_after_seconds: float = 10.0
    scheduler_name: str = HEADROOM_SCHEDULER
    advertise_capacity: bool = True
    spread: bool = True
    """Bound unlocated pods by the device plugin's distributed policy (headroom.spread)."""
    choose: bool = True
    """Filter answers a GPU pod with the one node it scores best on (Extender._chosen)."""
    preempt_budget_seconds: float = BUDGET_SECONDS
    """How long the preempt verb may work (extender.preemption.BUDGET_SECONDS)."""
    leader_lease: str | None = None
    """``namespace/name`` of the scheduler's leader-election Lease (extender.leadership)."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 0
    """A second listener serving ``/metrics`` only (extender.server.metrics_app); 0: none."""


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


async def _requeue_after_sync(
    caches: Caches, state: ClusterState, notifier: RoomNotifier, leadership: Leadership
) -> None:
    """Once the caches have synced and filter answers (extender.leadership: binds sent
    before this extender started, or by a previous leader, can no longer land), retry
    what it (or the one before a restart) refused: see extender/requeue.py. A retry
    while it still waits would only be refused again, and kube-scheduler's backoff
    would grow; a standby replica's extender starts when its scheduler leads."""
    await asyncio.gather(*(informer.synced.wait() for informer in caches.informers))
    while True:
        if leadership.waiting() is None:
            break
        await asyncio.sleep(0.5)  # time alone ends most waits, the lease watch the rest
    notifier.start(name for name, node in state.nodes.items() if node.count)


async def relist_for_leadership(pods: Informer, leadership: Leadership, every: float = 0.5) -> None:
    """List the pods again once binds sent before this extender started, or before its
    kube-scheduler took the lease, can no longer be stored (Leadership.list_from):
    filter and bind wait for that list, not for the watch to show them in time."""
    asked: float | None = None
    while True:
        await asyncio.sleep(every)
        point = leadership.list_from()
        listed = pods.listed_from
        if leadership.clock() < point or asked == point:
            continue
        if listed is not None and listed >= point:
            continue
        asked = point
        log.info(
            "re-listing pods: binds sent before this extender started, or before its "
            "kube-scheduler took the lease, may have landed unseen"
        )
        pods.relist()


async def _verify(extender: Extender, every: float) -> None:
    """Read pods held by binds the watch has not confirmed, every ``every`` seconds; and
    let go of deleted pods whose grace period is over, so that pods waiting for their
    room are told of it (ClusterState.refresh) with no request coming in."""
    while True:
        await asyncio.sleep(max(every / 2, 0.5))
        try:
            extender.state.refresh(extender.state.clock())
            await extender.verify_due()
        except Exception:  # a bug here must not stop the verifier; nothing was released
            log.exception("verifying assumed pods failed; retrying")


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT. Raises KubeConfigError on bad credentials."""
    found = credentials(settings.kubeconfig)
    calls = ApiCalls(found)
    """Binds and reads, and the few writes: node capacity and room stamps, Events."""
    watches = Rest(found, timeout=LIST_TIMEOUT_SECONDS, connections=WATCH_CONNECTIONS)
    try:
        await _serve(settings, calls, watches)
    finally:
        await calls.close()
        await watches.close()


async def _serve(settings: Settings, calls: ApiCalls, watches: Rest) -> None:
    state = ClusterState(
        margin=settings.margin_bytes,
        stale_after=settings.stale_after_seconds,
        verify_after=settings.verify_after_seconds,
        spread=settings.spread,
    )
    advertiser = (
        CapacityAdvertiser(api_patcher(calls), settings.margin_bytes)
        if settings.advertise_capacity
        else None
    )
    notifier = RoomNotifier(api_stamper(calls), started=False)
    state.on_room = notifier.room
    budgets = Budgets()
    leadership = Leadership(settings.verify_after_seconds, lease=settings.leader_lease)
    caches = Caches(watches, state, advertiser, budgets=budgets.on_event, leadership=leadership)
    pods = caches.pods
    leadership.view = lambda: pods.listed_from
    extender = Extender(
        state,
        api_binder(calls),
        ready=caches.ready,
        reader=api_reader(calls),
        scheduler_name=settings.scheduler_name,
        budgets=budgets,
        offers=Offers(api_recorder(calls)),
        choose=settings.choose,
        preempt_budget=settings.preempt_budget_seconds,
        waiting=leadership.waiting,
        starting=leadership.starting,
    )
    app = make_app(extender)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    runners = [runner]
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
        if settings.metrics_port:
            # On the pod network, where any pod can reach it (without the networkpolicy
            # component): its connections are capped, per client too. The verbs'
            # listener is kube-scheduler's alone, on 127.0.0.1.
            metrics_runner, _ = await serve_plain(
                metrics_app(app[METRICS]),
                settings.metrics_host,
                settings.metrics_port,
                component="extender",
                registry=app[METRICS].registry,
            )
            runners.append(metrics_runner)
    except BaseException:
        for started in runners:
            await started.cleanup()
        raise
    caches.start()
    collector = asyncio.create_task(_collect_after_sync(caches))
    requeue = asyncio.create_task(_requeue_after_sync(caches, state, notifier, leadership))
    verifier = asyncio.create_task(_verify(extender, settings.verify_after_seconds))
    relister = asyncio.create_task(relist_for_leadership(pods, leadership))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if settings.metrics_port:
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
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
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        collector.cancel()
        requeue.cancel()
        verifier.cancel()
        relister.cancel()
        caches.stop()
        for started in runners:
            await started.cleanup()
