"""The extender's metrics a platform team alerts on (manifests/components/monitoring):
GPU nodes not measured, by reason; whether this replica is ready and answering; and
the /metrics-only listener Prometheus reaches on the pod network."""

from datetime import timedelta
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from cli.main import build_parser
from extender.server import Metrics, metrics_app
from extender.state import ClusterState
from extender.verbs import Extender
from headroom.accounting import REPORT_FAULTS
from tests.extender.conftest import MARGIN, Clock, RecordingBinder
from tests.extender.objects import EPOCH, gpu_node, gpu_report
from tests.extender.test_report_faults import duplicated, failing_gpu, unavailable

UNMEASURED = "headroom_extender_gpu_nodes_unmeasured"


def unmeasured(metrics: Metrics) -> dict[str, float | None]:
    return {
        reason: metrics.registry.get_sample_value(UNMEASURED, {"reason": reason})
        for reason in REPORT_FAULTS
    }


def extender_with(state: ClusterState, **kwargs: Any) -> Extender:
    return Extender(state, RecordingBinder(), **kwargs)


def test_gpu_nodes_charged_by_declaration_are_counted_by_reason() -> None:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    metrics = Metrics(extender_with(state))
    # Every reason is there from the start, at 0: an alert can tell 0 from no scrape.
    assert unmeasured(metrics) == dict.fromkeys(REPORT_FAULTS, 0.0)

    state.on_node("ADDED", {"metadata": {"name": "cpu-only"}, "status": {}})
    for name in ("fresh", "missing", "stale", "nvml", "gpu-error", "twice", "schema"):
        state.on_node("ADDED", gpu_node(name, gpus=2))
    two: dict[int, dict[str, int]] = {0: {}, 1: {}}
    state.on_report("ADDED", gpu_report("fresh", two))
    state.on_report("ADDED", gpu_report("stale", two, age=91))
    state.on_report("ADDED", unavailable("nvml"))
    state.on_report("ADDED", failing_gpu(gpu_report("gpu-error", two), 1))
    state.on_report("ADDED", duplicated(gpu_report("twice", two), same_uuid=False))
    future = gpu_report("schema", two)
    future["status"]["schemaVersion"] = 99
    state.on_report("ADDED", future)

    assert unmeasured(metrics) == {
        "missing": 1.0,
        "unknown-schema": 1.0,
        "nvml-unavailable": 1.0,
        "stale": 1.0,
        "gpu-unread": 2.0,  # an NVML error on one GPU, a GPU listed twice
    }

    # No event comes when a report turns stale: the scrape works it out from the clock.
    clock.now += 91
    assert unmeasured(metrics)["stale"] == 4.0  # fresh, gpu-error and twice too
    state.on_report("MODIFIED", gpu_report("fresh", two, at=EPOCH + timedelta(seconds=91)))
    assert unmeasured(metrics)["stale"] == 3.0


def test_ready_and_answering_say_whether_this_replica_schedules() -> None:
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=Clock())
    ready = [True]
    waiting: list[str | None] = [None]
    starting: list[str | None] = [None]
    extender = extender_with(
        state,
        ready=lambda: ready[0],
        waiting=lambda: waiting[0],
        starting=lambda: starting[0],
    )
    metrics = Metrics(extender)

    def values() -> tuple[float | None, float | None]:
        sample = metrics.registry.get_sample_value
        return sample("headroom_extender_ready"), sample("headroom_extender_answering")

    assert values() == (1.0, 1.0)
    waiting[0] = "scheduler lease last seen held by another: standby"
    assert values() == (1.0, 0.0)  # a standby: ready, not answering
    starting[0] = waiting[0]
    assert values() == (0.0, 0.0)  # just started: /readyz says 503 too
    starting[0] = waiting[0] = None
    ready[0] = False  # a watch blind, or not listed yet
    assert values() == (0.0, 0.0)


async def test_the_metrics_listener_serves_metrics_and_nothing_else() -> None:
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=Clock())
    state.on_node("ADDED", gpu_node("gpu-a"))
    binder = RecordingBinder()
    metrics = Metrics(Extender(state, binder))
    async with TestClient(TestServer(metrics_app(metrics))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        text = await response.text()
        assert f'{UNMEASURED}{{reason="missing"}} 1.0' in text
        assert "headroom_extender_answering 1.0" in text
        for verb in ("filter", "bind", "prioritize", "preempt"):
            assert (await client.post(f"/{verb}", json={})).status in (404, 405)
        assert (await client.get("/state")).status == 404
    assert binder.calls == []


def test_metrics_port_is_off_unless_asked_for() -> None:
    parser = build_parser()
    assert parser.parse_args(["extender"]).metrics_port is None
    args = parser.parse_args(["extender", "--metrics-port", "9403"])
    assert (args.metrics_host, args.metrics_port) == ("0.0.0.0", 9403)


async def test_the_pod_network_listener_renders_at_most_once_a_second() -> None:
    """Any pod may reach 9403 where the NetworkPolicy component is not used, and the
    page is rendered on the event loop that answers filter and bind (34 ms at 5,000
    eight-GPU nodes): a scrape storm must not keep that loop busy."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    metrics = Metrics(extender_with(state))
    renders = 0
    real = metrics.registry.collect

    def counted() -> Any:
        nonlocal renders
        renders += 1
        return real()

    metrics.registry.collect = counted  # type: ignore[method-assign]
    now = [1000.0]
    async with TestClient(TestServer(metrics_app(metrics, clock=lambda: now[0]))) as client:
        for _ in range(50):
            assert (await client.get("/metrics")).status == 200
        assert renders == 1
        state.on_node("ADDED", gpu_node("gpu-a"))
        now[0] += 1.0
        text = await (await client.get("/metrics")).text()
        assert renders == 2
        assert f'{UNMEASURED}{{reason="missing"}} 1.0' in text  # fresh once a second
