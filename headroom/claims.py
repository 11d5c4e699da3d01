"""What a pod claims on a GPU node: shared replicas, MIG slices, declared memory.

Read from the pod's resources only: the device plugin's names and Headroom's
``headroom.dev/gpu-memory``, which the webhook writes and which, like every pod
resource, cannot change after creation. Annotations are explanations for
people and never count: a tenant may patch them. The effective amount of a
resource follows Kubernetes' effective-request rule
(:func:`headroom.podspec.effective_request`): the larger of the sum over the
app containers and sidecars, and the largest plain init container's own
amount plus that of the sidecars started before it.

A shared pod without ``headroom.dev/gpu-memory`` was admitted before the
declaration became a resource (Headroom 0.1, annotation only): it is *legacy*,
and the accounting charges it the whole of every GPU it may be on until it is
recreated through the webhook (``kubectl rollout restart``). A pod neither
shared nor declaring is charged what the node agent observes it holding.
A malformed placement annotation is kept as a ``problem``: the filter refuses
such a pod with that message.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from headroom import names
from headroom.mig import profile_from_resource
from headroom.podspec import (
    MAX_GPU_COUNT,
    Container,
    PodError,
    containers,
    declared_memory,
    effective_request,
    gpu_counts,
    mapping,
    shown,
    string_map,
)
from headroom.quantity import QuantityTooLong, human_bytes

Placement = Literal["binpack", "spread"]
DEFAULT_PLACEMENT: Placement = "binpack"
TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_GRACE_SECONDS = 30.0
"""``spec.terminationGracePeriodSeconds`` where a pod leaves it out (the API's default)."""


@dataclass(frozen=True)
class PodClaim:
    uid: str
    namespace: str
    name: str
    node: str = ""
    """``spec.nodeName``, or the node a bind is assuming; "" while pending."""
    shared: int = 0
    """Replicas of ``nvidia.com/gpu.shared``."""
    mig: Mapping[str, int] = field(default_factory=dict)
    """MIG profile (``1g.10gb+me``) -> slices."""
    declared: int | None = None
    """Effective bytes of ``headroom.dev/gpu-memory``; None when the pod declares nothing."""
    placement: Placement = DEFAULT_PLACEMENT
    scheduler: str = names.DEFAULT_SCHEDULER
    """``spec.schedulerName`` (the apiserver defaults it to ``default-scheduler``)."""
    terminated: bool = False
    problem: str = ""
    """Why the filter refuses the pod wherever it is asked: the user's to fix."""
    too_many: str = ""
    """The problem of a GPU count above MAX_GPU_COUNT, charged as that many; kept with
    the pod's other resource figures, which are read once per UID."""
    priority: int = 0
    """``spec.priority``, which the apiserver sets from the pod's PriorityClass."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """For PodDisruptionBudgets when the pod may be a preemption victim."""
    nominated: str = ""
    """``status.nominatedNodeName``: where kube-scheduler's preemption made room for it."""
    created: float | None = None
    """``metadata.creationTimestamp`` in epoch seconds (None if absent or unreadable):
    no allocation of the pod's GPU can be older (headroom.spread)."""
    grace: float = DEFAULT_GRACE_SECONDS
    """``spec.terminationGracePeriodSeconds``: how long kubelet may take to stop the
    pod's containers, holding its device replicas, after it is deleted."""
    deleted: bool = False
    """Gone from the API (``kubectl delete --force``, the pod GC, a read that found it
    gone), or in a terminal phase, before kubelet reported its containers stopped: they
    may run out the grace period, free to use all it declared, but kubelet no longer
    counts the pod among its active ones, and its device manager frees the pod's
    replicas before the next allocation (kubernetes#104824). So the device plugin may
    give its GPU to newcomers as if it were empty: the pod is charged in full where it
    may run, outside the bound on where the allocator put the others
    (headroom.accounting)."""
    home: tuple[int, ...] | None = None
    """For a ``deleted`` pod: the GPUs a report placed its replicas on when it left, each
    once, where the report counted all of them (headroom.accounting.placed); None: any
    GPU of its node."""

    @cached_property
    def key(self) -> str:
        """One string per claim: every GPU account line of the pod shares it."""
        return f"{self.namespace}/{self.name}"

    @property
    def legacy(self) -> bool:
        """A shared pod with no declared memory resource (admitted by Headroom 0.1)."""
        return self.shared > 0 and self.declared is None

    @property
    def wants_gpu(self) -> bool:
        """Whether the extender has anything to decide for this pod."""
        return self.shared > 0 or bool(self.mig)

    @property
    def need(self) -> int:
        """Bytes the pod must find free on a GPU (0 when it declares nothing)."""
        return self.declared or 0

    @cached_property
    def need_text(self) -> str:
        """``10.0 GiB``: computed once per request, read in every refusal."""
        return human_bytes(self.need)


def parse_claim(pod: Mapping[str, Any], earlier: PodClaim | None = None) -> PodClaim:
    """The claim of a Pod (JSON dict); raises PodError naming a malformed field.

    ``earlier``: a claim parsed before from the pod with this UID, if any. Its
    resource figures (shared, MIG, declared) and creation time are kept rather
    than read again: a pod's extended resources cannot change after creation
    (in-place resize is for CPU and memory only) and a UID is never reused, so
    a watch event or a filter request about a known pod only needs its
    metadata, ``spec.nodeName`` and status read -- most of a storm's parsing.
    """
    metadata = mapping(pod, "metadata", "metadata")
    uid = _text(metadata.get("uid"))
    annotations = string_map(metadata, "annotations", "metadata.annotations")
    spec = mapping(pod, "spec", "spec")
    status = mapping(pod, "status", "status")
    node = spec.get("nodeName") or ""
    if not isinstance(node, str):
        raise PodError("spec.nodeName: expected a string")
    scheduler = spec.get("schedulerName") or names.DEFAULT_SCHEDULER
    if not isinstance(scheduler, str):
        raise PodError("spec.schedulerName: expected a string")
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PodError("spec.priority: expected an integer")
    phase = status.get("phase") or ""
    if not isinstance(phase, str):
        raise PodError("status.phase: expected a string")
    nominated = status.get("nominatedNodeName") or ""
    if not isinstance(nominated, str):
        raise PodError("status.nominatedNodeName: expected a string")
    grace = spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
        # Never a refusal: a pod the watch ignored would go uncharged. The default
        # only ever makes its departure count longer than a shorter grace would.
        grace = DEFAULT_GRACE_SECONDS

    if earlier is not None and uid and earlier.uid == uid:
        shared, mig, declared = earlier.shared, earlier.mig, earlier.declared
        created, too_many = earlier.created, earlier.too_many
    else:
        shared, mig, declared, too_many = _resources(pod)
        created = _epoch(metadata.get("creationTimestamp"))

    problem = too_many
    placement: Placement = DEFAULT_PLACEMENT
    wanted = annotations.get(names.ANNOTATION_PLACEMENT)
    if wanted == "spread":
        placement = "spread"
    elif wanted not in (None, "binpack") and not problem:
        problem = (
            f"annotation {names.ANNOTATION_PLACEMENT}={shown(wanted)} is not binpack or spread"
        )
    return PodClaim(
        uid=uid,
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")) or _text(metadata.get("generateName")),
        node=node,
        shared=shared,
        mig=mig,
        declared=declared,
        placement=placement,
        scheduler=scheduler,
        terminated=phase in TERMINATED_PHASES,
        problem=problem,
        too_many=too_many,
        priority=priority,
        labels=string_map(metadata, "labels", "metadata.labels"),
        nominated=nominated,
        created=created,
        grace=float(grace),
    )


def _resources(pod: Mapping[str, Any]) -> tuple[int, dict[str, int], int | None, str]:
    """Effective shared replicas, MIG slices by profile, declared bytes (None: none),
    and a problem: a count above :data:`MAX_GPU_COUNT` is charged as that many (more
    than kubelet allocates, whatever it reads) and named, so the filter refuses it;
    a declaration that cannot be read makes the pod declare none, and is named."""
    asked: dict[str, list[tuple[Container, int]]] = {}
    unreadable = uncounted = ""
    for container in containers(pod):
        # Every GPU resource the container asks for, not only the one the webhook
        # allows a container (gpu_requests): an exempt namespace's pod may ask a
        # shared replica and a MIG slice together, and kubelet gives it both.
        try:
            counts = gpu_counts(container)
        except PodError as err:
            if not isinstance(err.__cause__, QuantityTooLong):
                raise
            # A count the apiserver stores but this cannot read: a whole number too
            # long to read (2^256 + 1), of which kube-scheduler and kubelet read the
            # low 64 bits. Raising would have the pod watch drop the pod, uncharged:
            # each GPU resource the container names is charged the most a pod may ask.
            counts = dict.fromkeys(_gpu_names(container), MAX_GPU_COUNT)
            uncounted = uncounted or str(err)
        for resource, count in counts.items():
            if count > 0:
                asked.setdefault(resource, []).append((container, count))
        try:
            memory = declared_memory(container)
        except PodError as err:
            # Stored by the apiserver all the same (0; a number too long to read,
            # of which kube-scheduler and kubelet read the low 64 bits), and let
            # through by admission in exempt namespaces: no declaration to charge.
            # Raising would have the pod watch drop the pod, uncharged; it is
            # charged as declaring nothing (a shared pod: the whole GPU).
            unreadable = unreadable or str(err)
            continue
        if memory is not None:
            asked.setdefault(names.GPU_MEMORY, []).append((container, memory))
    effective = {resource: effective_request(amounts) for resource, amounts in asked.items()}

    mig: dict[str, int] = {}
    declared = effective.pop(names.GPU_MEMORY, None)
    problem = ""
    if uncounted:
        problem = f"{uncounted}: charged as {MAX_GPU_COUNT}, the most one pod may ask for"
    if unreadable:
        declared = None
        problem = f"{unreadable}: no {names.GPU_MEMORY} declaration Headroom can charge"
    for resource, count in effective.items():
        if count > MAX_GPU_COUNT:
            problem = problem or (
                f"the pod asks for {count} {resource}, above {MAX_GPU_COUNT}, the most one "
                "pod may ask for"
                + (" (kube-scheduler and kubelet read it cut to 64 bits)" if count >= 2**63 else "")
            )
            effective[resource] = MAX_GPU_COUNT
    for resource, count in effective.items():
        profile = profile_from_resource(resource)
        if profile is not None:
            mig[profile] = count
    return effective.get(names.GPU_SHARED, 0), mig, declared, problem


def _gpu_names(container: Container) -> list[str]:
    """The GPU resources the container names in its limits or requests."""
    where = f"{container.where}.resources"
    resources = mapping(container.body, "resources", where)
    named = (
        *mapping(resources, "limits", f"{where}.limits"),
        *mapping(resources, "requests", f"{where}.requests"),
    )
    return sorted({name for name in named if names.is_gpu_resource(name)})


def has_headroom_annotations(pod: Mapping[str, Any]) -> bool:
    """Cheap test for the pod cache: was this pod decided by the webhook?

    Used only to keep such pods in the cache (the agent's guard explains them);
    nothing is charged from annotations."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and (
        names.ANNOTATION_DECLARED_MEMORY in annotations or names.ANNOTATION_MODE in annotations
    )


def _epoch(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
