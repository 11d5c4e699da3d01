"""The test device plugin against a real gRPC server playing kubelet's Registration
service on a unix socket, then called as kubelet's device manager calls it; its
decisions on plain lists; the process as a cluster component; the stubs match
the vendored proto."""

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc import aio
from hypothesis import given
from hypothesis import strategies as st

from agent.gpuspec import GPUSpec
from agent.podresources import parse_device_id
from agent.simulated import SimulatedProbe
from devcluster.deviceplugin import api_pb2 as pb
from devcluster.deviceplugin import api_pb2_grpc as pb_grpc
from devcluster.deviceplugin import component
from devcluster.deviceplugin.plugin import DevicePlugin, Paths, Server
from devcluster.deviceplugin.replicas import (
    InvalidRequest,
    Inventory,
    allocate_envs,
    gpu_of,
    gpu_uuid,
    preferred_allocation,
    validate_request,
)
from devcluster.state import ClusterState
from tests.stubs import REPO, stale_stubs

NODE = "gpu-real-0"
RESOURCE = "nvidia.com/gpu.shared"
GIB = 1 << 30
Context = aio.ServicerContext[object, object]


# --- kubelet's side ----------------------------------------------------------


@dataclass
class Registration(pb_grpc.RegistrationServicer):
    """kubelet's Registration service: before it answers, it dials the plugin's
    endpoint and asks its options, as kubelet's ``connectClient`` and
    ``PluginConnected`` do (pkg/kubelet/cm/devicemanager), so a plugin that does
    not serve while it registers never registers. ``refuse`` answers as kubelet
    does a request it rejects (a plain error, code Unknown)."""

    directory: Path
    requests: list[pb.RegisterRequest] = field(default_factory=list)
    options: list[pb.DevicePluginOptions] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    refuse: str = ""
    refusals: int = 0
    refused: asyncio.Event = field(default_factory=asyncio.Event)

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.Empty:
        if self.refuse:
            self.refusals += 1
            self.refused.set()
            await context.abort(grpc.StatusCode.UNKNOWN, self.refuse)
        endpoint = self.directory / request.endpoint
        async with aio.insecure_channel(f"unix://{endpoint}") as channel:
            options = await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), timeout=10
            )
        self.options.append(options)
        self.requests.append(request)
        self.arrived.set()
        return pb.Empty()

    async def registrations(self, count: int) -> pb.RegisterRequest:
        """The ``count``-th request, once it arrived."""
        async with asyncio.timeout(10):
            while len(self.requests) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.requests[count - 1]


@dataclass
class Kubelet:
    """Serves Registration on ``<dir>/device-plugins/kubelet.sock`` and restarts
    as kubelet's device manager does: every file in the directory removed, then a
    new kubelet.sock (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go)."""

    paths: Paths
    registration: Registration = field(init=False)
    server: aio.Server | None = None

    def __post_init__(self) -> None:
        self.registration = Registration(self.paths.directory)

    async def start(self) -> None:
        self.paths.directory.mkdir(parents=True, exist_ok=True)
        self.server = aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self.registration, self.server)
        assert self.server.add_insecure_port(f"unix://{self.paths.kubelet_socket}") == 1
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    async def restart(self, *, remove_plugin_sockets: bool = True) -> None:
        await self.stop()
        for entry in self.paths.directory.iterdir():
            if remove_plugin_sockets or entry == self.paths.kubelet_socket:
                entry.unlink()
        await self.start()

    @contextlib.asynccontextmanager
    async def plugin(self) -> AsyncIterator[pb_grpc.DevicePluginStub]:
        """A channel to the endpoint the plugin registered, as kubelet dials it."""
        endpoint = self.paths.directory / self.registration.requests[-1].endpoint
        async with aio.insecure_channel(f"unix://{endpoint}") as channel:
            yield pb_grpc.DevicePluginStub(channel)


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    # unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer
    directory = tempfile.mkdtemp(prefix="dp-", dir="/tmp")
    yield Path(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def kubelet(kubelet_dir: Path) -> AsyncIterator[Kubelet]:
    kubelet = Kubelet(Paths(kubelet_dir))
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@contextlib.asynccontextmanager
async def running(kubelet_dir: Path, gpus: int = 1, replicas: int = 4) -> AsyncIterator[Server]:
    """The plugin serving and registering in this event loop until the block ends."""
    server = Server(
        DevicePlugin(Inventory.of(NODE, gpus, replicas)), Paths(kubelet_dir), poll_seconds=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        yield server
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task


async def registered(kubelet: Kubelet, server: Server, count: int = 1) -> pb.RegisterRequest:
    """The ``count``-th registration, once the plugin has kubelet's answer too."""
    request = await kubelet.registration.registrations(count)
    for _ in range(500):
        if server.status.registrations >= count:
            return request
        await asyncio.sleep(0.01)
    raise AssertionError(f"the plugin never took in registration {count}: {server.status}")


async def first_list(stub: pb_grpc.DevicePluginStub) -> list[pb.Device]:
    stream = stub.ListAndWatch(pb.Empty())
    response: pb.ListAndWatchResponse = await stream.read()
    stream.cancel()
    return list(response.devices)


async def preferred(
    stub: pb_grpc.DevicePluginStub, available: list[str], size: int, required: tuple[str, ...] = ()
) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available,
                must_include_deviceIDs=required,
                allocation_size=size,
            )
        ]
    )
    response: pb.PreferredAllocationResponse = await stub.GetPreferredAllocation(request)
    (container,) = response.container_responses
    return list(container.deviceIDs)


def allocate_request(*device_ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )


GPU0, GPU1 = gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)


# --- registration and the API ------------------------------------------------


async def test_registers_with_kubelet_as_nvidias_plugin_does(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    async with running(kubelet_dir) as server:
        request = await registered(kubelet, server)
        assert request.version == "v1beta1"
        assert request.endpoint == "headroom-gpu.sock"
        assert request.resource_name == RESOURCE
        assert request.options.get_preferred_allocation_available is True
        assert request.options.pre_start_required is False
        # what kubelet asked the plugin while it registered
        assert kubelet.registration.options == [
            pb.DevicePluginOptions(get_preferred_allocation_available=True)
        ]
        assert (kubelet_dir / "device-plugins" / "headroom-gpu.sock").is_socket()
        assert server.ready() == (
            True,
            f"registered {RESOURCE} with kubelet (4 replicas on 1 GPUs)",
        )
    assert not (kubelet_dir / "device-plugins" / "headroom-gpu.sock").exists(), "socket left"


async def test_list_and_watch_advertises_healthy_replicas_named_by_their_gpu(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    async with running(kubelet_dir):
        await kubelet.registration.registrations(1)
        async with kubelet.plugin() as stub:
            devices = await first_list(stub)
    assert [device.ID for device in devices] == [f"{GPU0}::{n}" for n in range(4)]
    assert {device.health for device in devices} == {"Healthy"}
    assert not any(device.HasField("topology") for device in devices)
    # the agent's PodResources path reads them back to this GPU
    assert {parse_device_id(device.ID).uuid for device in devices} == {GPU0}
    assert [parse_device_id(device.ID).replica for device in devices] == [0, 1, 2, 3]


async def test_the_stream_stays_open_and_ends_when_the_plugin_stops(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    endpoint = Paths(kubelet_dir).socket
    async with aio.insecure_channel(f"unix://{endpoint}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        async with running(kubelet_dir) as server:
            await kubelet.registration.registrations(1)
            stream = stub.ListAndWatch(pb.Empty())
            await stream.read()
            read = asyncio.ensure_future(stream.read())
            done, _ = await asyncio.wait([read], timeout=0.3)
            assert not done, "ListAndWatch ended while the plugin runs"
        # The plugin stopped: it ended the stream itself (NVIDIA closes plugin.stop), not
        # the server's stop cancelling it. kubelet sees the end: the status, or, where the
        # socket closed right behind it, the transport gone (a fresh-clone CI run saw
        # "Stream removed (sendmsg: Broken pipe)"): either way, the plugin is gone.
        assert server.plugin.closed == 1
        async with asyncio.timeout(5):
            try:
                ended: object = await read
            except aio.AioRpcError as error:
                ended = error.code()
        assert ended is aio.EOF or ended == grpc.StatusCode.UNAVAILABLE, ended


async def test_preferred_allocation_spreads_over_the_gpus(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    async with running(kubelet_dir, gpus=2):
        await kubelet.registration.registrations(1)
        async with kubelet.plugin() as stub:
            everything = [device.ID for device in await first_list(stub)]
            assert len(everything) == 8
            assert await preferred(stub, everything, 1) == [f"{GPU0}::0"]
            # one replica of GPU0 allocated: the next goes to GPU1
            assert await preferred(stub, everything[1:], 1) == [f"{GPU1}::0"]
            # GPU0 holds 1, GPU1 holds 2: back to GPU0
            free = [d for d in everything if d not in (f"{GPU0}::0", f"{GPU1}::0", f"{GPU1}::1")]
            assert gpu_of((await preferred(stub, free, 1))[0]) == GPU0
            # a request for two takes one from each GPU
            two = await preferred(stub, everything, 2)
            assert sorted(map(gpu_of, two)) == [GPU0, GPU1]
            # must-include devices come first and count as allocated
            assert await preferred(stub, everything, 2, (f"{GPU0}::3",)) == [
                f"{GPU0}::3",
                f"{GPU1}::0",
            ]
            with pytest.raises(aio.AioRpcError) as refused:
                await preferred(stub, everything[:1], 2)
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == (
        "error getting list of preferred allocation devices: "
        "not enough available devices to satisfy allocation"
    )


async def test_allocate_refuses_more_than_one_replica_per_container(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    async with running(kubelet_dir, gpus=2):
        await kubelet.registration.registrations(1)
        async with kubelet.plugin() as stub:
            with pytest.raises(aio.AioRpcError) as refused:
                await stub.Allocate(allocate_request(f"{GPU0}::0", f"{GPU1}::0"))
            with pytest.raises(aio.AioRpcError) as unknown:
                await stub.Allocate(allocate_request("GPU-nope::0"))
    # internal/rm/rm.go ValidateRequest under failRequestsGreaterThanOne
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == (
        f'invalid allocation request for "{RESOURCE}": invalid request: '
        "maximum request size for shared resources is 1; found 2"
    )
    assert unknown.value.details() == (
        f'invalid allocation request for "{RESOURCE}": invalid request: unknown device: GPU-nope::0'
    )


async def test_allocate_tells_the_container_its_gpu(kubelet: Kubelet, kubelet_dir: Path) -> None:
    async with running(kubelet_dir, gpus=2):
        await kubelet.registration.registrations(1)
        async with kubelet.plugin() as stub:
            response = await stub.Allocate(allocate_request(f"{GPU1}::2"))
            prestart = await stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=[f"{GPU1}::2"])
            )
    (container,) = response.container_responses
    assert dict(container.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPU1,
        "HEADROOM_REPLICA_IDS": f"{GPU1}::2",
    }
    assert not container.mounts
    assert not container.devices
    assert prestart == pb.PreStartContainerResponse()


@pytest.mark.parametrize("plugin_socket_removed", [True, False])
async def test_registers_again_after_kubelet_restarts(
    kubelet: Kubelet, kubelet_dir: Path, plugin_socket_removed: bool
) -> None:
    async with running(kubelet_dir) as server:
        await kubelet.registration.registrations(1)
        await kubelet.restart(remove_plugin_sockets=plugin_socket_removed)
        again = await registered(kubelet, server, 2)
        assert again.resource_name == RESOURCE
        assert server.status.registrations == 2
        assert server.ready()[0]
        async with kubelet.plugin() as stub:
            assert len(await first_list(stub)) == 4


async def test_waits_for_kubelet_and_reports_why_it_is_not_ready(kubelet_dir: Path) -> None:
    kubelet = Kubelet(Paths(kubelet_dir))
    async with running(kubelet_dir) as server:
        await asyncio.sleep(0.2)
        ready, why = server.ready()
        assert not ready
        assert why.startswith("not registered with kubelet: waiting for kubelet: no ")
        # pkg/kubelet/cm/devicemanager/plugin/v1beta1/api.go errUnsupportedVersion
        kubelet.registration.refuse = (
            'requested API version "v1beta1" is not supported by kubelet. '
            'Supported version is ["v1"]'
        )
        await kubelet.start()
        async with asyncio.timeout(5):
            # the second attempt comes after the plugin took in the first answer
            while kubelet.registration.refusals < 2:
                kubelet.registration.refused.clear()
                await kubelet.registration.refused.wait()
        assert server.ready()[1] == (
            "not registered with kubelet: Register with kubelet failed: UNKNOWN: "
            f"{kubelet.registration.refuse}"
        )
        kubelet.registration.refuse = ""
        await registered(kubelet, server)
        assert server.ready()[0]
    await kubelet.stop()


# --- the decisions on plain lists --------------------------------------------


def test_gpu_uuids_are_the_simulated_agents() -> None:
    """The agent's simulated backend names the node's GPUs as kubelet's replicas do,
    so a pod located through PodResources is on a GPU the agent reports."""
    probe = SimulatedProbe(NODE, pods=list, spec=GPUSpec(2, 40 * GIB))
    assert [gpu.uuid for gpu in probe.snapshot().gpus] == list(Inventory.of(NODE, 2, 4).gpus)
    assert gpu_uuid(NODE, 0) != gpu_uuid("gpu-real-1", 0)


@pytest.mark.parametrize(
    ("gpus", "replicas", "why"),
    [(0, 4, "gpus: 0"), (1, 1, "number of replicas must be >= 2")],
)
def test_inventory_refuses_what_nvidia_refuses(gpus: int, replicas: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Inventory.of(NODE, gpus, replicas)


@given(
    gpus=st.integers(1, 4),
    replicas=st.integers(2, 6),
    steps=st.lists(st.booleans(), max_size=40),
)
def test_each_replica_goes_to_a_gpu_with_the_fewest_allocated(
    gpus: int, replicas: int, steps: list[bool]
) -> None:
    """Each step allocates one replica (True) or frees the oldest (False): the
    distributed policy's choice, whatever came and went before (headroom.spread's
    bound rests on it)."""
    inventory = Inventory.of(NODE, gpus, replicas)
    allocated: list[str] = []
    for allocate in steps:
        if not allocate:
            if allocated:
                allocated.pop(0)
            continue
        free = [d for d in inventory.device_ids() if d not in allocated]
        if not free:
            continue
        (chosen,) = preferred_allocation(inventory, free, [], 1)
        counts = {gpu: sum(gpu_of(d) == gpu for d in allocated) for gpu in inventory.gpus}
        assert counts[gpu_of(chosen)] == min(
            count for gpu, count in counts.items() if any(gpu_of(d) == gpu for d in free)
        )
        allocated.append(chosen)


def test_validate_request_takes_one_known_replica() -> None:
    inventory = Inventory.of(NODE, 1, 4)
    validate_request(inventory, [f"{GPU0}::3"])
    validate_request(inventory, [])
    with pytest.raises(InvalidRequest, match="found 3"):
        validate_request(inventory, [f"{GPU0}::0", f"{GPU0}::1", f"{GPU0}::2"])
    with pytest.raises(InvalidRequest, match=r"unknown device: GPU-x::0"):
        validate_request(inventory, [f"{GPU0}::0", "GPU-x::0"])


def test_allocate_envs_name_each_gpu_once() -> None:
    assert allocate_envs([f"{GPU0}::0", f"{GPU0}::1", f"{GPU1}::0"]) == {
        "NVIDIA_VISIBLE_DEVICES": f"{GPU0},{GPU1}",
        "HEADROOM_REPLICA_IDS": f"{GPU0}::0,{GPU0}::1,{GPU1}::0",
    }


# --- the process -------------------------------------------------------------


async def test_component_runs_registers_and_stops_cleanly(
    kubelet: Kubelet, kubelet_dir: Path
) -> None:
    state = ClusterState(kubelet_dir / "state")
    process = component(state, kubelet_dir=kubelet_dir, node=NODE, gpus=2, replicas=3)
    assert process.name == f"deviceplugin-{NODE}"
    assert process.probe is not None
    assert process.probe.url == f"http://127.0.0.1:{state.ports[process.name]}/readyz"
    process.start()
    try:
        await asyncio.to_thread(process.wait_ready, 20)
        request = await kubelet.registration.registrations(1)
        assert request.resource_name == RESOURCE
        async with aiohttp.ClientSession() as session, session.get(process.probe.url) as answer:
            assert answer.status == 200
            assert await answer.text() == (
                f"registered {RESOURCE} with kubelet (6 replicas on 2 GPUs)\n"
            )
        async with kubelet.plugin() as stub:
            assert len(await first_list(stub)) == 6
    finally:
        await asyncio.to_thread(process.stop)
    log = await asyncio.to_thread(Path(process.log).read_text)
    assert "stand-in for NVIDIA's device plugin" in log
    assert f"GPU 1: {GPU1}" in log
    assert "stopped" in log
    assert not (kubelet_dir / "device-plugins" / "headroom-gpu.sock").exists()


def test_bad_arguments_are_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devcluster.deviceplugin", "--node", NODE, "--replicas", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert result.returncode == 1
    assert "replicas: 1; number of replicas must be >= 2" in result.stderr


# --- the stubs ---------------------------------------------------------------


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    """The committed stubs are what ``make deviceplugin`` would write now."""
    stale = stale_stubs("devcluster/deviceplugin/api.proto", tmp_path)

    assert stale == [], f"{', '.join(stale)} stale: run make deviceplugin"


def test_the_stubs_speak_kubelets_service_names() -> None:
    assert pb.DESCRIPTOR.package == "v1beta1"
    registration = pb.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "v1beta1.Registration"
    assert [method.name for method in registration.methods] == ["Register"]
    plugin = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [method.name for method in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
