"""The test device plugin's devices and decisions: pure, no I/O.

Stands in for NVIDIA's device plugin (NVIDIA/k8s-device-plugin, which cannot be
fetched here) configured with time-slicing, ``renameByDefault: true`` and
``failRequestsGreaterThanOne: true``; each function names the upstream code it
follows. No NVML: the GPUs are named, not probed.
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.gpuspec import simulated_gpu_uuid

RESOURCE_NAME = "nvidia.com/gpu.shared"
"""``nvidia.com/gpu`` renamed by time-slicing's ``renameByDefault``
(NVIDIA api/config/v1/replicas.go)."""

REPLICA_SEPARATOR = "::"
"""internal/rm/devices.go ``NewAnnotatedID``: ``"%s::%d"``."""

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""internal/plugin/server.go ``deviceListEnvVar``: the GPUs' UUIDs, comma-separated
(``deviceListStrategy: envvar``, ``deviceIDStrategy: uuid``, the defaults)."""

REPLICA_IDS_ENV = "HEADROOM_REPLICA_IDS"
"""Not NVIDIA's: the replica IDs kubelet allocated, comma-separated, so a workload
or a test sees which replica it holds (NVIDIA's plugin tells only the GPU)."""


class InvalidRequest(ValueError):
    """An Allocate kubelet should not have sent; the message is NVIDIA's text."""


def gpu_uuid(node: str, index: int) -> str:
    """``GPU-<uuid5>``, fixed by the node name and the GPU's index: the very function the
    agent's simulated backend names its GPUs with, so the GPUs the agent simulates are
    the ones kubelet allocates."""
    return simulated_gpu_uuid(node, index)


def gpu_of(device_id: str) -> str:
    """The GPU UUID a replica ID carries (internal/rm/devices.go ``AnnotatedID.GetID``)."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


@dataclass(frozen=True)
class Inventory:
    """The node's GPUs, each advertised as ``replicas`` time-slicing replicas."""

    node: str
    gpus: tuple[str, ...]
    replicas: int

    @classmethod
    def of(cls, node: str, gpus: int, replicas: int) -> "Inventory":
        if gpus < 1:
            raise ValueError(f"gpus: {gpus}; a GPU node has at least one GPU")
        if replicas < 2:
            # api/config/v1/replicas.go refuses fewer: "number of replicas must be >= 2"
            raise ValueError(f"replicas: {replicas}; number of replicas must be >= 2")
        return cls(node, tuple(gpu_uuid(node, index) for index in range(gpus)), replicas)

    def device_ids(self) -> list[str]:
        """Every replica, GPU by GPU: ``GPU-<uuid>::0`` .. ``::<replicas-1>``
        (internal/rm/device_map.go numbers each GPU's replicas from 0)."""
        return [
            f"{gpu}{REPLICA_SEPARATOR}{replica}"
            for gpu in self.gpus
            for replica in range(self.replicas)
        ]


def preferred_allocation(
    inventory: Inventory, available: Iterable[str], required: Sequence[str], size: int
) -> list[str]:
    """NVIDIA's ``distributed`` policy, the default for shared GPUs.

    internal/rm/allocate.go ``greedyAlloc`` with the distributed comparator:
    the ``required`` replicas, then one at a time the replica of the GPU with
    the fewest replicas allocated (every replica of it not among the candidates
    counts as allocated, and each pick counts as one more). NVIDIA breaks ties
    by the GPU picked least this round, then in Go's map order (random); here
    then by GPU index and replica number, as ``agent.simulated`` and
    ``headroom.spread`` assume. Unknown IDs are ignored, as ``Devices.Subset``
    does.
    """
    known = inventory.device_ids()
    wanted, taken = set(available), set(required)
    candidates = [device for device in known if device in wanted and device not in taken]
    needed = size - len(required)
    if len(candidates) < needed:
        raise InvalidRequest("not enough available devices to satisfy allocation")
    total = Counter(gpu_of(device) for device in known)
    free = Counter(gpu_of(device) for device in candidates)
    picked_from: Counter[str] = Counter()
    index = {gpu: position for position, gpu in enumerate(inventory.gpus)}
    chosen: list[str] = []
    for _ in range(needed):
        best = min(
            candidates,
            key=lambda device: (
                total[gpu_of(device)] - free[gpu_of(device)],
                picked_from[gpu_of(device)],
                index[gpu_of(device)],
            ),
        )
        candidates.remove(best)
        free[gpu_of(best)] -= 1
        picked_from[gpu_of(best)] += 1
        chosen.append(best)
    return [*required, *chosen]


def validate_request(inventory: Inventory, device_ids: Sequence[str]) -> None:
    """internal/rm/rm.go ``ValidateRequest``: every ID known, and at most one
    replica per container (``failRequestsGreaterThanOne``). Raises
    :class:`InvalidRequest` with NVIDIA's words."""
    known = set(inventory.device_ids())
    for device_id in device_ids:
        if device_id not in known:
            raise InvalidRequest(f"invalid request: unknown device: {device_id}")
    if len(device_ids) > 1:
        raise InvalidRequest(
            "invalid request: maximum request size for shared resources is 1; "
            f"found {len(device_ids)}"
        )


def allocate_envs(device_ids: Sequence[str]) -> dict[str, str]:
    """What the container is told (internal/plugin/server.go ``getAllocateResponse``:
    the distinct GPU UUIDs in order), plus :data:`REPLICA_IDS_ENV`."""
    gpus = list(dict.fromkeys(gpu_of(device_id) for device_id in device_ids))
    return {VISIBLE_DEVICES_ENV: ",".join(gpus), REPLICA_IDS_ENV: ",".join(device_ids)}
