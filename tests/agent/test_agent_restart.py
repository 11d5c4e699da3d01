"""A restarted agent keeps the figures its node's stored report carries.

A GPU NVML cannot read is reported with the figures it was last read with
(agent.attribution): zero figures would say an empty GPU to an extender without a
reading of its own (restarted, or the Node re-created). The agent kept those figures
only in memory: restarted while the fault lasts (liveness after an NVML hang, a
rollout of the DaemonSet, an OOM kill), its first tick wrote the failing GPU with
zeros -- with NVML down, no GPU at all -- over the stored report, and an extender
restarted since (the same rollout) charged nothing of what was held there.
"""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from agent.client import ReportWriter
from agent.guard import Guard
from agent.probe import GPU, BackendName, GPUProcess, ProbeUnavailable, Snapshot
from agent.reporter import Reporter
from agent.service import Agent, stored_report
from headroom.quantity import GIB
from headroom.reports import GPUUsage, PodUsage, ReportStatus, report_object
from tests.agent.doubles import ActionsDouble, Clock, WriterDouble
from tests.agent.standin_api import StandIn, serving, status

NODE = "gpu-node-1"


def stored() -> ReportStatus:
    """The report written before the restart: GPU 0 holds 20 GiB of a process outside
    Kubernetes and a pod's 6 GiB, on a replica its device plugin no longer lists; GPU 1
    is idle."""
    return ReportStatus(
        node_name=NODE,
        backend="nvml",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        gpus=[
            GPUUsage(
                index=0,
                uuid="GPU-0",
                total_bytes=40 * GIB,
                used_bytes=26 * GIB,
                free_bytes=14 * GIB,
                unattributed_bytes=20 * GIB,
                pods=[PodUsage(uid="p", namespace="t", name="p", used_bytes=6 * GIB)],
                unlisted_replicas=1,
            ),
            GPUUsage(
                index=1, uuid="GPU-1", total_bytes=40 * GIB, used_bytes=0, free_bytes=40 * GIB
            ),
        ],
    )


class Probe:
    """NVML after the restart: GPU 0 fails to read (``node_down``: NVML fails whole)."""

    def __init__(self, node_down: bool = False) -> None:
        self.node_down = node_down

    @property
    def name(self) -> BackendName:
        return "nvml"

    @property
    def blocking(self) -> bool:
        return False

    def snapshot(self) -> Snapshot:
        if self.node_down:
            raise ProbeUnavailable("NVMLQueryFailed", "NVML query failed: GPU is lost")
        return Snapshot(
            gpus=(
                GPU(0, "", "", 0, 0, 0, error="NVML error reading GPU 0: GPU is lost"),
                GPU(1, "GPU-1", "A100", 40 * GIB, 0, 40 * GIB, processes=(GPUProcess(7, 0),)),
            )
        )

    def close(self) -> None:
        pass


def restarted(probe: Probe, previous: ReportStatus | None) -> tuple[Agent, WriterDouble]:
    clock = Clock()
    writer = WriterDouble()
    agent = Agent(
        node_name=NODE,
        probe=probe,
        reporter=Reporter(writer, clock=clock.monotonic),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
        clock=clock.now,
        previous=previous,
    )
    return agent, writer


async def test_a_gpu_nvml_cannot_read_after_a_restart_keeps_its_stored_figures() -> None:
    agent, writer = restarted(Probe(), stored())
    status = await agent.tick()
    gpu0 = status.gpus[0]
    assert gpu0.error
    assert (gpu0.total_bytes, gpu0.used_bytes, gpu0.unattributed_bytes) == (
        40 * GIB, 26 * GIB, 20 * GIB,
    )  # fmt: skip
    assert [p.uid for p in gpu0.pods] == ["p"]
    assert writer.objects[0]["status"]["gpus"][0]["unattributedBytes"] == 20 * GIB
    # kubelet's word, keyed by a UUID NVML could not read: kept as stored
    assert writer.objects[0]["status"]["gpus"][0]["unlistedReplicas"] == 1


async def test_nvml_down_after_a_restart_keeps_every_stored_gpu() -> None:
    agent, _ = restarted(Probe(node_down=True), stored())
    status = await agent.tick()
    assert [(g.index, g.unattributed_bytes, bool(g.error)) for g in status.gpus] == [
        (0, 20 * GIB, True),
        (1, 0, True),
    ]


async def test_another_nodes_report_is_never_carried() -> None:
    other = stored()
    other.node_name = "gpu-node-2"
    agent, _ = restarted(Probe(node_down=True), other)
    assert (await agent.tick()).gpus == []


@pytest.fixture
def server() -> Iterator[StandIn]:
    """kube-apiserver with the report stored before the restart."""
    obj: dict[str, Any] = json.loads(json.dumps(report_object(stored())))
    obj["metadata"]["resourceVersion"] = "42"
    yield from serving(lambda method, path: (200, obj))


def test_the_stored_report_is_read_at_start(server: StandIn) -> None:
    writer = ReportWriter(server.api())
    report = stored_report(writer, NODE)
    assert report is not None
    assert report.gpus[0].unattributed_bytes == 20 * GIB
    server.answer = lambda method, path: (404, status(404, "not found", reason="NotFound"))
    assert stored_report(writer, NODE) is None
    garbage = {"metadata": {"name": NODE}, "status": {"gpus": "garbage"}}
    server.answer = lambda method, path: (200, garbage)
    assert stored_report(writer, NODE) is None  # unreadable: start empty, never fail


async def test_an_extender_restarted_after_the_agent_still_charges_what_was_held() -> None:
    # The extender reads only the report now stored (its own last good reading went
    # with its restart): GPU 0's 20 GiB outside Kubernetes must still be charged.
    from headroom.accounting import account_node
    from headroom.nodes import NodeGPUs
    from headroom.reports import parse_report

    node = NodeGPUs(
        name=NODE, product="A100", count=2, confirmed=2, memory_bytes=40 * GIB,
        replicas=4, shared_capacity=8,
    )  # fmt: skip
    agent, writer = restarted(Probe(), stored())
    await agent.tick()
    report = parse_report(writer.objects[-1])
    now = report.observed_at.timestamp()
    account = account_node(node, [], report, now=now, margin=0, stale_after=90, last_good=report)
    gpu0 = next(g for g in account.gpus if g.index == 0)
    assert gpu0.accounted >= 26 * GIB
