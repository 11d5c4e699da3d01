"""The kubelet's PodResources API: which devices each container was given.

kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); its answer names the device
IDs allocated to every container the moment kubelet admits the pod, before any
process touches the GPU. The client returns plain data, keeps only NVIDIA GPU
resources, and turns every failure -- socket missing, kubelet down, a slow
answer, the ``Get`` feature gate off -- into :class:`PodResourcesError`, so a
caller decides what an unanswered question means.

The stubs beside this file are generated from the vendored upstream proto
(``api.proto``; ``make podresources``).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import grpc
from google.protobuf.message import Message
from grpc import aio

from agent.podresources import api_pb2, api_pb2_grpc
from agent.podresources.devices import is_gpu_resource

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""What kubelet's node e2e tests (``test/e2e_node/util.go``) and Node Feature
Discovery allow: a List of a full node can pass gRPC's 4 MiB default."""

Reason = Literal[
    "SocketMissing", "Unavailable", "DeadlineExceeded", "GetDisabled", "RateLimited", "Failed"
]


class PodResourcesError(Exception):
    """kubelet did not answer. ``reason`` is a CamelCase word for a condition or
    a metric label; the message is for people."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


@dataclass(frozen=True)
class ContainerDevices:
    name: str
    devices: Mapping[str, tuple[str, ...]]
    """Resource name (``nvidia.com/gpu.shared``) -> allocated device IDs, in
    kubelet's order; GPU resources only (:func:`is_gpu_resource`)."""


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    containers: tuple[ContainerDevices, ...]

    def device_ids(self) -> tuple[str, ...]:
        """Every GPU device ID of the pod, all containers and resources together."""
        return tuple(
            device_id
            for container in self.containers
            for ids in container.devices.values()
            for device_id in ids
        )


def pod_devices(pod: api_pb2.PodResources) -> PodDevices:
    """Plain data from one ``PodResources`` message."""
    containers = []
    for container in pod.containers:
        devices: dict[str, tuple[str, ...]] = {}
        for entry in container.devices:
            if is_gpu_resource(entry.resource_name):
                # kubelet sends one entry per resource; join them should it ever not
                devices[entry.resource_name] = (
                    *devices.get(entry.resource_name, ()),
                    *entry.device_ids,
                )
        containers.append(ContainerDevices(name=container.name, devices=devices))
    return PodDevices(namespace=pod.namespace, name=pod.name, containers=tuple(containers))


class PodResourcesClient:
    """One channel to kubelet's socket; every call bounded by ``timeout_seconds``.

    Use as ``async with PodResourcesClient() as client`` or call :meth:`close`.
    """

    def __init__(self, socket: str = DEFAULT_SOCKET, *, timeout_seconds: float = 5.0) -> None:
        """``socket`` is a path, or a gRPC target ``unix:///path`` as kubelet's
        flags spell it."""
        self.socket = os.path.abspath(socket.removeprefix("unix://"))
        self._timeout = timeout_seconds
        self._channel: aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    async def __aenter__(self) -> "PodResourcesClient":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None

    async def list(self) -> list[PodDevices]:
        """Every pod kubelet runs, with the GPU devices of each container."""
        response: api_pb2.ListPodResourcesResponse = await self._call(
            "List", api_pb2.ListPodResourcesRequest()
        )
        return [pod_devices(pod) for pod in response.pod_resources]

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """The GPU devices kubelet may allocate now: resource name -> the IDs of the
        healthy devices the device plugins list (``GetAllocatableResources``; kubelet's
        device manager, ``GetAllocatableDevices``). A device kubelet allocated before
        its plugin stopped listing it (time-slicing replicas cut) is not among them."""
        response: api_pb2.AllocatableResourcesResponse = await self._call(
            "GetAllocatableResources", api_pb2.AllocatableResourcesRequest()
        )
        devices: dict[str, tuple[str, ...]] = {}
        for entry in response.devices:
            if is_gpu_resource(entry.resource_name):
                devices[entry.resource_name] = (
                    *devices.get(entry.resource_name, ()),
                    *entry.device_ids,
                )
        return devices

    async def get(self, namespace: str, name: str) -> PodDevices | None:
        """One pod; None when kubelet does not know it (not admitted yet, or
        gone). Needs kubelet's ``KubeletPodResourcesGet`` feature gate: without
        it the error's reason is ``GetDisabled`` and :meth:`list` still works."""
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response: api_pb2.GetPodResourcesResponse = await self._call("Get", request)
        except _NotFound:
            return None
        return pod_devices(response.pod_resources)

    async def _call(self, method: str, request: Message) -> Any:
        stub = self._stub or self._connect()
        try:
            return await getattr(stub, method)(request, timeout=self._timeout)
        except aio.AioRpcError as error:
            raise _error(method, self.socket, self._timeout, error) from error

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        self._channel = aio.insecure_channel(
            f"unix://{self.socket}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub


class _NotFound(Exception):
    pass


def _error(
    method: str, socket: str, timeout: float, error: aio.AioRpcError
) -> PodResourcesError | _NotFound:
    code, details = error.code(), error.details() or ""
    where = f"kubelet PodResources {method} at {socket}"
    if code == grpc.StatusCode.UNAVAILABLE and not os.path.exists(socket):
        return PodResourcesError(
            "SocketMissing", f"{where}: no such socket (is the host path mounted?)"
        )
    # kubelet answers both of these with a plain error (code Unknown), so the
    # text is all there is (pkg/kubelet/apis/podresources/server_v1.go)
    if method == "Get" and details.endswith("not found"):
        return _NotFound(details)
    if "Get method disabled" in details:
        return PodResourcesError(
            "GetDisabled", f"{where}: {details} (kubelet feature gate KubeletPodResourcesGet)"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError("DeadlineExceeded", f"{where}: no answer within {timeout:g}s")
    if code == grpc.StatusCode.UNAVAILABLE:
        return PodResourcesError("Unavailable", f"{where}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # kubelet rate-limits this endpoint: pkg/kubelet/apis/podresources/grpc/ratelimit.go
        return PodResourcesError("RateLimited", f"{where}: {details}")
    return PodResourcesError("Failed", f"{where}: {code.name}: {details}")
