"""What a pod claims on a GPU node: shared replicas, MIG slices, declared memory.

Read from the pod's resources (the device plugin's names) and the annotations
the webhook wrote. The effective count of a resource follows Kubernetes'
effective-request rule: the larger of the app containers' sum (sidecar init
containers included) and the largest plain init container's.

A pod the webhook did not mutate has no declared memory; it is charged by what
the node agent observes it holding and nothing more (see :mod:`headroom.accounting`).
An unreadable annotation is kept as a ``problem``: the filter refuses such a
pod with that message, and a pod already bound still counts by observation.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from headroom import names
from headroom.mig import profile_from_resource
from headroom.podspec import PodError, gpu_requests, mapping, shown, string_map
from headroom.quantity import QuantityError, human_bytes, parse_bytes

Placement = Literal["binpack", "spread"]
DEFAULT_PLACEMENT: Placement = "binpack"
TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})


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
    """Bytes from ``headroom.dev/declared-memory``; None when the pod declares nothing."""
    placement: Placement = DEFAULT_PLACEMENT
    terminated: bool = False
    problem: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

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


def parse_claim(pod: Mapping[str, Any]) -> PodClaim:
    """The claim of a Pod (JSON dict); raises PodError naming a malformed field."""
    metadata = mapping(pod, "metadata", "metadata")
    annotations = string_map(metadata, "annotations", "metadata.annotations")
    spec = mapping(pod, "spec", "spec")
    status = mapping(pod, "status", "status")
    node = spec.get("nodeName") or ""
    if not isinstance(node, str):
        raise PodError("spec.nodeName: expected a string")

    app: dict[str, int] = {}
    init: dict[str, int] = {}
    for request in gpu_requests(pod):
        if request.container.kind == "containers" or request.container.sidecar:
            app[request.resource] = app.get(request.resource, 0) + request.count
        else:
            init[request.resource] = max(init.get(request.resource, 0), request.count)
    effective = {r: max(app.get(r, 0), init.get(r, 0)) for r in app.keys() | init.keys()}

    mig: dict[str, int] = {}
    for resource, count in effective.items():
        profile = profile_from_resource(resource)
        if profile is not None:
            mig[profile] = count

    declared, problem = _declared(annotations)
    placement: Placement = DEFAULT_PLACEMENT
    wanted = annotations.get(names.ANNOTATION_PLACEMENT)
    if wanted == "spread":
        placement = "spread"
    elif wanted not in (None, "binpack"):
        problem = problem or (
            f"annotation {names.ANNOTATION_PLACEMENT}={shown(wanted)} is not binpack or spread"
        )
    return PodClaim(
        uid=_text(metadata.get("uid")),
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")) or _text(metadata.get("generateName")),
        node=node,
        shared=effective.get(names.GPU_SHARED, 0),
        mig=mig,
        declared=declared,
        placement=placement,
        terminated=status.get("phase") in TERMINATED_PHASES,
        problem=problem,
    )


def has_headroom_annotations(pod: Mapping[str, Any]) -> bool:
    """Cheap test for the pod cache: was this pod decided by the webhook?"""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and (
        names.ANNOTATION_DECLARED_MEMORY in annotations or names.ANNOTATION_MODE in annotations
    )


def _declared(annotations: Mapping[str, str]) -> tuple[int | None, str]:
    raw = annotations.get(names.ANNOTATION_DECLARED_MEMORY)
    if raw is None:
        return None, ""
    try:
        return parse_bytes(raw), ""
    except QuantityError:
        return None, (
            f"annotation {names.ANNOTATION_DECLARED_MEMORY}={shown(raw)} is not a memory quantity"
        )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
