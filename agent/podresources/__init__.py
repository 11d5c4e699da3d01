"""The kubelet PodResources API client: which GPU each container was allocated.

Built and tested against a real gRPC server; read each tick by ``agent.allocations``.
``client`` speaks the API, ``devices`` turns device IDs into GPU UUIDs, and
``api_pb2``/``api_pb2_grpc`` are generated from the vendored ``api.proto``.
"""

from agent.podresources.client import (
    DEFAULT_SOCKET,
    ContainerDevices,
    PodDevices,
    PodResourcesClient,
    PodResourcesError,
)
from agent.podresources.devices import (
    DeviceRef,
    UnknownDeviceID,
    device_uuids,
    is_gpu_resource,
    parse_device_id,
)

__all__ = [
    "DEFAULT_SOCKET",
    "ContainerDevices",
    "DeviceRef",
    "PodDevices",
    "PodResourcesClient",
    "PodResourcesError",
    "UnknownDeviceID",
    "device_uuids",
    "is_gpu_resource",
    "parse_device_id",
]
