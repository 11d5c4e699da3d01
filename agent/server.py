"""The agent's small HTTP port: ``/healthz``, ``/readyz``, ``/metrics``.

Plain HTTP on the pod network for the kubelet's probes and Prometheus; it
serves no data that the GPUNodeReport does not already publish.
"""

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ticks = Counter(
            "headroom_agent_ticks_total", "Measurements taken.", registry=self.registry
        )
        self.report_writes = Counter(
            "headroom_agent_report_writes_total",
            "GPUNodeReport writes, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.probe_available = Gauge(
            "headroom_agent_probe_available",
            "1 when the backend (NVML or simulated) measured on the last tick, else 0.",
            registry=self.registry,
        )
        self.gpus_unread = Gauge(
            "headroom_agent_gpus_unread",
            "GPUs the last report marks unread (an NVML error on the GPU, or the backend "
            "unavailable): the extender charges them by their last figures and declarations.",
            registry=self.registry,
        )
        self.gpu_used = Gauge(
            "headroom_agent_gpu_used_bytes",
            "GPU memory in use, as last measured.",
            ["gpu", "uuid"],
            registry=self.registry,
        )
        self.gpu_total = Gauge(
            "headroom_agent_gpu_total_bytes",
            "GPU memory in total.",
            ["gpu", "uuid"],
            registry=self.registry,
        )
        self.guard_actions = Counter(
            "headroom_agent_guard_actions_total",
            "Guard actions taken, by kind (event, evict, evict-refused, delete, error).",
            ["kind"],
            registry=self.registry,
        )
        # Every label value exported at 0 from the start: increase() reads a series
        # that first appears at 1 as no increase, so an agent's first eviction (its
        # only one, often) would raise no HeadroomGuardEvicted.
        for kind in ("event", "evict", "evict-refused", "delete", "error"):
            self.guard_actions.labels(kind)
        for result in ("ok", "error"):
            self.report_writes.labels(result)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def create_app(
    metrics: AgentMetrics, *, healthy: Callable[[], bool], ready: Callable[[], bool]
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if healthy() else web.Response(status=503, text="stalled")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not synced")

    async def render(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", render)
    return app
