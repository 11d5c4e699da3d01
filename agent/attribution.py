"""From a probe snapshot to the report: processes become pods.

A process belongs to a pod when its cgroup names a pod UID that the agent's pod
cache (pods bound to this node) knows. Everything else a GPU has in use -- the
driver's own reservation, processes outside Kubernetes, pods not yet in the
cache, processes whose memory NVML cannot attribute -- is ``unattributedBytes``,
so the extender counts it against headroom rather than losing it.

A pod the device plugin gave a GPU (``GPU.allocated``: kubelet's PodResources
answer, or the simulation's choice) is listed on it with ``allocated: true``,
at 0 bytes until it holds memory: the extender then knows its GPU from the
moment kubelet admits it, not from its first ``cudaMalloc``.

A GPU NVML cannot read is written with the figures it was last read with,
marked with the error; with NVML unavailable on the whole node, every GPU of
the last report is, marked with why. Zero figures would say an empty GPU to an
extender without an earlier reading of its own (restarted, or the Node
re-created), and it would place pods beside memory it no longer sees.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from agent.cgroups import ContainerRef
from agent.probe import GPU, BackendName, GPUProcess, MigDevice, ProbeUnavailable, Snapshot
from headroom.reports import (
    CONDITION_NVML_AVAILABLE,
    Condition,
    GPUUsage,
    MigDeviceUsage,
    PodUsage,
    ReportStatus,
)

MAX_CONTAINERS_LISTED = 64
"""``pods[].containers`` maxItems in the GPUNodeReport CRD."""

Pod = Mapping[str, Any]
Resolver = Callable[[int], ContainerRef | None]
"""Host pid -> its pod and container (``agent.cgroups.container_of_pid``)."""


@dataclass
class _PodTotal:
    used: int = 0
    starved: int | None = None
    containers: set[str] = field(default_factory=set)


def build_status(
    *,
    node_name: str,
    backend: BackendName,
    observed_at: datetime,
    snapshot: Snapshot | None,
    failure: ProbeUnavailable | None,
    pods: Mapping[str, Pod],
    resolve: Resolver,
    previous: ReportStatus | None = None,
    heartbeat_seconds: int | None = None,
) -> ReportStatus:
    """The report for one tick. ``pods`` is keyed by pod UID; ``failure`` is set
    (and ``snapshot`` None) when the backend could not measure; ``previous`` is the
    last tick's report, whose figures a GPU that cannot be read now keeps."""
    last = previous.gpus if previous is not None else []
    if snapshot is not None:
        gpus = _with_last_good([_gpu(gpu, pods, resolve) for gpu in snapshot.gpus], last)
    else:
        why = f"{failure.reason}: {failure.message}" if failure is not None else "not measured"
        gpus = [replace(gpu, error=why) for gpu in last]
    condition = _availability(backend, failure, observed_at, previous)
    return ReportStatus(
        node_name=node_name,
        backend=backend,
        observed_at=observed_at,
        gpus=gpus,
        conditions=[condition],
        heartbeat_seconds=heartbeat_seconds,
    )


def _availability(
    backend: BackendName,
    failure: ProbeUnavailable | None,
    now: datetime,
    previous: ReportStatus | None,
) -> Condition:
    status: Literal["True", "False"] = "False" if failure else "True"
    if failure is not None:
        reason, message = failure.reason, failure.message
    elif backend == "simulated":
        reason, message = "Simulated", "GPUs are simulated; no NVIDIA driver is read"
    else:
        reason, message = "Initialized", "NVML answers"
    old = previous.condition(CONDITION_NVML_AVAILABLE) if previous else None
    since = old.last_transition_time if old is not None and old.status == status else None
    return Condition(
        type=CONDITION_NVML_AVAILABLE,
        status=status,
        reason=reason[:128],
        message=message[:1024],  # the CRD's limits: a longer write would be refused
        last_transition_time=since or now,
    )


def _with_last_good(gpus: list[GPUUsage], previous: Iterable[GPUUsage]) -> list[GPUUsage]:
    """``gpus``, each one NVML failed to read with its figures in ``previous`` (the last
    good ones, carried from tick to tick) and its new error."""
    last = {gpu.index: gpu for gpu in previous}
    return [
        replace(
            last[gpu.index],
            error=gpu.error,
            # kubelet's word, not NVML's, but keyed by the UUID NVML may not have read
            unlisted_replicas=max(gpu.unlisted_replicas, last[gpu.index].unlisted_replicas),
        )
        if gpu.error and gpu.index in last
        else gpu
        for gpu in gpus
    ]


def _gpu(gpu: GPU, pods: Mapping[str, Pod], resolve: Resolver) -> GPUUsage:
    mig_devices = [_mig(device, pods, resolve) for device in gpu.mig_devices]
    whole = _pods(gpu.processes, gpu.allocated, pods, resolve, gpu.replicas)
    attributed = sum(p.used_bytes for p in whole) + sum(
        p.used_bytes for device in mig_devices for p in device.pods
    )
    return GPUUsage(
        index=gpu.index,
        uuid=gpu.uuid,
        product=gpu.product,
        total_bytes=gpu.total_bytes,
        used_bytes=gpu.used_bytes,
        free_bytes=gpu.free_bytes,
        mig_enabled=gpu.mig_enabled,
        mig_devices=mig_devices,
        pods=whole,
        unattributed_bytes=max(gpu.used_bytes - attributed, 0),
        numa_node=gpu.numa_node,
        error=gpu.error,
        unlisted_replicas=gpu.unlisted_replicas,
    )


def _mig(device: MigDevice, pods: Mapping[str, Pod], resolve: Resolver) -> MigDeviceUsage:
    return MigDeviceUsage(
        uuid=device.uuid,
        profile=device.profile,
        total_bytes=device.total_bytes,
        used_bytes=device.used_bytes,
        pods=_pods(device.processes, device.allocated, pods, resolve),
    )


def _pods(
    processes: Iterable[GPUProcess],
    allocated: Iterable[str],
    pods: Mapping[str, Pod],
    resolve: Resolver,
    replicas: Mapping[str, int] | None = None,
) -> list[PodUsage]:
    """``replicas``: pod UID -> its replicas of the GPU, counted for the pods allocated it."""
    replicas = replicas or {}
    totals: dict[str, _PodTotal] = {uid: _PodTotal() for uid in allocated if uid in pods}
    given = set(totals)
    for process in processes:
        uid, container = _owner(process, pods, resolve)
        if uid is None:
            continue
        total = totals.setdefault(uid, _PodTotal())
        total.used += process.used_bytes or 0
        if process.starved_bytes is not None:
            total.starved = (total.starved or 0) + process.starved_bytes
        if container:
            total.containers.add(container)
    usages = []
    for uid, total in sorted(totals.items()):
        metadata = pods[uid].get("metadata") or {}
        usages.append(
            PodUsage(
                uid=uid,
                namespace=str(metadata.get("namespace") or ""),
                name=str(metadata.get("name") or ""),
                # The CRD lists at most 64 (a larger list would make the apiserver
                # refuse every report of the node); names are for people, the
                # memory is summed over every container.
                containers=sorted(total.containers)[:MAX_CONTAINERS_LISTED],
                used_bytes=total.used,
                starved_bytes=total.starved,
                allocated=uid in given,
                replicas=replicas.get(uid) if uid in given else None,
            )
        )
    return usages


def _owner(
    process: GPUProcess, pods: Mapping[str, Pod], resolve: Resolver
) -> tuple[str | None, str | None]:
    """The known pod (and container name) a process belongs to, if any."""
    if process.pod_uid is not None:
        return (process.pod_uid, process.container) if process.pod_uid in pods else (None, None)
    if process.pid is None:
        return None, None
    ref = resolve(process.pid)
    if ref is None or ref.pod_uid not in pods:
        return None, None
    return ref.pod_uid, _container_name(pods[ref.pod_uid], ref.container_id)


def _container_name(pod: Pod, container_id: str | None) -> str | None:
    if container_id is None:
        return None
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or []:
            # "containerd://<id>", "cri-o://<id>", "docker://<id>"
            if str(entry.get("containerID") or "").endswith("://" + container_id):
                return str(entry.get("name") or "") or None
    return None
