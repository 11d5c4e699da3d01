"""What a backend measures: the GPUs of one node and the processes using them.

Two backends sit behind :class:`Probe`: NVML (``agent.nvml``) on real nodes and
a simulation (``agent.simulated``) for the local cluster and the demo. A probe
only measures; turning processes into pods and writing the report is the
caller's job, so both backends feed the same attribution and reporting code.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

BackendName = Literal["nvml", "simulated"]


@dataclass(frozen=True)
class GPUProcess:
    """One compute process on a GPU or MIG device.

    NVML knows a host ``pid``; the pod is found later through its cgroup. The
    simulated backend on a KWOK node has no processes, so it names the pod
    directly; on a real node (host-process mode) it gives real pids, as NVML.
    """

    pid: int | None
    used_bytes: int | None
    """None when the driver cannot say (NVML's "not available")."""
    pod_uid: str | None = None
    container: str | None = None
    starved_bytes: int | None = None
    """Simulated only: demand the full device refused."""


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    profile: str
    total_bytes: int
    used_bytes: int
    processes: tuple[GPUProcess, ...] = ()
    allocated: frozenset[str] = frozenset()
    """UIDs of the pods the device plugin gave this device (see ``GPU.allocated``)."""


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    product: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    processes: tuple[GPUProcess, ...] = ()
    """Processes on the whole GPU; on a MIG GPU they are under each device."""
    allocated: frozenset[str] = frozenset()
    """UIDs of the pods the device plugin gave this GPU or a replica of it: kubelet's
    word (PodResources, added by the agent, :mod:`agent.allocations`) on a real node,
    the simulation's own choice on a fake one. Listed in the report before they use it."""
    replicas: Mapping[str, int] = field(default_factory=dict)
    """Pod UID -> how many of this GPU's replicas kubelet allocated it
    (:func:`agent.allocations.replicas_by_gpu`); a pod ``allocated`` lists and this
    does not is not counted (the simulation's own placement)."""
    error: str = ""
    """Why NVML could not read this GPU; its figures are then not measurements."""
    numa_node: int | None = None
    """Its NUMA node as the NVIDIA device plugin reads it for kubelet (sysfs), or None."""
    unlisted_replicas: int = 0
    """Replicas of it kubelet allocated that the device plugin no longer lists
    (:func:`agent.allocations.unlisted_replicas`)."""


@dataclass(frozen=True)
class Snapshot:
    gpus: tuple[GPU, ...] = field(default_factory=tuple)


class ProbeUnavailable(Exception):
    """The backend cannot measure now (no driver, no node labels).

    ``reason`` is a CamelCase word for a condition; the message is for people.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Probe(Protocol):
    """A backend. A ``blocking`` one (NVML: synchronous C calls) is run on a
    worker thread; a non-blocking one (the simulation, which reads the agent's
    pod cache) runs on the event loop, where that cache may be read safely."""

    @property
    def name(self) -> BackendName: ...

    @property
    def blocking(self) -> bool: ...

    def snapshot(self) -> Snapshot:
        """The GPUs now; raises :class:`ProbeUnavailable` when it cannot measure."""
        ...

    def close(self) -> None: ...
