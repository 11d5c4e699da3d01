"""The simulated backend on a real node: memory held by the pods' real host
processes (a fake /proc tree here), on the GPU kubelet allocated, and found
again through each pid's cgroup as with NVML."""

import functools
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from agent.allocations import KubeletAllocations
from agent.attribution import build_status
from agent.cgroups import container_of_pid
from agent.gpuspec import GPUSpec, simulated_gpu_uuid, simulated_mig_uuid
from agent.guard import Guard
from agent.podresources import PodResourcesClient
from agent.podresources import api_pb2 as pb
from agent.podresources import api_pb2_grpc as pb_grpc
from agent.processes import main_processes
from agent.reporter import Reporter
from agent.service import Agent
from agent.simulated import SimulatedProbe
from headroom.quantity import GIB
from headroom.reports import ReportStatus
from tests.agent.doubles import ActionsDouble, WriterDouble, pod
from tests.agent.test_podresources import Kubelet
from tests.agent.test_processes import v1_cgroupfs, v2_systemd, write_proc

NODE = "gpu-real-0"
SHARED = "nvidia.com/gpu.shared"
UID_A = "0b7e3c52-6a1f-4d2e-8f90-1c2d3e4f5a6b"
UID_B = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
UID_C = "c4d5e6f7-0819-4a2b-8c3d-4e5f60718293"
CID_A, CID_B, CID_C = "1" * 64, "2" * 64, "3" * 64
SANDBOX = "f" * 64


def declared(name: str, uid: str, memory: str, container_id: str | None) -> dict[str, Any]:
    return pod(name, uid, namespace="ml", memory=memory, container_id=container_id)


def cache(*pods: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["uid"]: p for p in pods}


def report(probe: SimulatedProbe, pods: dict[str, dict[str, Any]], proc: Path) -> ReportStatus:
    return build_status(
        node_name=NODE,
        backend="simulated",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        snapshot=probe.snapshot(),
        failure=None,
        pods=pods,
        resolve=functools.partial(container_of_pid, proc_root=proc),
    )


def listed(status: ReportStatus) -> dict[tuple[int, str], tuple[int, list[str]]]:
    return {(g.index, p.uid): (p.used_bytes, p.containers) for g in status.gpus for p in g.pods}


def test_uuids_are_stable_for_the_device_plugin() -> None:
    # The real node's test device plugin advertises replicas of these UUIDs;
    # a new derivation would leave every allocation pointing at no GPU.
    assert simulated_gpu_uuid(NODE, 0) == "GPU-9fe57477-f154-5d7b-b8de-7564c6d6af73"
    assert simulated_gpu_uuid(NODE, 1) != simulated_gpu_uuid(NODE, 0)
    assert simulated_gpu_uuid("other", 0) != simulated_gpu_uuid(NODE, 0)
    assert simulated_mig_uuid(NODE, 0, "1g.5gb", 0).startswith("MIG-")
    (gpu,) = SimulatedProbe(NODE, pods=list, spec=GPUSpec(1, 40 * GIB)).snapshot().gpus
    assert gpu.uuid == simulated_gpu_uuid(NODE, 0)


def test_memory_is_reported_on_real_pids_and_attributed_back_to_pods(tmp_path: Path) -> None:
    proc = write_proc(
        tmp_path,
        {
            1: v1_cgroupfs("/init.scope"),
            300: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{SANDBOX}"),
            301: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{CID_A}"),
            302: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{CID_A}"),
            410: v2_systemd(UID_B, CID_B),
        },
    )
    pods = cache(
        declared("a", UID_A, "6Gi", CID_A),
        declared("b", UID_B, "2Gi", CID_B),
    )
    probe = SimulatedProbe(
        NODE,
        pods=lambda: pods.values(),
        spec=GPUSpec(2, 40 * GIB),
        host_processes=functools.partial(main_processes, proc),
    )

    gpus = probe.snapshot().gpus
    processes = {(g.index, p.pid): p for g in gpus for p in g.processes}
    assert {key: p.used_bytes for key, p in processes.items()} == {
        (0, 301): 6 * GIB,
        (1, 410): 2 * GIB,
    }
    assert all(p.pod_uid is None for p in processes.values())  # found by cgroup, as NVML
    status = report(probe, pods, proc)
    assert listed(status) == {(0, UID_A): (6 * GIB, ["main"]), (1, UID_B): (2 * GIB, ["main"])}
    assert [g.unattributed_bytes for g in status.gpus] == [0, 0]


def test_a_pod_without_a_process_holds_nothing_until_one_starts(tmp_path: Path) -> None:
    proc = write_proc(tmp_path, {500: v1_cgroupfs(f"/kubepods/burstable/pod{UID_C}/{SANDBOX}")})
    pods = cache(declared("c", UID_C, "4Gi", CID_C))
    probe = SimulatedProbe(
        NODE,
        pods=lambda: pods.values(),
        spec=GPUSpec(1, 40 * GIB),
        host_processes=functools.partial(main_processes, proc),
    )

    (gpu,) = probe.snapshot().gpus
    assert (gpu.used_bytes, gpu.processes) == (0, ())
    assert gpu.allocated == {UID_C}  # still on its GPU, at 0 bytes
    assert listed(report(probe, pods, proc)) == {(0, UID_C): (0, [])}

    (proc / "501").mkdir()
    (proc / "501" / "cgroup").write_text(v1_cgroupfs(f"/kubepods/burstable/pod{UID_C}/{CID_C}"))
    assert listed(report(probe, pods, proc)) == {(0, UID_C): (4 * GIB, ["main"])}

    (proc / "501" / "cgroup").unlink()
    (proc / "501").rmdir()  # it exited: its memory is freed
    (gpu,) = probe.snapshot().gpus
    assert (gpu.used_bytes, gpu.processes) == (0, ())


def test_the_gpu_is_the_one_kubelet_allocated(tmp_path: Path) -> None:
    proc = write_proc(
        tmp_path,
        {
            301: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{CID_A}"),
            410: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_B}/{CID_B}"),
        },
    )
    pods = cache(declared("a", UID_A, "6Gi", CID_A), declared("b", UID_B, "2Gi", CID_B))
    allocations = {simulated_gpu_uuid(NODE, 1): frozenset({UID_A, UID_B})}
    probe = SimulatedProbe(
        NODE,
        pods=lambda: pods.values(),
        spec=GPUSpec(2, 40 * GIB),
        host_processes=functools.partial(main_processes, proc),
        allocations=lambda: allocations,
    )

    # The distributed policy would have put them on GPUs 0 and 1; kubelet chose 1 for both.
    assert listed(report(probe, pods, proc)) == {
        (1, UID_A): (6 * GIB, ["main"]),
        (1, UID_B): (2 * GIB, ["main"]),
    }
    allocations = {}  # kubelet stops answering: each pod keeps the GPU it has
    assert set(listed(report(probe, pods, proc))) == {(1, UID_A), (1, UID_B)}


def test_without_host_processes_pods_are_named_directly() -> None:
    pods = cache(declared("a", UID_A, "6Gi", CID_A))
    (gpu,) = (
        SimulatedProbe(NODE, pods=lambda: pods.values(), spec=GPUSpec(1, 40 * GIB)).snapshot().gpus
    )
    assert [(p.pid, p.pod_uid, p.used_bytes) for p in gpu.processes] == [(None, UID_A, 6 * GIB)]


# --- through the agent's tick, kubelet answering over gRPC ------------------------


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # a unix socket path must stay under 108 bytes; pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="podres-") as directory:
        yield Path(directory) / "kubelet.sock"


@pytest.fixture
async def kubelet(socket_path: Path) -> AsyncIterator[Kubelet]:
    def one(name: str, device_id: str) -> pb.PodResources:
        devices = [pb.ContainerDevices(resource_name=SHARED, device_ids=[device_id])]
        container = pb.ContainerResources(name="main", devices=devices)
        return pb.PodResources(namespace="ml", name=name, containers=[container])

    # Replica IDs as NVIDIA's device plugin (and the real node's test one) writes them.
    servicer = Kubelet(
        pods=[
            one("a", f"{simulated_gpu_uuid(NODE, 1)}::3"),
            one("b", f"{simulated_gpu_uuid(NODE, 0)}::0"),
        ]
    )
    server = aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    assert server.add_insecure_port(f"unix://{socket_path}") == 1
    await server.start()
    yield servicer
    await server.stop(grace=None)


async def test_the_agent_places_pods_where_kubelet_says_and_finds_them_by_pid(
    kubelet: Kubelet, socket_path: Path, tmp_path: Path
) -> None:
    proc = write_proc(tmp_path, {301: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{CID_A}")})
    pods = cache(declared("a", UID_A, "6Gi", CID_A), declared("b", UID_B, "2Gi", None))
    allocations = KubeletAllocations(PodResourcesClient(str(socket_path), timeout_seconds=1))
    agent = Agent(
        node_name=NODE,
        probe=SimulatedProbe(
            NODE,
            pods=lambda: pods.values(),
            spec=GPUSpec(2, 40 * GIB),
            host_processes=functools.partial(main_processes, proc),
            allocations=lambda: allocations.latest,
        ),
        reporter=Reporter(WriterDouble()),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=lambda: pods,
        resolve=functools.partial(container_of_pid, proc_root=proc),
        allocations=allocations.read,
    )
    try:
        status = await agent.tick()
    finally:
        await allocations.close()

    located = {(g.index, p.uid): (p.used_bytes, p.allocated) for g in status.gpus for p in g.pods}
    # a: its process on GPU 1, as kubelet allocated; b: no container yet, 0 bytes on GPU 0
    assert located == {(1, UID_A): (6 * GIB, True), (0, UID_B): (0, True)}
    assert kubelet.calls == ["List", "GetAllocatableResources"]  # never Get
