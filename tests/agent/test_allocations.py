"""kubelet's PodResources answer becomes each GPU's allocated pods: on plain data,
then through the agent's tick against a real gRPC server speaking kubelet's proto."""

import logging
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from agent.allocations import (
    KubeletAllocations,
    pods_by_device,
    replicas_by_gpu,
    unlisted_replicas,
    with_allocations,
)
from agent.guard import Guard
from agent.podresources import ContainerDevices, PodDevices, PodResourcesClient
from agent.podresources import api_pb2 as pb
from agent.podresources import api_pb2_grpc as pb_grpc
from agent.probe import GPU, BackendName, MigDevice, Snapshot
from agent.reporter import Reporter
from agent.service import Agent
from headroom.quantity import GIB, MIB
from tests.agent.doubles import ActionsDouble, WriterDouble, pod
from tests.agent.test_podresources import GPU0, GPU1, MIG, Kubelet

SHARED = "nvidia.com/gpu.shared"


def answer(namespace: str, name: str, resource: str, *device_ids: str) -> PodDevices:
    return PodDevices(namespace, name, (ContainerDevices("main", {resource: device_ids}),))


def cache(*pods: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["uid"]: p for p in pods}


def test_replica_ids_name_the_gpu_and_names_become_uids() -> None:
    pods = cache(
        pod("a", "uid-a", namespace="ml"),
        pod("b", "uid-b", namespace="ml"),
        pod("m", "uid-m", namespace="ml", resource="nvidia.com/mig-1g.5gb"),
    )
    found, unknown = pods_by_device(
        [
            answer("ml", "a", SHARED, f"{GPU0}::3"),
            answer("ml", "b", SHARED, f"{GPU0}::0", f"{GPU1}::7"),
            answer("ml", "m", "nvidia.com/mig-1g.5gb", MIG),
            answer("kube-system", "coredns", SHARED),  # no devices, not cached
        ],
        pods,
    )
    assert found == {
        GPU0: frozenset({"uid-a", "uid-b"}),
        GPU1: frozenset({"uid-b"}),
        MIG: frozenset({"uid-m"}),
    }
    assert unknown == []


def test_a_name_that_does_not_say_whose_devices_they_are_locates_nothing() -> None:
    not_started = pod("new", "uid-new", namespace="ml")
    del not_started["status"]["startTime"]  # kubelet has not admitted it: not its devices
    pods = cache(
        not_started,
        pod("twice", "uid-twice", namespace="ml"),
        pod("done", "uid-done", namespace="ml", phase="Succeeded"),
        pod("ok", "uid-ok", namespace="ml"),
    )
    found, unknown = pods_by_device(
        [
            answer("ml", "new", SHARED, f"{GPU0}::1"),
            # force-deleted and recreated under its name: kubelet still runs the old one
            answer("ml", "twice", SHARED, f"{GPU0}::2"),
            answer("ml", "twice", SHARED, f"{GPU1}::2"),
            answer("ml", "done", SHARED, f"{GPU1}::3"),
            answer("ml", "ok", SHARED, "gpu0-replica-4", f"{GPU1}::4"),
        ],
        pods,
    )
    assert found == {GPU1: frozenset({"uid-ok"})}
    assert [err.device_id for err in unknown] == ["gpu0-replica-4"]


def test_the_snapshot_carries_each_devices_pods() -> None:
    whole = GPU(0, GPU0, "A100", 40 * GIB, 0, 40 * GIB, allocated=frozenset({"uid-sim"}))
    mig = GPU(
        1,
        GPU1,
        "A100",
        40 * GIB,
        0,
        40 * GIB,
        mig_enabled=True,
        mig_devices=(MigDevice(MIG, "1g.5gb", 4864 * MIB, 0),),
    )
    snapshot = with_allocations(
        Snapshot((whole, mig)),
        {GPU0: frozenset({"uid-a"}), MIG: frozenset({"uid-m"}), "GPU-elsewhere": frozenset({"x"})},
    )
    first, second = snapshot.gpus
    assert first.allocated == {"uid-a", "uid-sim"}
    assert second.allocated == frozenset()
    assert second.mig_devices[0].allocated == {"uid-m"}
    assert with_allocations(snapshot, {}) is snapshot


def test_each_pods_replicas_of_each_gpu_are_counted() -> None:
    # The extender locates a pod of several replicas only where the counts add up to
    # all it asked for: distinct replica IDs over its containers, per GPU, by UID.
    two = PodDevices(
        "ml",
        "pair",
        (
            ContainerDevices("main", {SHARED: (f"{GPU0}::1", f"{GPU1}::4")}),
            ContainerDevices("side", {SHARED: (f"{GPU0}::6",)}),
        ),
    )
    pods = cache(
        pod("pair", "uid-pair", namespace="ml"),
        pod("one", "uid-one", namespace="ml"),
        pod("whole", "uid-whole", namespace="ml", resource="nvidia.com/gpu"),
        pod("m", "uid-m", namespace="ml", resource="nvidia.com/mig-1g.5gb.shared"),
        pod("twice", "uid-twice", namespace="ml"),
    )
    counts = replicas_by_gpu(
        [
            two,
            answer("ml", "one", SHARED, f"{GPU1}::0", f"{GPU1}::0"),  # listed twice: one
            answer("ml", "whole", "nvidia.com/gpu", GPU0),  # no replica: not counted
            answer("ml", "m", "nvidia.com/mig-1g.5gb.shared", f"{MIG}::2"),  # MIG: not counted
            answer("ml", "twice", SHARED, f"{GPU0}::2"),
            answer("ml", "twice", SHARED, f"{GPU1}::2"),  # whose: not known, as for allocations
            answer("ml", "ghost", SHARED, f"{GPU1}::3"),  # not in the cache
        ],
        pods,
    )
    assert counts == {GPU0: {"uid-pair": 2}, GPU1: {"uid-pair": 1, "uid-one": 1}}


def test_the_snapshot_carries_each_gpus_replica_counts() -> None:
    gpus = (
        GPU(0, GPU0, "A100", 40 * GIB, 0, 40 * GIB, allocated=frozenset({"uid-sim"})),
        GPU(1, GPU1, "A100", 40 * GIB, 0, 40 * GIB),
    )
    snapshot = with_allocations(
        Snapshot(gpus),
        {GPU0: frozenset({"uid-a"}), GPU1: frozenset({"uid-a"})},
        replicas={GPU0: {"uid-a": 2}, GPU1: {"uid-a": 1}, "GPU-elsewhere": {"x": 1}},
    )
    first, second = snapshot.gpus
    assert first.replicas == {"uid-a": 2}  # the simulation's own placement: no count
    assert second.replicas == {"uid-a": 1}


def listing(replicas: int, *gpus: str) -> dict[str, list[str]]:
    """What GetAllocatableResources answers: ``replicas`` per GPU, all healthy."""
    return {SHARED: [f"{gpu}::{n}" for gpu in gpus for n in range(replicas)]}


def listed_devices(replicas: int) -> list[pb.ContainerDevices]:
    """:func:`listing` of both GPUs as kubelet's proto answers it."""
    return [
        pb.ContainerDevices(resource_name=SHARED, device_ids=ids)
        for ids in listing(replicas, GPU0, GPU1).values()
    ]


def test_replicas_allocated_beyond_those_the_plugin_lists_are_counted_per_gpu() -> None:
    # Cut from 8 replicas to 4: kubelet keeps what it gave ::4..::7, the plugin lists
    # ::0..::3. GPU1 is not listed at all (its plugin not registered again): no word.
    held = [
        answer("ml", "a", SHARED, f"{GPU0}::5", f"{GPU0}::7"),
        answer("ml", "b", SHARED, f"{GPU0}::3"),
        answer("ml", "c", SHARED, f"{GPU1}::6"),
        answer("ml", "m", "nvidia.com/mig-1g.5gb.shared", f"{MIG}::9"),
        answer("ml", "x", SHARED, "not-a-gpu::1"),
    ]
    allocatable = listing(4, GPU0)
    allocatable["nvidia.com/mig-1g.5gb.shared"] = [f"{MIG}::0"]
    assert unlisted_replicas(held, allocatable) == {GPU0: 2}
    assert unlisted_replicas(held, listing(8, GPU0, GPU1)) == {}
    # An unhealthy replica is left out of kubelet's answer: below the highest listed
    # it says nothing; the highest itself reads as cut, which charges more, never less.
    unhealthy = {SHARED: [f"{GPU0}::{n}" for n in (0, 1, 2, 4, 5, 6)]}
    assert unlisted_replicas(held, unhealthy) == {GPU0: 1}  # ::7


def test_each_gpu_carries_its_unlisted_replicas() -> None:
    snapshot = Snapshot(
        tuple(GPU(i, uuid, "A100", 40 * GIB, 0, 40 * GIB) for i, uuid in enumerate((GPU0, GPU1)))
    )
    carried = with_allocations(snapshot, {}, {GPU1: 3, "GPU-elsewhere": 1})
    assert [gpu.unlisted_replicas for gpu in carried.gpus] == [0, 3]


# --- through the agent's tick, against a real gRPC server -------------------------


class TwoGPUs:
    """An NVML probe double: two idle GPUs with the UUIDs kubelet names."""

    name: BackendName = "nvml"
    blocking = False

    def snapshot(self) -> Snapshot:
        return Snapshot(
            tuple(
                GPU(index, uuid, "NVIDIA A100-PCIE-40GB", 40 * GIB, 0, 40 * GIB)
                for index, uuid in enumerate((GPU0, GPU1))
            )
        )

    def close(self) -> None:
        pass


def kubelet_answer() -> list[pb.PodResources]:
    def one(name: str, device_id: str) -> pb.PodResources:
        devices = [pb.ContainerDevices(resource_name=SHARED, device_ids=[device_id])]
        container = pb.ContainerResources(name="main", devices=devices)
        return pb.PodResources(namespace="ml", name=name, containers=[container])

    return [one("a", f"{GPU1}::2"), one("b", f"{GPU0}::0")]


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # a unix socket path must stay under 108 bytes; pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="podres-") as directory:
        yield Path(directory) / "kubelet.sock"


@pytest.fixture
async def kubelet(socket_path: Path) -> AsyncIterator[Kubelet]:
    servicer = Kubelet(pods=kubelet_answer(), allocatable=listed_devices(8))
    server = aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    assert server.add_insecure_port(f"unix://{socket_path}") == 1
    await server.start()
    yield servicer
    await server.stop(grace=None)


def agent(socket_path: Path) -> tuple[Agent, KubeletAllocations]:
    kubelet = KubeletAllocations(PodResourcesClient(str(socket_path), timeout_seconds=1))
    pods = cache(pod("a", "uid-a", namespace="ml"), pod("b", "uid-b", namespace="ml"))
    built = Agent(
        node_name="gpu-node-1",
        probe=TwoGPUs(),
        reporter=Reporter(WriterDouble()),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=lambda: pods,
        allocations=kubelet.read,
        unlisted=lambda: kubelet.unlisted,
        replicas=lambda: kubelet.replicas,
    )
    return built, kubelet


def listed(agent_status: Any) -> dict[tuple[int, str], tuple[int, bool]]:
    return {
        (gpu.index, p.uid): (p.used_bytes, p.allocated)
        for gpu in agent_status.gpus
        for p in gpu.pods
    }


def counted(agent_status: Any) -> dict[tuple[int, str], int | None]:
    return {(gpu.index, p.uid): p.replicas for gpu in agent_status.gpus for p in gpu.pods}


async def test_each_pod_is_reported_on_the_gpu_kubelet_gave_it(
    kubelet: Kubelet, socket_path: Path
) -> None:
    tick, allocations = agent(socket_path)
    try:
        status = await tick.tick()
    finally:
        await allocations.close()
    assert listed(status) == {(0, "uid-b"): (0, True), (1, "uid-a"): (0, True)}
    assert counted(status) == {(0, "uid-b"): 1, (1, "uid-a"): 1}
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert [gpu.unlisted_replicas for gpu in status.gpus] == [0, 0]
    assert tick.reporter.writes == 1


async def test_a_pod_of_several_replicas_is_reported_with_its_count_on_each_gpu(
    kubelet: Kubelet, socket_path: Path
) -> None:
    devices = [
        pb.ContainerDevices(resource_name=SHARED, device_ids=[f"{GPU0}::1", f"{GPU1}::5"]),
    ]
    side = [pb.ContainerDevices(resource_name=SHARED, device_ids=[f"{GPU1}::6"])]
    kubelet.pods = [
        pb.PodResources(
            namespace="ml",
            name="a",
            containers=[
                pb.ContainerResources(name="main", devices=devices),
                pb.ContainerResources(name="side", devices=side),
            ],
        )
    ]
    tick, allocations = agent(socket_path)
    try:
        status = await tick.tick()
        kubelet.rate_limited = True  # kubelet stops answering: the counts stay as they were
        missed = await tick.tick()
    finally:
        await allocations.close()
    assert listed(status) == {(0, "uid-a"): (0, True), (1, "uid-a"): (0, True)}
    assert counted(status) == {(0, "uid-a"): 1, (1, "uid-a"): 2}
    assert counted(missed) == counted(status)


async def test_a_kubelet_that_cannot_answer_costs_no_report(
    kubelet: Kubelet, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tick, allocations = agent(socket_path)
    kubelet.rate_limited = True
    try:
        with caplog.at_level(logging.INFO, logger="agent.allocations"):
            statuses = [await tick.tick() for _ in range(3)]
            kubelet.rate_limited = False
            statuses.append(await tick.tick())
    finally:
        await allocations.close()
    assert [listed(s) for s in statuses[:3]] == [{}] * 3
    assert listed(statuses[3]) == {(0, "uid-b"): (0, True), (1, "uid-a"): (0, True)}
    assert [len(s.gpus) for s in statuses] == [2] * 4
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "RateLimited" in m]) == 1  # once, not every tick
    assert len([m for m in messages if "answers again" in m]) == 1


async def test_a_kubelet_that_stops_answering_leaves_pods_where_it_put_them(
    kubelet: Kubelet, socket_path: Path
) -> None:
    tick, allocations = agent(socket_path)
    try:
        answered = await tick.tick()
        kubelet.rate_limited = True
        missed = [await tick.tick() for _ in range(2)]
    finally:
        await allocations.close()
    assert listed(answered) == {(0, "uid-b"): (0, True), (1, "uid-a"): (0, True)}
    assert [listed(s) for s in missed] == [listed(answered)] * 2


async def test_replicas_cut_away_are_reported_and_kept_while_kubelet_cannot_say(
    kubelet: Kubelet, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tick, allocations = agent(socket_path)
    # Cut to 2 replicas per GPU: b keeps GPU0::0, a keeps GPU1::2, which is gone.
    kubelet.allocatable = listed_devices(2)
    try:
        cut = await tick.tick()
        kubelet.allocatable = None  # GetAllocatableResources fails from now on
        with caplog.at_level(logging.WARNING, logger="agent.allocations"):
            unsure = [await tick.tick() for _ in range(2)]
    finally:
        await allocations.close()
    assert [gpu.unlisted_replicas for gpu in cut.gpus] == [0, 1]
    assert tick.reporter.writes == 1
    assert [[gpu.unlisted_replicas for gpu in s.gpus] for s in unsure] == [[0, 1]] * 2
    (record,) = caplog.records  # once, not every tick
    assert "stopped listing are not known" in record.getMessage()


async def test_replicas_cut_away_are_kept_while_the_plugin_lists_none_of_the_gpu(
    kubelet: Kubelet, socket_path: Path
) -> None:
    tick, allocations = agent(socket_path)
    # Cut to 2 replicas per GPU: a keeps GPU1::2, which is gone.
    kubelet.allocatable = listed_devices(2)
    try:
        cut = await tick.tick()
        # The device plugin restarts (a config change, a rollout, kubelet's restart):
        # kubelet marks every device of the resource unhealthy when it disconnects
        # (devicemanager PluginDisconnected) and lists none until it registers again.
        # Nothing says pod a left GPU1::2; the next pod allocated after it registers
        # again must still find the count, not a 0 written meanwhile.
        kubelet.allocatable = []
        restarting = await tick.tick()
        kubelet.allocatable = [
            pb.ContainerDevices(resource_name=SHARED, device_ids=ids)
            for ids in listing(2, GPU0).values()
        ]
        one_back = await tick.tick()
    finally:
        await allocations.close()
    assert [gpu.unlisted_replicas for gpu in cut.gpus] == [0, 1]
    assert [gpu.unlisted_replicas for gpu in restarting.gpus] == [0, 1]
    assert [gpu.unlisted_replicas for gpu in one_back.gpus] == [0, 1]
    # Kept only up to the replicas of the GPU kubelet still holds allocated.
    held = [answer("ml", "c", SHARED, f"{GPU1}::6")]
    assert unlisted_replicas(held, {}, {GPU1: 3}) == {GPU1: 1}
    assert unlisted_replicas([], {}, {GPU1: 3}) == {}


async def test_a_missing_socket_is_logged_once(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tick, allocations = agent(socket_path)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.allocations"):
            statuses = [await tick.tick() for _ in range(2)]
    finally:
        await allocations.close()
    assert [listed(s) for s in statuses] == [{}, {}]
    (record,) = caplog.records
    assert "SocketMissing" in record.getMessage()
    assert str(socket_path) in record.getMessage()
