"""The PodResources client against a real gRPC server speaking kubelet's proto
on a unix socket; device ID parsing on plain strings; the stubs match the proto."""

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agent.allocations import replicas_by_gpu
from agent.podresources import (
    DeviceRef,
    PodDevices,
    PodResourcesClient,
    PodResourcesError,
    UnknownDeviceID,
    device_uuids,
    is_gpu_resource,
    parse_device_id,
)
from agent.podresources import api_pb2 as pb
from agent.podresources import api_pb2_grpc as pb_grpc
from tests.stubs import stale_stubs

GPU0 = "GPU-5f2b9c3e-8d1a-4e7f-b6c2-9a0d1e2f3a4b"
GPU1 = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
MIG = "MIG-11111111-2222-3333-4444-555555555555"


def numa(node: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)])


def kubelet_pods() -> list[pb.PodResources]:
    """What kubelet lists on an 8-GPU time-sliced node with a MIG GPU: GPU pods
    beside a CPU-only pod, exclusive CPUs and memory, a non-GPU device."""
    return [
        pb.PodResources(
            namespace="ml",
            name="trainer-0",
            containers=[
                pb.ContainerResources(
                    name="main",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu.shared",
                            device_ids=[f"{GPU0}::3"],
                            topology=numa(0),
                        ),
                        pb.ContainerDevices(
                            resource_name="example.com/nic", device_ids=["eth1"], topology=numa(0)
                        ),
                    ],
                    cpu_ids=[2, 3],
                    memory=[pb.ContainerMemory(memory_type="memory", size=1 << 30)],
                ),
                pb.ContainerResources(
                    name="sidecar",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu.shared",
                            device_ids=[f"{GPU1}::0", f"{GPU1}::7"],
                        )
                    ],
                ),
            ],
        ),
        pb.PodResources(
            namespace="ml",
            name="mig-job",
            containers=[
                pb.ContainerResources(
                    name="main",
                    devices=[
                        pb.ContainerDevices(resource_name="nvidia.com/mig-1g.5gb", device_ids=[MIG])
                    ],
                )
            ],
        ),
        pb.PodResources(
            namespace="kube-system",
            name="coredns-7db6d8ff4d-abcde",
            containers=[pb.ContainerResources(name="coredns")],
        ),
    ]


@dataclass
class Kubelet(pb_grpc.PodResourcesListerServicer):
    """The kubelet side: answers from ``pods``, or fails as kubelet does."""

    pods: list[pb.PodResources] = field(default_factory=kubelet_pods)
    get_enabled: bool = True
    stall: asyncio.Event | None = None
    """When set, every call waits on it (a kubelet too slow to answer)."""
    rate_limited: bool = False
    allocatable: list[pb.ContainerDevices] | None = None
    """The devices ``GetAllocatableResources`` answers; None: the call fails."""
    calls: list[str] = field(default_factory=list)

    async def _gate(self, context: aio.ServicerContext[object, object], method: str) -> None:
        self.calls.append(method)
        if self.stall is not None:
            await self.stall.wait()
        if self.rate_limited:
            # pkg/kubelet/apis/podresources/grpc/ratelimit.go
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    async def List(
        self, request: pb.ListPodResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pb.ListPodResourcesResponse:
        await self._gate(context, "List")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pb.AllocatableResourcesResponse:
        await self._gate(context, "GetAllocatableResources")
        if self.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources")
        return pb.AllocatableResourcesResponse(devices=self.allocatable, cpu_ids=[0, 1])

    async def Get(
        self, request: pb.GetPodResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pb.GetPodResourcesResponse:
        await self._gate(context, "Get")
        # kubelet returns plain Go errors here, which gRPC sends as code Unknown
        # (pkg/kubelet/apis/podresources/server_v1.go)
        if not self.get_enabled:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        for pod in self.pods:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("abort returns only by raising")


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # a unix socket path must stay under 108 bytes; pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="podres-") as directory:
        yield Path(directory)


@pytest.fixture
def kubelet() -> Kubelet:
    return Kubelet()


@pytest.fixture
async def kubelet_socket(kubelet: Kubelet, socket_dir: Path) -> AsyncIterator[Path]:
    path = socket_dir / "kubelet.sock"
    server = aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    assert server.add_insecure_port(f"unix://{path}") == 1
    await server.start()
    yield path
    if kubelet.stall is not None:
        kubelet.stall.set()
    await server.stop(grace=None)


async def test_list_returns_each_pods_gpu_devices_per_container(kubelet_socket: Path) -> None:
    async with PodResourcesClient(str(kubelet_socket)) as client:
        pods = await client.list()
    assert [(pod.namespace, pod.name) for pod in pods] == [
        ("ml", "trainer-0"),
        ("ml", "mig-job"),
        ("kube-system", "coredns-7db6d8ff4d-abcde"),
    ]
    trainer, mig_job, coredns = pods
    main, sidecar = trainer.containers
    assert main.name == "main"
    assert dict(main.devices) == {"nvidia.com/gpu.shared": (f"{GPU0}::3",)}  # no NIC
    assert dict(sidecar.devices) == {"nvidia.com/gpu.shared": (f"{GPU1}::0", f"{GPU1}::7")}
    assert dict(mig_job.containers[0].devices) == {"nvidia.com/mig-1g.5gb": (MIG,)}
    assert [(c.name, dict(c.devices)) for c in coredns.containers] == [("coredns", {})]


async def test_a_pods_replica_ids_name_its_gpus(kubelet_socket: Path) -> None:
    async with PodResourcesClient(str(kubelet_socket)) as client:
        trainer, mig_job, coredns = await client.list()
    assert device_uuids(trainer.device_ids()) == {GPU0, GPU1}
    assert device_uuids(mig_job.device_ids()) == {MIG}
    assert device_uuids(coredns.device_ids()) == frozenset()


async def test_a_pods_replicas_of_each_gpu_are_counted_over_its_containers(
    kubelet_socket: Path,
) -> None:
    # What locates a pod of several replicas: trainer-0 holds one replica of GPU0
    # (main) and two of GPU1 (its sidecar); a MIG device is not counted.
    pods = {
        uid: {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"phase": "Running", "startTime": "2025-01-01T00:00:00Z"},
        }
        for uid, namespace, name in (("uid-t", "ml", "trainer-0"), ("uid-m", "ml", "mig-job"))
    }
    async with PodResourcesClient(str(kubelet_socket)) as client:
        answer = await client.list()
    assert replicas_by_gpu(answer, pods) == {GPU0: {"uid-t": 1}, GPU1: {"uid-t": 2}}


async def test_allocatable_returns_the_gpu_devices_kubelet_may_allocate(
    kubelet: Kubelet, kubelet_socket: Path
) -> None:
    kubelet.allocatable = [
        pb.ContainerDevices(resource_name="nvidia.com/gpu.shared", device_ids=[f"{GPU0}::0"]),
        pb.ContainerDevices(resource_name="example.com/nic", device_ids=["eth1"]),
        pb.ContainerDevices(resource_name="nvidia.com/gpu.shared", device_ids=[f"{GPU0}::1"]),
        pb.ContainerDevices(resource_name="nvidia.com/mig-1g.5gb", device_ids=[MIG]),
    ]
    async with PodResourcesClient(str(kubelet_socket)) as client:
        assert await client.allocatable() == {
            "nvidia.com/gpu.shared": (f"{GPU0}::0", f"{GPU0}::1"),
            "nvidia.com/mig-1g.5gb": (MIG,),
        }
        kubelet.allocatable = None
        with pytest.raises(PodResourcesError) as failed:
            await client.allocatable()
    assert failed.value.reason == "Failed"
    assert "GetAllocatableResources" in failed.value.message


async def test_the_socket_may_be_given_as_a_grpc_target(kubelet_socket: Path) -> None:
    async with PodResourcesClient(f"unix://{kubelet_socket}") as client:
        assert client.socket == str(kubelet_socket)
        assert len(await client.list()) == 3


async def test_one_channel_serves_many_calls(kubelet: Kubelet, kubelet_socket: Path) -> None:
    async with PodResourcesClient(str(kubelet_socket)) as client:
        for _ in range(3):
            assert len(await client.list()) == 3
    assert kubelet.calls == ["List"] * 3


async def test_get_returns_one_pod(kubelet: Kubelet, kubelet_socket: Path) -> None:
    async with PodResourcesClient(str(kubelet_socket)) as client:
        pod = await client.get("ml", "mig-job")
    assert pod is not None
    assert (pod.namespace, pod.name, pod.device_ids()) == ("ml", "mig-job", (MIG,))
    assert kubelet.calls == ["Get"]


async def test_get_of_a_pod_kubelet_does_not_know_is_none(kubelet_socket: Path) -> None:
    async with PodResourcesClient(str(kubelet_socket)) as client:
        assert await client.get("ml", "not-admitted-yet") is None
        assert await client.get("other", "trainer-0") is None


async def test_get_behind_the_feature_gate_is_a_typed_error(
    kubelet: Kubelet, kubelet_socket: Path
) -> None:
    kubelet.get_enabled = False
    async with PodResourcesClient(str(kubelet_socket)) as client:
        with pytest.raises(PodResourcesError) as raised:
            await client.get("ml", "trainer-0")
        assert len(await client.list()) == 3  # List stays available
    assert raised.value.reason == "GetDisabled"
    assert "KubeletPodResourcesGet" in str(raised.value)


async def test_a_slow_kubelet_is_a_deadline_error(kubelet: Kubelet, kubelet_socket: Path) -> None:
    kubelet.stall = asyncio.Event()
    async with PodResourcesClient(str(kubelet_socket), timeout_seconds=0.2) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PodResourcesError) as raised:
            await client.list()
        elapsed = loop.time() - started
    assert raised.value.reason == "DeadlineExceeded"
    assert "0.2s" in str(raised.value)
    assert elapsed < 5


async def test_rate_limited(kubelet: Kubelet, kubelet_socket: Path) -> None:
    kubelet.rate_limited = True
    async with PodResourcesClient(str(kubelet_socket)) as client:
        with pytest.raises(PodResourcesError) as raised:
            await client.list()
    assert raised.value.reason == "RateLimited"


async def test_missing_socket_is_a_typed_error(socket_dir: Path) -> None:
    path = socket_dir / "kubelet.sock"
    async with PodResourcesClient(str(path)) as client:
        with pytest.raises(PodResourcesError) as raised:
            await client.list()
    assert raised.value.reason == "SocketMissing"
    assert str(path) in str(raised.value)


async def test_a_socket_nobody_listens_on_is_unavailable(socket_dir: Path) -> None:
    # what a kubelet restart leaves behind: the socket file, no server
    path = socket_dir / "kubelet.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    async with PodResourcesClient(str(path), timeout_seconds=2) as client:
        with pytest.raises(PodResourcesError) as raised:
            await client.list()
    assert raised.value.reason == "Unavailable"
    assert str(path) in str(raised.value)


async def list_when_up(client: PodResourcesClient) -> list[PodDevices]:
    """The channel reconnects on gRPC's back-off (1 s at first), not at once."""
    for _ in range(50):
        with contextlib.suppress(PodResourcesError):
            return await client.list()
        await asyncio.sleep(0.1)
    raise AssertionError("kubelet came back, the client did not")


async def test_the_client_recovers_once_kubelet_is_back(kubelet: Kubelet, socket_dir: Path) -> None:
    path = socket_dir / "kubelet.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    async with PodResourcesClient(str(path), timeout_seconds=2) as client:
        with pytest.raises(PodResourcesError):
            await client.list()
        server = aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{path}")  # replaces the stale file
        await server.start()
        try:
            assert len(await list_when_up(client)) == 3
        finally:
            await server.stop(grace=None)


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU0, DeviceRef(uuid=GPU0, kind="gpu")),
        (f"{GPU0}::0", DeviceRef(uuid=GPU0, kind="gpu", replica=0)),
        (f"{GPU0}::31", DeviceRef(uuid=GPU0, kind="gpu", replica=31)),
        (MIG, DeviceRef(uuid=MIG, kind="mig")),
        (f"{MIG}::2", DeviceRef(uuid=MIG, kind="mig", replica=2)),
        # MIG UUIDs of drivers before R470
        (f"MIG-{GPU0}/1/0", DeviceRef(uuid=f"MIG-{GPU0}/1/0", kind="mig")),
    ],
)
def test_device_ids_of_the_nvidia_device_plugin(device_id: str, expected: DeviceRef) -> None:
    assert parse_device_id(device_id) == expected


@pytest.mark.parametrize(
    ("device_id", "why"),
    [
        ("nvidia0", "no GPU- or MIG- prefix"),  # another plugin's naming
        ("0", "no GPU- or MIG- prefix"),
        ("", "no GPU- or MIG- prefix"),
        ("GPU-", "no GPU- or MIG- prefix"),
        (f"{GPU0}::", "is not a number"),
        (f"{GPU0}::x", "is not a number"),
        (f"{GPU0}::-1", "is not a number"),
        (f"{GPU0}::\u0663", "is not a number"),  # a non-ASCII digit
    ],
)
def test_other_device_ids_are_refused_by_name(device_id: str, why: str) -> None:
    with pytest.raises(UnknownDeviceID, match=why) as raised:
        parse_device_id(device_id)
    assert raised.value.device_id == device_id
    assert repr(device_id) in str(raised.value)


def test_replicas_of_one_gpu_collapse_to_it() -> None:
    assert device_uuids([f"{GPU0}::0", f"{GPU0}::5", GPU1]) == {GPU0, GPU1}


@pytest.mark.parametrize(
    ("resource", "gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("nvidia.com/mig-3g.20gb.shared", True),
        ("nvidia.com/gpus", False),
        ("amd.com/gpu", False),
        ("example.com/nic", False),
        ("hugepages-2Mi", False),
    ],
)
def test_gpu_resources(resource: str, gpu: bool) -> None:
    assert is_gpu_resource(resource) is gpu


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    """The committed stubs are what ``make podresources`` would write now."""
    stale = stale_stubs("agent/podresources/api.proto", tmp_path)

    assert stale == [], f"{', '.join(stale)} stale: run make podresources"


def test_the_stubs_speak_kubelets_service_name() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [method.name for method in service.methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]
