"""The running webhook: cache, admission, HTTPS server and certificate reload, wired."""

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from kube.config import credentials
from kube.rest import Rest
from serving.site import LimitedSite
from webhook.admission import Admission
from webhook.cache import ClusterCache
from webhook.certificate import Certificate
from webhook.eviction import DEFAULT_AGENT_USER, api_pod_node, eviction_reviewer
from webhook.limits import (
    LARGE_POD_BYTES,
    LARGE_POD_CONTAINERS,
    InFlight,
    Limits,
    OffLoop,
    container_count,
)
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionRequest, AdmissionResponse, Verdict
from webhook.server import Reviewer, create_app
from webhook.tls import ReloadingContext

log = logging.getLogger(__name__)

ReloadHook = Callable[[bool, Certificate | None], None]


@dataclass(frozen=True)
class Settings:
    cert_dir: Path
    host: str = "0.0.0.0"
    port: int = 8443
    kubeconfig: str | None = None
    watch_nodes: bool = True
    limits: Limits = field(default_factory=Limits)
    cert_check_seconds: float = 10.0
    expected_dns: tuple[str, ...] = ()
    """DNS names the serving certificate must carry (the Service's <svc>.<ns>.svc)."""
    shutdown_delay_seconds: float = 2.0
    """After SIGTERM, keep serving while the endpoint is withdrawn: the
    apiserver may still send a request or two to this address."""
    agent_user: str = DEFAULT_AGENT_USER
    """The node agent's ServiceAccount user, whose evictions /validate-eviction checks."""


EVICTION_READ_TIMEOUT = 2.0
"""One GET of the evicted pod, well inside the configuration's timeoutSeconds (5)."""
API_CONNECTIONS = 16
"""To the apiserver: three held by the watches, the rest for namespace and pod reads."""


def reviewer(
    cache: ClusterCache, admission: Admission, off_loop: OffLoop | None = None
) -> Reviewer:
    """``off_loop``: where pods of LARGE_POD_CONTAINERS or more, or in a review of
    LARGE_POD_BYTES or more, are decided."""

    async def review(request: AdmissionRequest) -> Verdict:
        try:
            labels = await cache.labels_for(request.namespace) if request.namespace else {}
        except LookupError as err:
            # Deny: the ReplicaSet controller retries, and a pod is never let
            # through unmutated because of a watch that lags.
            return Verdict(AdmissionResponse.deny(request.uid, 503, str(err)), "error")
        if off_loop is not None and (
            request.body_bytes >= LARGE_POD_BYTES
            or container_count(request.object) >= LARGE_POD_CONTAINERS
        ):
            # The offer is read here, on the loop whose node events change it.
            offer = cache.mig_offer()
            return await off_loop.run(admission.review_with, request, labels, offer)
        return admission.review(request, labels)

    return review


def certificate_metrics(metrics: WebhookMetrics) -> ReloadHook:
    def on_reload(ok: bool, certificate: Certificate | None) -> None:
        metrics.certificate_reloads.labels("ok" if ok else "error").inc()
        if certificate is not None:
            metrics.certificate_expiry.set(certificate.not_valid_after_utc.timestamp())

    return on_reload


def _not_ready(stopping: asyncio.Event, cache: ClusterCache, tls: ReloadingContext) -> list[str]:
    if stopping.is_set():
        return ["shutdown"]
    problem = tls.problem()
    return [*cache.not_synced(), *([f"a valid certificate ({problem})"] if problem else [])]


async def serve(settings: Settings, stopping: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stopping`` is set).

    Raises CertificateError / KubeConfigError on bad setup, before listening.
    """
    metrics = WebhookMetrics()
    tls = ReloadingContext(
        settings.cert_dir,
        on_reload=certificate_metrics(metrics),
        expected_dns=settings.expected_dns,
    )
    metrics.certificate_expiry.set(tls.certificate.not_valid_after_utc.timestamp())
    cache = ClusterCache(watch_nodes=settings.watch_nodes)
    rest = Rest(
        credentials(settings.kubeconfig), timeout=EVICTION_READ_TIMEOUT, connections=API_CONNECTIONS
    )
    try:
        cache.start(rest)
        await _serve(settings, stopping or asyncio.Event(), metrics, tls, cache, rest)
    finally:
        cache.stop()
        await rest.close()


async def _serve(
    settings: Settings,
    stopping: asyncio.Event,
    metrics: WebhookMetrics,
    tls: ReloadingContext,
    cache: ClusterCache,
    rest: Rest,
) -> None:
    metrics.invalid_policies.set_function(lambda: len(cache.invalid_policies))
    off_loop = OffLoop()
    app = create_app(
        reviewer(cache, Admission(cache), off_loop),
        metrics=metrics,
        in_flight=InFlight(settings.limits.max_in_flight),
        not_ready=lambda: _not_ready(stopping, cache, tls),
        evictions=eviction_reviewer(api_pod_node(rest), settings.agent_user),
    )
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=settings.limits.keepalive_timeout,
    )
    await runner.setup()
    site = LimitedSite(
        runner,
        settings.host,
        settings.port,
        ssl_context=tls.context,
        limits=settings.limits,
        registry=metrics.registry,
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        off_loop.close()
        raise
    watcher = asyncio.create_task(tls.watch(settings.cert_check_seconds))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log.info("headroom webhook serving https://%s:%d/mutate", settings.host, settings.port)
    try:
        await stopping.wait()
        log.info("stopping: answering for %.1fs more", settings.shutdown_delay_seconds)
        await asyncio.sleep(settings.shutdown_delay_seconds)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        cache.stop()
        await runner.cleanup()
        off_loop.close()
