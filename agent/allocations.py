"""Which pods kubelet gave each GPU: its PodResources answer, keyed for the report.

kubelet's ``List`` names pods by namespace and name, and their devices by the
device plugin's IDs (:mod:`agent.podresources`); the report keys pods by UID
and GPUs by UUID. A replica or MIG ID becomes its UUID
(:func:`agent.podresources.parse_device_id`), which the snapshot's GPUs and MIG
devices carry; a name becomes a UID through the agent's pod cache, only for a
pod kubelet has started (``status.startTime``, which kubelet sets after
admitting the pod, and so after allocating its devices) and that the answer
names once. A pod force-deleted and recreated under its name is, for a while,
two pods to kubelet and one to the apiserver: the name then does not say whose
devices they are, and the pod stays unlocated rather than placed on the GPU
another pod holds. Each pod is also counted per GPU: how many of its replicas
kubelet gave it there (:func:`replicas_by_gpu`), so that the extender can locate
a pod of several replicas where the counts add up to all it asked for.

kubelet's ``GetAllocatableResources`` says which replicas the device plugin lists
now; a replica kubelet allocated beyond them (time-slicing cut from 8 replicas to
4 on a live node: kubelet keeps the pods it gave ``::4..::7``) is one the NVIDIA
plugin's balance counts nowhere, and the report says how many each GPU holds
(:func:`unlisted_replicas`), so that an extender that never saw the cut knows.

Asking kubelet never costs a report: a missing socket, a kubelet down, slow or
rate-limiting, is logged once per reason, and the tick goes on without
allocations, as the agent did before it asked.
"""

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from agent.podresources import PodDevices, PodResourcesClient, PodResourcesError, parse_device_id
from agent.podresources.devices import UnknownDeviceID
from agent.probe import Snapshot
from headroom.reports import MAX_REPLICAS

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
Allocations = Mapping[str, frozenset[str]]
"""Device UUID (``GPU-…`` or ``MIG-…``) -> UIDs of the pods kubelet gave it."""

_TERMINAL = frozenset({"Succeeded", "Failed"})


def pods_by_device(
    answer: Iterable[PodDevices], pods: Mapping[str, Pod]
) -> tuple[dict[str, frozenset[str]], list[UnknownDeviceID]]:
    """Device UUID -> pod UIDs, from kubelet's ``List`` and the pod cache (keyed by
    UID); and the device IDs in no form the NVIDIA device plugin writes, skipped."""
    found: dict[str, set[str]] = {}
    unknown: list[UnknownDeviceID] = []
    for uid, entry in _owned(answer, pods):
        for device_id in entry.device_ids():
            try:
                found.setdefault(parse_device_id(device_id).uuid, set()).add(uid)
            except UnknownDeviceID as err:
                unknown.append(err)
    return {uuid: frozenset(owners) for uuid, owners in found.items()}, unknown


def replicas_by_gpu(
    answer: Iterable[PodDevices], pods: Mapping[str, Pod]
) -> dict[str, dict[str, int]]:
    """GPU UUID -> pod UID -> how many of its time-slicing (or MPS) replicas kubelet
    allocated the pod: the distinct ``<GPU-uuid>::<n>`` IDs over its containers, for
    the pods :func:`pods_by_device` names. A whole GPU, or a MIG device's replicas,
    are not counted. kubelet lists app containers and sidecars, not the plain init
    containers whose devices they reuse; so where the counts add up to every replica
    the pod asks for (its effective request), they are all it holds, and the extender
    locates it (headroom.accounting.placed)."""
    held: dict[str, dict[str, set[int]]] = {}
    for uid, entry in _owned(answer, pods):
        for ref in _replicas(entry.device_ids()):
            held.setdefault(ref.uuid, {}).setdefault(uid, set()).add(ref.replica)
    return {
        uuid: {uid: min(len(numbers), MAX_REPLICAS) for uid, numbers in owners.items()}
        for uuid, owners in held.items()
    }


def _owned(
    answer: Iterable[PodDevices], pods: Mapping[str, Pod]
) -> Iterator[tuple[str, PodDevices]]:
    """Each entry of kubelet's answer with the UID of the pod it names, for a pod kubelet
    started that the answer names once (the module's docstring says why)."""
    answer = list(answer)
    names = Counter((entry.namespace, entry.name) for entry in answer)
    uids = {_key(pod): uid for uid, pod in pods.items() if _started(pod)}
    for entry in answer:
        key = (entry.namespace, entry.name)
        uid = uids.get(key)
        if uid is not None and names[key] == 1:
            yield uid, entry


class _Replica(NamedTuple):
    uuid: str
    replica: int


def unlisted_replicas(
    answer: Iterable[PodDevices],
    allocatable: Mapping[str, Iterable[str]],
    last: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """GPU UUID -> how many of its time-slicing (or MPS) replicas kubelet has allocated
    beyond those the device plugin lists now (``allocatable``), counted only for a GPU
    it lists replicas of: replicas are numbered ``0..n-1`` per GPU
    (NVIDIA/k8s-device-plugin internal/rm/device_map.go), so after a cut to ``n`` the
    ones numbered ``n`` and up are gone from its list, and its distributed policy,
    balancing by the replicas it lists (``total - available``, internal/rm/allocate.go),
    places new pods as if theirs were free. A GPU it lists no replica of (its plugin not
    registered again after a kubelet restart, or every replica unhealthy, which kubelet
    leaves out of the answer) says nothing: its ``last`` count is kept, up to the
    replicas of it kubelet still holds allocated (kubelet marks every device of a
    plugin that disconnects unhealthy, so each restart of the plugin would otherwise
    report 0 until it registers again, and a pod placed then would find no cut). An
    unhealthy replica below the highest listed is not counted; one above it is, which
    charges more, never less. Replicas of a time-sliced MIG device are not counted:
    Headroom places no pods on them."""
    listed: dict[str, int] = {}
    for device_ids in allocatable.values():
        for ref in _replicas(device_ids):
            listed[ref.uuid] = max(listed.get(ref.uuid, 0), ref.replica + 1)
    counts: Counter[str] = Counter()
    held: Counter[str] = Counter()
    for entry in answer:
        for ref in _replicas(entry.device_ids()):
            held[ref.uuid] += 1
            if ref.uuid in listed and ref.replica >= listed[ref.uuid]:
                counts[ref.uuid] += 1
    for uuid, count in (last or {}).items():
        if uuid not in listed and (kept := min(count, held[uuid])):
            counts[uuid] = kept
    return dict(counts)


def _replicas(device_ids: Iterable[str]) -> Iterator[_Replica]:
    for device_id in device_ids:
        try:
            ref = parse_device_id(device_id)
        except UnknownDeviceID:
            continue  # logged by pods_by_device
        if ref.kind == "gpu" and ref.replica is not None:
            yield _Replica(ref.uuid, ref.replica)


def with_allocations(
    snapshot: Snapshot,
    allocations: Allocations,
    unlisted: Mapping[str, int] | None = None,
    replicas: Mapping[str, Mapping[str, int]] | None = None,
) -> Snapshot:
    """``snapshot`` with each GPU and MIG device carrying the pods kubelet gave it,
    each GPU how many replicas it holds that the device plugin no longer lists, and
    how many of its replicas each pod holds (:func:`replicas_by_gpu`).

    A device the snapshot does not have (another driver's, or a MIG layout that
    changed) is ignored: the report keys GPUs by what NVML measures.
    """
    unlisted = unlisted or {}
    replicas = replicas or {}
    if not allocations and not unlisted and not replicas:
        return snapshot
    gpus = []
    for gpu in snapshot.gpus:
        migs = tuple(
            replace(m, allocated=m.allocated | allocations.get(m.uuid, frozenset()))
            for m in gpu.mig_devices
        )
        gpus.append(
            replace(
                gpu,
                allocated=gpu.allocated | allocations.get(gpu.uuid, frozenset()),
                mig_devices=migs,
                unlisted_replicas=unlisted.get(gpu.uuid, 0),
                replicas=dict(replicas.get(gpu.uuid, {})),
            )
        )
    return replace(snapshot, gpus=tuple(gpus))


class KubeletAllocations:
    """Asks kubelet each tick; an empty answer when it cannot say."""

    def __init__(self, client: PodResourcesClient) -> None:
        self._client = client
        self._failing: str | None = None
        """The reason of the current run of failures, logged once at its start."""
        self._unknown: set[str] = set()
        """Device IDs already logged as unknown: the same ones come back every tick."""
        self.latest: dict[str, frozenset[str]] = {}
        """The last :meth:`read`'s answer: where the simulated backend places pods."""
        self.replicas: dict[str, dict[str, int]] = {}
        """GPU UUID -> pod UID -> its replicas there (:func:`replicas_by_gpu`), from
        the same answer as :attr:`latest`, and kept with it while kubelet cannot say."""
        self.unlisted: dict[str, int] = {}
        """GPU UUID -> replicas allocated beyond those its plugin lists
        (:func:`unlisted_replicas`), as last known: kept while kubelet cannot say."""
        self._allocatable_failing: str | None = None

    async def read(self, pods: Mapping[str, Pod]) -> dict[str, frozenset[str]]:
        self.latest = await self._read(pods)
        return self.latest

    async def _read(self, pods: Mapping[str, Pod]) -> dict[str, frozenset[str]]:
        try:
            answer = await self._client.list()
        except PodResourcesError as err:
            if err.reason in ("SocketMissing", "Unavailable"):
                # A fresh channel next tick: gRPC's own reconnect backs off for up
                # to two minutes, and a restarted kubelet makes a new socket.
                await self._client.close()
            if err.reason != self._failing:
                log.warning(
                    "pods are located by the memory they hold only: %s (%s)",
                    err.message,
                    err.reason,
                )
                self._failing = err.reason
            # A container keeps the devices kubelet gave it for its life: the last
            # answer still holds for the pods still here. Dropped, a kubelet that
            # misses every other deadline would unlocate pods tick after tick, and
            # the guard's streak for a pod on a GPU it was not given would reset.
            self.replicas = {
                gpu: counted
                for gpu, counts in self.replicas.items()
                if (counted := {uid: n for uid, n in counts.items() if uid in pods})
            }
            return {
                device: kept
                for device, uids in self.latest.items()
                if (kept := frozenset(uid for uid in uids if uid in pods))
            }
        if self._failing is not None:
            log.info("kubelet PodResources answers again: pods are located at allocation")
            self._failing = None
        allocations, unknown = pods_by_device(answer, pods)
        self.replicas = replicas_by_gpu(answer, pods)
        await self._read_unlisted(answer)
        for bad in unknown:
            if bad.device_id not in self._unknown:
                self._unknown.add(bad.device_id)
                log.warning("ignoring a device kubelet allocated: %s", bad)
        return allocations

    async def _read_unlisted(self, answer: list[PodDevices]) -> None:
        try:
            allocatable = await self._client.allocatable()
        except PodResourcesError as err:
            if err.reason != self._allocatable_failing:
                log.warning(
                    "replicas the device plugin stopped listing are not known: %s (%s)",
                    err.message,
                    err.reason,
                )
                self._allocatable_failing = err.reason
            return
        self._allocatable_failing = None
        unlisted = unlisted_replicas(answer, allocatable, self.unlisted)
        if unlisted != self.unlisted:
            log.info("replicas allocated beyond those the device plugin lists: %s", unlisted)
        self.unlisted = unlisted

    async def close(self) -> None:
        await self._client.close()


def _key(pod: Pod) -> tuple[str, str]:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _started(pod: Pod) -> bool:
    """kubelet admitted it (and so allocated its devices), and it has not ended."""
    status = pod.get("status") or {}
    return bool(status.get("startTime")) and status.get("phase") not in _TERMINAL
