"""The agent's HTTP port on 127.0.0.1, its policy cache, its loop, and its command line."""

import argparse
import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.caches import PolicyCache
from agent.guard import Guard
from agent.podresources import DEFAULT_SOCKET
from agent.probe import GPU, BackendName, Probe, ProbeUnavailable, Snapshot
from agent.reporter import Reporter, WritePolicy
from agent.server import AgentMetrics, create_app
from agent.service import Agent, AgentConfig
from cli.main import build_parser, main
from cli.options import duration
from devcluster.state import free_port
from headroom import names
from tests.agent.doubles import ActionsDouble, Clock, WriterDouble


async def test_health_readiness_and_metrics_over_http() -> None:
    metrics = AgentMetrics()
    metrics.ticks.inc(3)
    state = {"healthy": True, "ready": False}
    app = create_app(metrics, healthy=lambda: state["healthy"], ready=lambda: state["ready"])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.get("/healthz") as response:
                assert response.status == 200
            async with http.get("/readyz") as response:
                assert response.status == 503
            state["ready"], state["healthy"] = True, False
            async with http.get("/readyz") as response:
                assert response.status == 200
            async with http.get("/healthz") as response:
                assert response.status == 503
            async with http.get("/metrics") as response:
                assert "headroom_agent_ticks_total 3.0" in await response.text()
    finally:
        await runner.cleanup()


def test_policy_cache_keeps_valid_policies_only(caplog: pytest.LogCaptureFixture) -> None:
    cache = PolicyCache()
    good = {
        "apiVersion": names.API_VERSION,
        "kind": names.POLICY_KIND,
        "metadata": {"name": "team-a"},
        "spec": {"guard": "evict"},
    }
    cache.on_event("ADDED", good)
    assert cache.policies["team-a"].spec.guard == "evict"
    with caplog.at_level(logging.WARNING):
        cache.on_event("MODIFIED", {**good, "spec": {"guard": "explode"}})
    assert "team-a" not in cache.policies  # never half-applied
    assert "guard" in caplog.text
    cache.on_event("ADDED", good)
    cache.on_event("DELETED", good)
    assert cache.policies == {}


class BrokenProbe:
    """A backend with a bug: raises something no one foresaw."""

    @property
    def name(self) -> BackendName:
        return "nvml"

    @property
    def blocking(self) -> bool:
        return False

    def snapshot(self) -> Snapshot:
        raise RuntimeError("bug in a backend")

    def close(self) -> None:
        self.closed = True


def bare_agent(probe: Probe) -> Agent:
    """An agent of ``probe`` on a node with no pods, writing to a double."""
    return Agent(
        node_name="n",
        probe=probe,
        reporter=Reporter(WriterDouble()),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
    )


async def test_the_loop_survives_a_failing_tick(caplog: pytest.LogCaptureFixture) -> None:
    probe = BrokenProbe()
    agent = bare_agent(probe)
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR):
        task = asyncio.create_task(agent.run(stop, interval_seconds=0.01))
        await asyncio.sleep(0.1)
        stop.set()
        await task
    assert caplog.text.count("tick failed") >= 2  # it kept ticking
    assert probe.closed


class StallingProbe(BrokenProbe):
    """A backend whose read takes ``seconds`` of the injected clock (NVML hung on a GPU)."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def snapshot(self) -> Snapshot:
        self.clock.advance(self.seconds)
        return Snapshot()


async def test_a_report_is_dated_when_its_tick_started_reading() -> None:
    # Dated after a slow read, a report would pass figures read minutes ago as fresh
    # for another report-stale-after: the date must be no later than the first read.
    clock = Clock()

    async def slow_kubelet(pods: Mapping[str, Any]) -> dict[str, frozenset[str]]:
        clock.advance(2)
        return {}

    agent = Agent(
        node_name="n",
        probe=StallingProbe(clock, 200),
        reporter=Reporter(WriterDouble(), clock=clock.monotonic),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
        allocations=slow_kubelet,
        clock=clock.now,
    )
    status = await agent.tick()
    assert status.observed_at == clock.start


@pytest.mark.parametrize("heartbeat", [0.4, 0.5, 1.2])
async def test_a_sub_second_heartbeat_still_reports(heartbeat: float) -> None:
    # `headroom agent --interval 200ms --heartbeat 400ms`: the report's heartbeatSeconds
    # (at least 1) was the heartbeat rounded, 0, and every tick failed to build its
    # report: nothing was ever written. It is the heartbeat rounded up.
    writer = WriterDouble()
    agent = Agent(
        node_name="n",
        probe=StallingProbe(Clock(), 0),
        reporter=Reporter(writer, WritePolicy(heartbeat_seconds=heartbeat)),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
    )
    status = await agent.tick()
    assert status.heartbeat_seconds is not None
    assert status.heartbeat_seconds >= heartbeat
    assert len(writer.objects) == 1


def test_durations() -> None:
    assert duration("5s") == 5.0
    assert duration("500ms") == 0.5
    assert duration("2m") == 120.0
    assert duration("7") == 7.0
    for bad in ("5x", "-1s", "0s", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"duration|positive"):
            duration(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agent"], "--node-name is required"),
        (
            ["agent", "--node-name", "n", "--sim-gpus", "1x40Gi"],
            "--sim-gpus needs --backend simulated",
        ),
        (["agent", "--node-name", "n", "--backend", "simulated", "--sim-gpus", "40Gi"], "GPU spec"),
        (
            ["agent", "--node-name", "n", "--sim-processes", "host"],
            "--sim-processes needs --backend simulated",
        ),
        (["agent", "--node-name", "n", "--guard-grace", "0"], "--guard-grace"),
    ],
)
def test_command_line_errors_exit_2(
    argv: list[str], message: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert message in caplog.text


def test_pod_resources_socket_defaults_to_kubelets_and_empty_asks_nothing() -> None:
    parser = build_parser()
    assert parser.parse_args(["agent"]).pod_resources_socket == DEFAULT_SOCKET
    assert parser.parse_args(["agent", "--pod-resources-socket", ""]).pod_resources_socket == ""


def test_kubelet_is_asked_on_real_nodes_only() -> None:
    assert AgentConfig("n").asks_kubelet
    assert not AgentConfig("n", pod_resources_socket="").asks_kubelet
    assert not AgentConfig("n", backend="simulated").asks_kubelet  # a KWOK node has no kubelet
    assert AgentConfig("n", backend="simulated", sim_processes="host").asks_kubelet
    parser = build_parser()
    assert parser.parse_args(["agent"]).sim_processes == "none"


class HungProbe(BrokenProbe):
    """NVML that never answers its first read (a GPU fallen off the bus mid-call)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    @property
    def blocking(self) -> bool:
        return True

    def snapshot(self) -> Snapshot:
        self.release.wait(timeout=30)
        return Snapshot()


async def test_a_first_tick_that_never_ends_is_a_stall() -> None:
    # Liveness read "no tick yet" as healthy: NVML hung on the agent's very first
    # read left it alive for good, with no report and the guard off.
    probe = HungProbe()
    agent = bare_agent(probe)
    assert not agent.stalled(0.05)  # not ticking yet: the pod cache may still be syncing
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, interval_seconds=0.01))
    try:
        await asyncio.sleep(0.02)
        assert not agent.stalled(0.5)
        await asyncio.sleep(0.1)
        assert agent.stalled(0.05)
    finally:
        stop.set()
        probe.release.set()
        await task
    assert agent.last_tick_at is not None
    assert not agent.stalled(5)


class FlakyProbe(BrokenProbe):
    """Two GPUs; NVML fails to read those in ``failing``, or the whole backend is down."""

    def __init__(self) -> None:
        self.failing: set[int] = set()
        self.down = False

    def snapshot(self) -> Snapshot:
        if self.down:
            raise ProbeUnavailable("DriverNotLoaded", "NVML: driver not loaded")
        gb = 2**30
        return Snapshot(
            gpus=tuple(
                GPU(i, "", "", 0, 0, 0, error=f"NVML error reading GPU {i}: Unknown")
                if i in self.failing
                else GPU(i, f"GPU-{i}", "NVIDIA A100", 40 * gb, gb, 39 * gb)
                for i in range(2)
            )
        )


async def test_gpus_unread_counts_what_the_report_leaves_unmeasured() -> None:
    # The report carries an unread GPU's last figures with the error: the extender
    # charges it conservatively and nothing else says so but this gauge and the report.
    probe = FlakyProbe()
    agent = bare_agent(probe)

    def values() -> tuple[float | None, float | None]:
        sample = agent.metrics.registry.get_sample_value
        return sample("headroom_agent_gpus_unread"), sample("headroom_agent_probe_available")

    await agent.tick()
    assert values() == (0.0, 1.0)
    probe.failing = {1}
    await agent.tick()
    assert values() == (1.0, 1.0)
    probe.down = True
    await agent.tick()
    assert values() == (2.0, 0.0)  # every GPU carried from the last report, unread
    probe.down, probe.failing = False, set()
    await agent.tick()
    assert values() == (0.0, 1.0)
