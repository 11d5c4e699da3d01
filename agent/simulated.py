"""The simulated backend: fake GPUs that fill up like real ones.

For the local cluster and the demo, where nodes are KWOK fakes. The GPUs come
from an explicit spec or from the Node's GPU Feature Discovery labels
(``agent.gpuspec``). The load comes from the pods actually
Running on the node: each one's demand follows its ``sim.headroom.dev/usage``
pattern (``agent.usage``), or stays at its declared memory without one.

Memory is finite, as on a real GPU. Each tick, pods whose demand fell release
memory first; then, in start order (first come, first served), each pod's
increase is granted as far as free memory lasts -- a workload allocates in
many pieces, and ``cudaMalloc`` fails the piece that does not fit. Demand that
was refused is the pod's ``starved_bytes``: what a real workload would have
seen as CUDA out-of-memory. Memory freed by one pod goes to whoever asks next,
which is how a leak starves its neighbours (seed 001).

Device choice follows the NVIDIA device plugin, for which this backend stands
in: a shared or whole-GPU pod gets, when first seen Running (pods in start
order), a non-MIG GPU holding the fewest pods (the lowest index on a tie) and
keeps it -- the plugin's default ``distributed`` policy, which the extender's
bound on unlocated pods relies on (headroom.spread); a MIG pod gets the first
free device of its profile. A restarted agent deals the running pods out again
in start order. The device a pod asking for a GPU resource gets is
``allocated`` to it from then on, holding memory or not, as kubelet's
PodResources answer says on a real node (agent.allocations).

On a KWOK node there are no processes, so each simulated process names its
pod. On the local cluster's real node (kubelet, containerd, runc, and a test
device plugin standing in for NVIDIA's), the backend runs in host-process
mode (``host_processes``): it stands in for NVML alone. Each pod's memory is
then held by the real host pid of its GPU container's main process
(:mod:`agent.processes`) and the agent finds the pod from that pid's cgroup, as
it does with NVML; a pod whose container has no process yet holds nothing, as
a CUDA process not yet started would. And the device is the one kubelet
allocated (``allocations``: its PodResources answer, whose replica IDs carry
the GPU UUID, :func:`agent.gpuspec.simulated_gpu_uuid`); the distributed
choice above is only the fallback while kubelet does not answer.
"""

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.cgroups import ContainerRef
from agent.gpuspec import GPUSpec, simulated_gpu_uuid, simulated_mig_uuid, spec_from_node
from agent.probe import GPU, BackendName, GPUProcess, MigDevice, ProbeUnavailable, Snapshot
from agent.processes import pod_process
from agent.usage import Leak, Spiky, Steady, UsageError, parse_usage
from headroom import names
from headroom.claims import parse_claim
from headroom.mig import profile_from_resource
from headroom.podspec import PodError, gpu_requests

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
ProcessTable = Mapping[ContainerRef, int]
"""(pod UID, container ID) -> host pid of the container's main process."""
Allocations = Mapping[str, frozenset[str]]
"""Device UUID -> UIDs of the pods kubelet gave it (``agent.allocations``)."""


@dataclass
class _Device:
    """One allocatable memory pool: a whole GPU or a MIG device."""

    uuid: str
    total: int
    profile: str = ""
    held: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Load:
    uid: str
    container: str
    started: datetime
    demand: int
    allocated: bool = False
    """It asked for a GPU resource, so the device plugin gave it this device."""
    pid: int | None = None
    """Host-process mode: the real process holding the memory (None: none yet)."""


class SimulatedProbe:
    """A :class:`agent.probe.Probe` whose GPUs are driven by the node's pods."""

    def __init__(
        self,
        node_name: str,
        *,
        pods: Callable[[], Iterable[Pod]],
        node: Callable[[], Pod | None] = lambda: None,
        spec: GPUSpec | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        host_processes: Callable[[], ProcessTable] | None = None,
        allocations: Callable[[], Allocations] = dict,
    ) -> None:
        """``host_processes`` (e.g. :func:`agent.processes.main_processes`) turns on
        host-process mode; ``allocations`` is kubelet's latest answer, if any."""
        self._node_name = node_name
        self._pods = pods
        self._node = node
        self._spec = spec
        self._clock = clock
        self._host_processes = host_processes
        self._allocations = allocations
        self._devices: dict[str, _Device] = {}
        self._mig_of: dict[str, str] = {}  # pod uid -> MIG device uuid, sticky
        self._gpu_of: dict[str, int] = {}  # pod uid -> GPU index, sticky
        self._first_seen: dict[str, datetime] = {}
        self._warned: set[str] = set()

    @property
    def blocking(self) -> bool:
        return False

    @property
    def name(self) -> BackendName:
        return "simulated"

    def close(self) -> None:
        pass

    def snapshot(self) -> Snapshot:
        spec = self._spec or self._node_spec()
        gpus = self._layout(spec)
        now = self._clock()
        loads: dict[str, list[_Load]] = {}
        pods = sorted(self._pods(), key=lambda pod: (_started(pod) or now, _uid(pod)))
        present = {_uid(pod) for pod in pods}
        # Devices and first sightings are sticky only while the pod exists: a MIG device
        # (or a GPU) whose pod is gone is free for the next one, as kubelet frees it.
        self._gpu_of = {uid: gpu for uid, gpu in self._gpu_of.items() if uid in present}
        self._mig_of = {uid: mig for uid, mig in self._mig_of.items() if uid in present}
        self._first_seen = {uid: t for uid, t in self._first_seen.items() if uid in present}
        table = self._host_processes() if self._host_processes is not None else None
        devices_of = _devices_of(self._allocations())
        for pod in pods:
            placed = self._place(pod, gpus, now, table, devices_of.get(_uid(pod), frozenset()))
            if placed is not None:
                loads.setdefault(placed[0], []).append(placed[1])
        for device in self._devices.values():
            _allocate(device, loads.get(device.uuid, []))
        starved = {
            load.uid: load.demand - self._devices[key].held.get(load.uid, 0)
            for key, device_loads in loads.items()
            for load in device_loads
        }
        return Snapshot(gpus=tuple(self._gpu(gpu, starved, loads) for gpu in gpus))

    # --- layout -------------------------------------------------------------

    def _node_spec(self) -> GPUSpec:
        node = self._node()
        if node is None:
            raise ProbeUnavailable("NodeNotFound", f"node {self._node_name} is not readable yet")
        return spec_from_node(node)

    def _layout(self, spec: GPUSpec) -> list[tuple[int, GPUSpec, list[str]]]:
        """GPUs as (index, spec, MIG device uuids); keeps held memory across ticks."""
        wanted: dict[str, _Device] = {}
        gpus = []
        for index in range(spec.count):
            gpu_uuid = simulated_gpu_uuid(self._node_name, index)
            mig_uuids = []
            for profile, memory, instances in spec.mig:
                # Instances are dealt round-robin over the GPUs.
                for n in range(index, instances, spec.count):
                    mig_uuid = simulated_mig_uuid(self._node_name, index, profile, n)
                    wanted[mig_uuid] = _Device(mig_uuid, memory, profile)
                    mig_uuids.append(mig_uuid)
            if not mig_uuids:
                wanted[gpu_uuid] = _Device(gpu_uuid, spec.memory_bytes)
            gpus.append((index, spec, mig_uuids))
        for key, device in wanted.items():
            if key in self._devices and self._devices[key].total == device.total:
                wanted[key] = self._devices[key]
        self._devices = wanted
        return gpus

    # --- pods ---------------------------------------------------------------

    def _place(
        self,
        pod: Pod,
        gpus: list[tuple[int, GPUSpec, list[str]]],
        now: datetime,
        table: ProcessTable | None,
        given: frozenset[str],
    ) -> tuple[str, _Load] | None:
        """The device a Running pod's memory lives on, and its demand now.

        ``table`` is the host processes in host-process mode (None otherwise);
        ``given`` the devices kubelet allocated the pod."""
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        uid = str(metadata.get("uid") or "")
        if not uid or status.get("phase") != "Running":
            return None
        annotations = metadata.get("annotations") or {}
        try:
            requests = gpu_requests(pod, most=None)
        except PodError:
            requests = []
        if not requests and names.ANNOTATION_SIMULATED_USAGE not in annotations:
            return None
        started = _started(pod) or self._first_seen.setdefault(uid, now)
        pattern = self._pattern(uid, annotations)
        if pattern is not None:
            demand = pattern.demand((now - started).total_seconds())
        else:
            demand = _declared(pod)
        container = requests[0].container.name if requests else ""
        pid = None
        if table is not None:
            pid = pod_process(pod, table, container or None)
            if pid is None:
                demand = 0  # no process yet (or any more): no CUDA context holds memory
        load = _Load(uid, container, started, max(demand, 0), allocated=bool(requests), pid=pid)
        profile = profile_from_resource(requests[0].resource) if requests else None
        if profile is not None:
            device = self._mig_device(uid, profile, gpus, given)
            return None if device is None else (device, load)
        index = self._whole_gpu(uid, gpus, given)
        if index is None:
            return None  # a whole-GPU request cannot land on a MIG GPU
        return simulated_gpu_uuid(self._node_name, index), load

    def _whole_gpu(
        self, uid: str, gpus: list[tuple[int, GPUSpec, list[str]]], given: frozenset[str]
    ) -> int | None:
        """The GPU kubelet allocated the pod, else the one it got before, else the
        one the device plugin's distributed policy gives it."""
        for index, _, mig_uuids in gpus:
            if not mig_uuids and simulated_gpu_uuid(self._node_name, index) in given:
                self._gpu_of[uid] = index
                return index
        if given:
            self._warn(uid, f"pod {uid}: kubelet allocated {sorted(given)}, no simulated GPU")
        current = self._gpu_of.get(uid)
        if current is not None and current < len(gpus) and not gpus[current][2]:
            return current
        whole = [index for index, _, mig_uuids in gpus if not mig_uuids]
        if not whole:
            return None
        held = Counter(self._gpu_of.values())
        index = min(whole, key=lambda i: (held[i], i))
        self._gpu_of[uid] = index
        return index

    def _mig_device(
        self,
        uid: str,
        profile: str,
        gpus: list[tuple[int, GPUSpec, list[str]]],
        given: frozenset[str],
    ) -> str | None:
        for mig_uuid in sorted(given):
            if mig_uuid in self._devices and self._devices[mig_uuid].profile == profile:
                self._mig_of[uid] = mig_uuid
                return mig_uuid
        current = self._mig_of.get(uid)
        if current in self._devices:
            return current
        taken = set(self._mig_of.values())
        for _, _, mig_uuids in gpus:
            for mig_uuid in mig_uuids:
                if self._devices[mig_uuid].profile == profile and mig_uuid not in taken:
                    self._mig_of[uid] = mig_uuid
                    return mig_uuid
        self._warn(uid, f"pod {uid}: no free simulated MIG device of profile {profile}")
        return None

    def _pattern(self, uid: str, annotations: Mapping[str, str]) -> Steady | Spiky | Leak | None:
        text = annotations.get(names.ANNOTATION_SIMULATED_USAGE)
        if text is None:
            return None
        try:
            return parse_usage(text)
        except UsageError as err:
            self._warn(uid, f"pod {uid}: {err}; using its declared memory")
            return None

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    # --- output -------------------------------------------------------------

    def _gpu(
        self,
        gpu: tuple[int, GPUSpec, list[str]],
        starved: Mapping[str, int],
        loads: Mapping[str, list[_Load]],
    ) -> GPU:
        index, spec, mig_uuids = gpu
        gpu_uuid = simulated_gpu_uuid(self._node_name, index)
        by_pid = self._host_processes is not None

        def processes(key: str) -> tuple[GPUProcess, ...]:
            device = self._devices[key]
            return tuple(
                # By host pid, as NVML reports, for the agent to find the pod
                # from its cgroup; otherwise there is no process, and it names the pod.
                GPUProcess(
                    pid=load.pid,
                    used_bytes=device.held.get(load.uid, 0),
                    pod_uid=None if by_pid else load.uid,
                    container=None if by_pid else load.container or None,
                    starved_bytes=starved.get(load.uid, 0),
                )
                for load in loads.get(key, [])
                if not by_pid or load.pid is not None
            )

        def allocated(key: str) -> frozenset[str]:
            return frozenset(load.uid for load in loads.get(key, []) if load.allocated)

        migs = tuple(
            MigDevice(
                uuid=key,
                profile=self._devices[key].profile,
                total_bytes=self._devices[key].total,
                used_bytes=sum(self._devices[key].held.values()),
                processes=processes(key),
                allocated=allocated(key),
            )
            for key in mig_uuids
        )
        used = (
            sum(m.used_bytes for m in migs) if migs else sum(self._devices[gpu_uuid].held.values())
        )
        return GPU(
            index=index,
            uuid=gpu_uuid,
            product=spec.product,
            total_bytes=spec.memory_bytes,
            used_bytes=used,
            free_bytes=max(spec.memory_bytes - used, 0),
            mig_enabled=bool(migs),
            mig_devices=migs,
            processes=() if migs else processes(gpu_uuid),
            allocated=frozenset() if migs else allocated(gpu_uuid),
        )


def _allocate(device: _Device, loads: list[_Load]) -> None:
    """Release first, then grant increases in start order (first come, first served)."""
    present = {load.uid for load in loads}
    device.held = {uid: held for uid, held in device.held.items() if uid in present}
    for load in loads:
        if load.demand < device.held.get(load.uid, 0):
            device.held[load.uid] = load.demand
    for load in sorted(loads, key=lambda item: (item.started, item.uid)):
        held = device.held.get(load.uid, 0)
        free = max(device.total - sum(device.held.values()), 0)
        device.held[load.uid] = held + min(max(load.demand - held, 0), free)


def _devices_of(allocations: Allocations) -> dict[str, frozenset[str]]:
    """Pod UID -> the device UUIDs kubelet allocated it."""
    found: dict[str, set[str]] = {}
    for device, uids in allocations.items():
        for uid in uids:
            found.setdefault(uid, set()).add(device)
    return {uid: frozenset(devices) for uid, devices in found.items()}


def _uid(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _started(pod: Pod) -> datetime | None:
    status = pod.get("status") or {}
    metadata = pod.get("metadata") or {}
    for text in (status.get("startTime"), metadata.get("creationTimestamp")):
        if isinstance(text, str):
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                continue
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def _declared(pod: Pod) -> int:
    """Without a usage pattern a simulated pod holds what it declares (headroom.claims)."""
    try:
        return parse_claim(pod).declared or 0
    except PodError:
        return 0
