"""A test device plugin on kubelet's real Device Plugin API (v1beta1, gRPC).

It stands in for NVIDIA's device plugin, which cannot be fetched here: no
NVML, no driver, the GPUs are named (:mod:`devcluster.deviceplugin.replicas`).
Everything kubelet sees is what NVIDIA's plugin shows it with time-slicing and
``renameByDefault``: ``nvidia.com/gpu.shared`` replicas ``GPU-<uuid>::<n>``,
the ``distributed`` preferred allocation, one replica per container at most,
``NVIDIA_VISIBLE_DEVICES`` in the container. So kubelet really allocates the
replicas, enforces the capacity and serves them through PodResources.

The life cycle follows NVIDIA's ``internal/plugin/server.go`` and
``cmd/nvidia-device-plugin/main.go``: serve ``DevicePlugin`` on
``<kubelet-dir>/device-plugins/headroom-gpu.sock``, then ``Register`` with
kubelet on ``kubelet.sock`` beside it; when kubelet restarts it deletes every
plugin socket and creates a new ``kubelet.sock``, so either sign makes the
plugin serve on a fresh socket and register again (NVIDIA watches with
inotify; this polls).
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from devcluster.deviceplugin import api_pb2 as pb
from devcluster.deviceplugin import api_pb2_grpc as pb_grpc
from devcluster.deviceplugin.replicas import (
    RESOURCE_NAME,
    InvalidRequest,
    Inventory,
    allocate_envs,
    gpu_of,
    preferred_allocation,
    validate_request,
)

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
"""pkg/apis/deviceplugin/v1beta1/constants.go ``Version``."""
HEALTHY = "Healthy"
SOCKET_NAME = "headroom-gpu.sock"
REGISTER_TIMEOUT = 5.0
"""NVIDIA's plugin dials kubelet with a 5 s deadline."""

Context = aio.ServicerContext[object, object]


@dataclass(frozen=True)
class Paths:
    """Where kubelet's device manager looks: ``<kubelet-dir>/device-plugins/``."""

    kubelet_dir: Path

    @property
    def directory(self) -> Path:
        return self.kubelet_dir / "device-plugins"

    @property
    def socket(self) -> Path:
        """The plugin's own socket (kubelet dials ``directory / endpoint``)."""
        return self.directory / SOCKET_NAME

    @property
    def kubelet_socket(self) -> Path:
        """kubelet's Registration service."""
        return self.directory / "kubelet.sock"


@dataclass
class Status:
    """What the readiness probe reports."""

    registered: bool = False
    registrations: int = 0
    last_error: str = ""


class DevicePlugin(pb_grpc.DevicePluginServicer):
    """The ``v1beta1.DevicePlugin`` service for one :class:`Inventory`."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._closing = asyncio.Event()
        self.closed = 0
        """ListAndWatch streams this plugin ended itself (:meth:`close_streams`), as
        against cancelled by the server stopping."""

    def close_streams(self) -> None:
        """End every ListAndWatch stream (NVIDIA closes ``plugin.stop``), so
        kubelet sees the plugin go before its socket does."""
        self._closing.set()
        self._closing = asyncio.Event()

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: Context
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Every replica healthy, no NUMA topology (NVIDIA sets none either when
        # NVML reports no NUMA node); the list never changes.
        closing = self._closing
        devices = [pb.Device(ID=device, health=HEALTHY) for device in self.inventory.device_ids()]
        log.info("ListAndWatch: advertising %d %s replicas", len(devices), RESOURCE_NAME)
        yield pb.ListAndWatchResponse(devices=devices)
        await closing.wait()
        self.closed += 1

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            try:
                chosen = preferred_allocation(
                    self.inventory,
                    container.available_deviceIDs,
                    list(container.must_include_deviceIDs),
                    container.allocation_size,
                )
            except InvalidRequest as error:
                message = f"error getting list of preferred allocation devices: {error}"
                log.warning("GetPreferredAllocation: %s", message)
                await context.abort(grpc.StatusCode.UNKNOWN, message)
            log.info(
                "GetPreferredAllocation: %d of %d available -> %s",
                container.allocation_size,
                len(container.available_deviceIDs),
                ",".join(chosen),
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        responses = []
        for container in request.container_requests:
            device_ids = list(container.devices_ids)
            try:
                validate_request(self.inventory, device_ids)
            except InvalidRequest as error:
                # internal/plugin/server.go: a plain Go error, so gRPC code Unknown
                message = f'invalid allocation request for "{RESOURCE_NAME}": {error}'
                log.warning("Allocate refused: %s", message)
                await context.abort(grpc.StatusCode.UNKNOWN, message)
            gpus = sorted({gpu_of(device) for device in device_ids})
            log.info("Allocate: %s on %s", ",".join(device_ids), ",".join(gpus))
            responses.append(pb.ContainerAllocateResponse(envs=allocate_envs(device_ids)))
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


@dataclass
class Server:
    """Serves ``plugin`` and keeps it registered with kubelet until ``stop`` is set."""

    plugin: DevicePlugin
    paths: Paths
    poll_seconds: float = 0.5
    status: Status = field(default_factory=Status)
    _bound: tuple[int, int] | None = field(default=None, init=False)
    """The identity of the socket we listen on (:func:`_identity`)."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            server = await self._serve()
            try:
                kubelet = await self._register(stop)
                if kubelet is None:
                    break
                why = await self._watch(kubelet, stop)
                if why:
                    log.info("%s: serving on a new socket and registering again", why)
            finally:
                self.status.registered = False
                self.plugin.close_streams()
                await server.stop(grace=1.0)
                with contextlib.suppress(FileNotFoundError):
                    # NVIDIA's Stop removes it too; a stale file would look like a plugin
                    if _identity(self.paths.socket) == self._bound:
                        self.paths.socket.unlink()
        log.info("stopped")

    async def _serve(self) -> aio.Server:
        self.paths.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        server = aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        try:
            server.add_insecure_port(f"unix://{self.paths.socket}")
        except RuntimeError as error:  # grpc's "Failed to bind"
            raise OSError(f"cannot listen on {self.paths.socket}: {error}") from error
        await server.start()
        self._bound = _identity(self.paths.socket)
        log.info("serving %s on %s", RESOURCE_NAME, self.paths.socket)
        return server

    async def _register(self, stop: asyncio.Event) -> tuple[int, int] | None:
        """Register until kubelet accepts; the identity of the ``kubelet.sock``
        it accepted on, or None once ``stop`` is set."""
        logged = ""
        while True:
            kubelet = _identity(self.paths.kubelet_socket)
            try:
                if kubelet is None:
                    raise FileNotFoundError(f"waiting for kubelet: no {self.paths.kubelet_socket}")
                await register(self.paths)
            except (OSError, aio.AioRpcError) as error:
                message = _describe(error)
                self.status.last_error = message
                if message != logged:
                    log.warning("%s (retrying every %gs)", message, self.poll_seconds)
                    logged = message
                if await _wait(stop, self.poll_seconds):
                    return None
                continue
            self.status.registered = True
            self.status.registrations += 1
            self.status.last_error = ""
            log.info(
                "registered %s with kubelet at %s (endpoint %s, registration %d)",
                RESOURCE_NAME,
                self.paths.kubelet_socket,
                SOCKET_NAME,
                self.status.registrations,
            )
            return kubelet

    async def _watch(self, kubelet: tuple[int, int], stop: asyncio.Event) -> str:
        """Until kubelet restarts (the reason) or ``stop`` is set (an empty string)."""
        while not await _wait(stop, self.poll_seconds):
            if _identity(self.paths.socket) != self._bound:
                return f"{self.paths.socket} was removed (kubelet restarted?)"
            if _identity(self.paths.kubelet_socket) != kubelet:
                return f"{self.paths.kubelet_socket} was recreated (kubelet restarted)"
        return ""

    def ready(self) -> tuple[bool, str]:
        """Registered with kubelet and our socket in place; the reason either way."""
        if not self.status.registered:
            return False, f"not registered with kubelet: {self.status.last_error or 'starting'}"
        if not self.paths.socket.exists():
            return False, f"{self.paths.socket} is gone"
        return True, (
            f"registered {RESOURCE_NAME} with kubelet ({len(self.plugin.inventory.device_ids())}"
            f" replicas on {len(self.plugin.inventory.gpus)} GPUs)"
        )


async def register(paths: Paths) -> None:
    """``Registration.Register`` as NVIDIA's plugin sends it."""
    async with aio.insecure_channel(f"unix://{paths.kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=SOCKET_NAME,
                resource_name=RESOURCE_NAME,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=REGISTER_TIMEOUT,
        )


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file is at ``path`` now: a socket recreated there differs (inode and
    ctime, as a new file may reuse the old inode number)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_ctime_ns


def _describe(error: OSError | aio.AioRpcError) -> str:
    if isinstance(error, aio.AioRpcError):
        return f"Register with kubelet failed: {error.code().name}: {error.details()}"
    return str(error)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` was set within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()
