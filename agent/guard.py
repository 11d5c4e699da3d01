"""The run-time guard: a pod holding more GPU memory than it declared.

Declared memory (the pod's ``headroom.dev/gpu-memory`` resource, written by the
webhook and immutable; never an annotation a tenant could patch) is per GPU.
A pod is over its declaration when, in one report:

- it holds memory on a GPU or MIG device kubelet did not allocate to it, once
  the report says which it was allocated (``allocated``, from kubelet's
  PodResources): ``NVIDIA_VISIBLE_DEVICES`` set by the pod or its image can
  reach GPUs the device plugin never gave it;
- it holds more than its declaration on any one device;
- it holds more than its declaration times its GPU count (shared replicas and
  MIG slices) across all devices: with no allocations to go by, this still
  catches one replica's worth spread over many GPUs.

A pod that asks for no GPU resource at all, yet holds GPU memory, reached the
GPUs through the runtime, not the device plugin (README, "Hardening the NVIDIA
stack"). On a node whose GPUs Headroom shares -- some pod there asks for a
shared replica or a MIG slice; the device plugin shares per node -- it counts
as declaring 0, so any memory it holds is over. On a whole-GPU node nothing is
charged by declaration and such pods are left alone (so is one on a shared
node no shared pod has reached yet: it starves no one until one does). Shared
pods admitted before declarations were resources (the extender charges them
the whole GPU), pods of MIG slices only (the webhook declares memory for shared
containers alone) and pods of whole GPUs have no measure here either; the first
two are still judged by where kubelet put them: memory on a shared GPU it did
not give them starves the pods declared there.

A pod must be over for ``grace`` consecutive observations before anything
happens, so one spike between two ticks is ignored. Then, once per episode (an
episode ends when the pod is back within its declaration):

- a Warning Event ``GPUMemoryOverDeclared`` on the pod, unless the policy's
  ``guard`` is ``off``; at most one per :data:`WARN_EVERY_SECONDS` on a pod
  whose episodes come and go (a notebook that frees and grows again every half
  minute would write an Event each time, 1,000 a minute from 500 such pods,
  each kept an hour), unless it says the guard evicts. client-go's event
  recorder refills its budget per object at the same rate. An episode held back
  that lasts is warned of once the time is up: the Event of a brief overrun must
  not stand for a lasting one that follows it;
- under ``guard: evict``, an eviction through the Eviction API; where a
  PodDisruptionBudget refuses it, a deletion (the service does both): the
  tenant may write a PDB over their own pod, and it must not switch the guard
  off. One that fails is retried on later ticks. It gives
  the pod at most :data:`EVICTION_GRACE_SECONDS` to stop: the tenant sets
  ``terminationGracePeriodSeconds``, with no upper bound, and a process that
  ignores SIGTERM keeps its memory until the grace period ends. A pod already
  terminating with a longer grace period (its author deleted it with a year's)
  is evicted all the same, which shortens it.

The policy is the one the pod's namespace names in its ``headroom.dev/policy``
label, as the webhook chose it at admission. Never the pod's
``headroom.dev/policy`` annotation: any tenant with the ``edit`` role may patch
that after admission, and switching ``evict`` to a policy with ``guard: off``
would switch the guard off (issue 7). Namespaces are cluster-scoped, and
``edit`` cannot label them. The annotation is not even allowed to make the
guard stricter: it carries no word of the admin's, and a namespace relabelled
to a laxer policy applies to the pods already running there.

A namespace without the label, or naming a policy that is gone or invalid, is
treated as ``warn``: the guard never evicts without a policy that says so. So
the node's own system pods (the device plugin, monitoring, this agent), which
live in namespaces no policy names, get at most an Event, once per episode.
A namespace the agent has not seen yet (its informer has not listed) defers
the verdict, since ``warn`` there could be weaker than the namespace's
``evict``; the over-streak keeps counting meanwhile. This module decides; the
service acts.
"""

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headroom import names
from headroom.claims import parse_claim
from headroom.podspec import PodError, gpu_requests
from headroom.policy import GPUSharingPolicy
from headroom.quantity import human_bytes
from headroom.reports import ReportStatus

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
Namespace = Mapping[str, Any]
GuardAction = Literal["off", "warn", "evict"]
DEFAULT_ACTION: GuardAction = "warn"
EVICTION_GRACE_SECONDS = 30
"""The longest the guard lets a pod it evicts take to stop (Kubernetes' default)."""
WARN_EVERY_SECONDS = 300.0
"""The least time between two warn-only Events on one pod (client-go's event spam
filter refills an object's budget at this rate)."""


@dataclass(frozen=True)
class Verdict:
    kind: Literal["event", "evict"]
    namespace: str
    name: str
    uid: str
    message: str
    grace: int = EVICTION_GRACE_SECONDS
    """For ``evict``: the grace period to evict with, the pod's own if shorter."""


@dataclass
class _Episode:
    streak: int = 0
    """Observations over the declaration in this episode."""
    calm: int = 0
    """Observations within it since the last one over: ``grace`` of them end the episode."""
    warned: bool = False
    announced: bool = False
    """An Event of this episode said the guard evicts."""
    evicted: bool = False


def guard_action(
    pod: Pod,
    policies: Mapping[str, GPUSharingPolicy],
    namespaces: Mapping[str, Namespace],
) -> GuardAction | None:
    """The ``guard`` of the policy the pod's namespace is labelled with; None while
    that namespace is unknown. ``namespaces`` is keyed by name."""
    namespace = namespaces.get(str((pod.get("metadata") or {}).get("namespace") or ""))
    if namespace is None:
        return None
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    policy = policies.get(str(labels.get(names.LABEL_POLICY) or ""))
    return policy.spec.guard if policy is not None else DEFAULT_ACTION


@dataclass(frozen=True)
class DeviceUse:
    """What one pod holds on one GPU or MIG device."""

    where: str
    used: int
    allocated: bool
    """kubelet allocated this device to the pod (the report's ``allocated``)."""
    mig: bool = False
    """A MIG device: its memory is the slice's own, no other pod's."""


@dataclass(frozen=True)
class Allowance:
    """What a pod may hold: ``declared`` bytes per GPU on up to ``gpus`` devices."""

    declared: int
    gpus: int = 1
    asks_no_gpu: bool = False
    """It asks for no GPU resource: ``declared`` is 0, on a node whose GPUs Headroom
    shares only (:meth:`Guard.observe` checks the node)."""
    listed: bool = True
    """kubelet's PodResources lists every device the pod was given: not so for a plain
    init container's (only app and sidecar containers are listed), so usage outside
    the listed devices then proves nothing."""
    slices: bool = False
    """It asks for MIG slices too: what it holds on MIG devices is in its own slices,
    which its declaration (for its shared containers) does not cover, and is judged
    only by where kubelet put it."""
    measured: bool = True
    """``declared`` is a measure of it. Not so for a pod of MIG slices only (the webhook
    declares memory for shared containers alone) or a legacy shared pod: only what it
    holds on a device kubelet did not give it is judged."""


def usage_by_pod(status: ReportStatus) -> dict[str, list[DeviceUse]]:
    """Per pod UID: what it holds on each GPU and MIG device the report lists it on.

    Not on a GPU NVML failed to read: its figures are the last it read
    (agent.attribution), evidence for the extender, not what a pod holds now. Nor a
    figure no device can give: a pod holding more than the whole GPU or MIG device
    (NVML's garbage; resident memory never exceeds the device). The report carries
    it, where it only charges more; it proves no pod over.
    """
    usage: dict[str, list[DeviceUse]] = {}
    for gpu in status.gpus:
        if gpu.error:
            continue
        where = f"gpu {gpu.index} ({gpu.product})" if gpu.product else f"gpu {gpu.index}"
        places = [(where, gpu.pods, False, gpu.total_bytes)]
        places += [
            (f"{where} MIG {d.profile or d.uuid}", d.pods, True, d.total_bytes)
            for d in gpu.mig_devices
        ]
        for place, pods, mig, total in places:
            for pod in pods:
                # The figure proves nothing; kubelet's allocation beside it still says
                # the device is the pod's (its use of devices it was not given is judged).
                used = 0 if 0 < total < pod.used_bytes else pod.used_bytes
                usage.setdefault(pod.uid, []).append(DeviceUse(place, used, pod.allocated, mig))
    return usage


def shares_gpus(pods: Mapping[str, Pod]) -> bool:
    """Whether Headroom shares this node's GPUs: a pod running on it asks for a shared
    replica or a MIG slice (time-slicing and MIG are configured per node). Not one
    that has ended: kubelet fails a pod whose resource the node does not offer (a
    tenant may preset ``nodeName``), and the apiserver keeps it."""
    for pod in pods.values():
        try:
            claim = parse_claim(pod)
        except PodError:
            continue
        if claim.wants_gpu and not claim.terminated:
            return True
    return False


def declarations(pods: Mapping[str, Pod]) -> dict[str, int]:
    """UID -> the memory per GPU each running shared pod with a declaration declares:
    the least the extender charges it on the GPU the report places it on, whatever it
    holds there (headroom.accounting), so a rise in its use below that changes no
    charge (agent.reporter). A pod that has ended is charged what it holds."""
    declared: dict[str, int] = {}
    for uid, pod in pods.items():
        try:
            claim = parse_claim(pod)
        except PodError:
            continue
        if claim.shared and not claim.mig and claim.declared is not None and not claim.terminated:
            declared[uid] = claim.declared
    return declared


def allowance(pod: Pod) -> Allowance | None:
    """What the pod may hold, read as the extender reads it (headroom.claims); None
    when the guard has no measure for it (whole GPUs). A legacy shared pod or one of
    MIG slices only is held to the devices kubelet gave it alone."""
    try:
        claim = parse_claim(pod)
        requests = gpu_requests(pod, most=None)
        listed = not any(
            r.container.kind == "initContainers" and not r.container.sidecar for r in requests
        )
        if claim.declared is not None:
            gpus = max(claim.shared, 1)
            return Allowance(claim.declared, gpus, listed=listed, slices=bool(claim.mig))
        if claim.wants_gpu:
            # Its MIG slices or its legacy replica are its own; a shared GPU kubelet did
            # not give it is not (NVIDIA_VISIBLE_DEVICES reaches any), and what it holds
            # there starves the pods declared on it.
            return Allowance(0, listed=listed, slices=bool(claim.mig), measured=False)
        if not requests:
            return Allowance(0, asks_no_gpu=True)
    except PodError:
        pass  # the apiserver validated the pod's resources; a bad shape is not ours
    return None


def overuse(devices: list[DeviceUse], allowed: Allowance) -> str:
    """Why the pod holds more than it may, for its Event; "" when it does not."""
    if allowed.listed and any(device.allocated for device in devices):
        outside = [device for device in devices if not device.allocated and device.used > 0]
        if outside:
            stray = max(outside, key=lambda device: device.used)
            return (
                f"uses {human_bytes(stray.used)} of GPU memory on {stray.where}, "
                "a GPU kubelet did not allocate to it"
            )
    judged = [device for device in devices if not (allowed.slices and device.mig)]
    if not judged or not allowed.measured:
        return ""
    peak = max(judged, key=lambda device: device.used)
    if peak.used > allowed.declared:
        if allowed.asks_no_gpu:
            return (
                f"uses {human_bytes(peak.used)} of GPU memory on {peak.where} and asks for "
                "no GPU, so it counts as declaring 0 on a node whose GPUs are shared"
            )
        return (
            f"uses {human_bytes(peak.used)} of GPU memory on {peak.where}, above its "
            f"declared {human_bytes(allowed.declared)} ({names.GPU_MEMORY})"
        )
    total = sum(device.used for device in judged)
    if total > allowed.declared * allowed.gpus:
        held = sum(1 for device in judged if device.used > 0)
        return (
            f"uses {human_bytes(total)} of GPU memory across {held} GPUs, above its declared "
            f"{human_bytes(allowed.declared)} per GPU ({names.GPU_MEMORY}) times the "
            f"{allowed.gpus} it asked for"
        )
    return ""


class Guard:
    def __init__(
        self,
        grace: int = 2,
        *,
        warn_every: float = WARN_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace < 1:
            raise ValueError("grace must be at least 1 observation")
        self.grace = grace
        self._warn_every = warn_every
        self._clock = clock
        self._episodes: dict[str, _Episode] = {}
        self._warned_at: dict[str, float] = {}
        """UID -> when its last warn-only Event was asked for."""

    def observe(
        self,
        status: ReportStatus,
        pods: Mapping[str, Pod],
        policies: Mapping[str, GPUSharingPolicy],
        namespaces: Mapping[str, Namespace],
    ) -> list[Verdict]:
        """What to do after one observation; ``pods`` is keyed by UID, ``namespaces`` by name."""
        usage = usage_by_pod(status)
        verdicts: list[Verdict] = []
        for uid in [uid for uid in self._warned_at if uid not in pods]:
            del self._warned_at[uid]  # gone
        for uid in list(self._episodes):
            if uid not in pods:
                del self._episodes[uid]  # gone
            elif uid not in usage:  # holds no GPU memory now: a calm observation
                episode = self._episodes[uid]
                episode.calm += 1
                if episode.calm >= self.grace:
                    del self._episodes[uid]
        shared_node: bool | None = None  # read once, and only for a pod asking for no GPU
        for uid, devices in sorted(usage.items()):
            pod = pods.get(uid)
            allowed = allowance(pod) if pod is not None else None
            if pod is None or allowed is None:
                continue
            if allowed.asks_no_gpu:
                if shared_node is None:
                    shared_node = shares_gpus(pods)
                if not shared_node:
                    continue
            reason = overuse(devices, allowed)
            episode = self._episodes.setdefault(uid, _Episode())
            if not reason:
                # One observation within bounds does not end it: a pod over every other
                # observation (seed 001's spikes) would never be acted on. As many in a
                # row as it takes to act do.
                episode.calm += 1
                if episode.calm >= self.grace:
                    self._episodes[uid] = _Episode()
                continue
            episode.calm = 0
            episode.streak += 1
            action = guard_action(pod, policies, namespaces)
            if episode.streak < self.grace or action is None:
                continue
            verdicts += self._act(episode, pod, action, reason)
        return verdicts

    def event_failed(self, uid: str) -> None:
        """The Event could not be recorded: warn again on the next observation."""
        self._warned_at.pop(uid, None)
        if uid in self._episodes:
            self._episodes[uid].warned = False
            self._episodes[uid].announced = False

    def eviction_refused(self, uid: str) -> None:
        """The eviction (or the deletion after it) failed: try again next time."""
        if uid in self._episodes:
            self._episodes[uid].evicted = False

    def _act(self, episode: _Episode, pod: Pod, action: GuardAction, reason: str) -> list[Verdict]:
        if action == "off":
            return []
        metadata = pod.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        uid = str(metadata.get("uid", ""))
        verdicts = []
        stopping = bool(metadata.get("deletionTimestamp")) and (
            _seconds(metadata.get("deletionGracePeriodSeconds"), EVICTION_GRACE_SECONDS + 1)
            <= EVICTION_GRACE_SECONDS
        )
        evicting = action == "evict" and not episode.evicted and not stopping
        # Said once: at the first action, and again if an eviction follows an Event that
        # did not announce it (the namespace relabelled to an evict policy meanwhile). An
        # Event retried after it failed says so of an eviction already done beside it.
        if not episode.warned or (evicting and not episode.announced):
            announced = evicting or episode.evicted
            message = reason + ("; policy guard is evict: evicting" if announced else "")
            now = self._clock()
            if announced:
                episode.warned = episode.announced = True
                verdicts.append(Verdict("event", namespace, name, uid, message))
            elif now - self._warned_at.get(uid, -self._warn_every) >= self._warn_every:
                episode.warned, episode.announced = True, False
                self._warned_at[uid] = now
                verdicts.append(Verdict("event", namespace, name, uid, message))
            # else: this pod was warned of an earlier episode moments ago. This one is not
            # marked warned: if it lasts, it is warned of once the time is up, so that a
            # brief overrun's Event does not stand for a lasting one that followed it.
        if evicting:
            episode.evicted = True
            verdicts.append(Verdict("evict", namespace, name, uid, reason, _grace(pod)))
        return verdicts


def _grace(pod: Pod) -> int:
    """The grace period to evict ``pod`` with: its own, at most :data:`EVICTION_GRACE_SECONDS`."""
    spec = pod.get("spec") or {}
    own = _seconds(spec.get("terminationGracePeriodSeconds"), EVICTION_GRACE_SECONDS)
    return max(0, min(own, EVICTION_GRACE_SECONDS))


def _seconds(value: Any, default: int) -> int:
    """An integer field of seconds; ``default`` where it is missing or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default
