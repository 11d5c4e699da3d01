"""Which GPU a kubelet device ID names: pure parsing, no I/O.

The kubelet reports, per container, the device IDs that the device plugin
advertised and it allocated. The NVIDIA device plugin advertises every device
by the UUID NVML gives it (``BuildDevice`` in NVIDIA/k8s-device-plugin
``internal/rm/devices.go`` sets ``ID = uuid``, whatever ``deviceIDStrategy``
says -- that flag only changes what the container is told):

- a whole GPU: ``GPU-<uuid>``;
- a MIG device: ``MIG-<uuid>`` (drivers before R470: ``MIG-GPU-<uuid>/<gi>/<ci>``);
- a replica under time-slicing or MPS: the device's ID, ``::`` and the replica
  number, ``GPU-<uuid>::3`` (``NewAnnotatedID`` in the same file formats it as
  ``"%s::%d"``; ``internal/rm/device_map.go`` numbers replicas 0..n-1 per device).

So the replica ID carries its GPU's UUID, which is what the agent's report keys
GPUs by (``agent.probe.GPU.uuid``, ``MigDevice.uuid``).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

REPLICA_SEPARATOR = "::"
"""NVIDIA/k8s-device-plugin internal/rm/devices.go, ``NewAnnotatedID``."""

DeviceKind = Literal["gpu", "mig"]


class UnknownDeviceID(ValueError):
    """A device ID that is not one of the NVIDIA device plugin's forms."""

    def __init__(self, device_id: str, why: str) -> None:
        super().__init__(
            f"device ID {device_id!r}: {why}; expected GPU-<uuid>, MIG-<uuid>, "
            "or either followed by ::<replica>"
        )
        self.device_id = device_id


@dataclass(frozen=True)
class DeviceRef:
    """The device a kubelet device ID names."""

    uuid: str
    """NVML's UUID of the GPU or MIG device, as the report keys it."""
    kind: DeviceKind
    replica: int | None = None
    """The replica number under time-slicing or MPS; None for a whole device."""


def is_gpu_resource(resource_name: str) -> bool:
    """``nvidia.com/gpu``, a renamed shared one (``nvidia.com/gpu.shared``) or a
    MIG profile (``nvidia.com/mig-1g.5gb``, ``nvidia.com/mig-1g.5gb.shared``)."""
    return resource_name == "nvidia.com/gpu" or resource_name.startswith(
        ("nvidia.com/gpu.", "nvidia.com/mig-")
    )


def parse_device_id(device_id: str) -> DeviceRef:
    """The device ``device_id`` names; :class:`UnknownDeviceID` if it is not
    in a form the NVIDIA device plugin produces."""
    base, separator, suffix = device_id.partition(REPLICA_SEPARATOR)
    replica: int | None = None
    if separator:
        if not suffix.isdecimal() or not suffix.isascii():
            raise UnknownDeviceID(device_id, f"replica {suffix!r} is not a number")
        replica = int(suffix)
    if base.startswith("MIG-") and len(base) > len("MIG-"):
        return DeviceRef(uuid=base, kind="mig", replica=replica)
    if base.startswith("GPU-") and len(base) > len("GPU-"):
        return DeviceRef(uuid=base, kind="gpu", replica=replica)
    raise UnknownDeviceID(device_id, "no GPU- or MIG- prefix")


def device_uuids(device_ids: Iterable[str]) -> frozenset[str]:
    """The distinct GPU and MIG UUIDs behind ``device_ids`` (replicas of one
    GPU collapse to it). Raises :class:`UnknownDeviceID` on the first stranger."""
    return frozenset(parse_device_id(device_id).uuid for device_id in device_ids)
