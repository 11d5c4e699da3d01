"""Reading a pod the apiserver (or a user's YAML, or a fuzzer) sent, defensively.

A pod is a plain JSON dict here. Anything on the path to a GPU request that is
not the shape Kubernetes defines raises :class:`PodError` naming the field, so
the caller can deny the pod with that message instead of crashing.
"""

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headroom.names import GPU_MEMORY, is_gpu_resource
from headroom.quantity import QuantityError, QuantityTooLong, parse_quantity

ContainerList = Literal["initContainers", "containers"]
CONTAINER_LISTS: tuple[ContainerList, ...] = ("initContainers", "containers")

MAX_GPU_COUNT = 1024
"""The most GPUs, time-slicing replicas or MIG slices one container, or one pod, may
ask for. The apiserver keeps an extended resource's count exact, but kube-scheduler,
kubelet and the device plugin read it as 64 bits: ``18446744073709551617`` (2^64 + 1)
passes its "must be an integer" check and is scheduled and allocated as 1, while
every count here is exact. No node has more than this; the admission policy
``headroom-gpu-counts`` and the webhook refuse more, and the extender charges such
a pod as this many and refuses to place it (:mod:`headroom.claims`)."""


class PodError(ValueError):
    """The pod is not shaped like a Pod; the message starts with the field's path."""


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else type(value).__name__


def mapping(parent: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """``parent[key]`` as an object; absent or null reads as empty."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodError(f"{where}: expected an object, got {json_type(value)}")
    return value


def sequence(parent: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodError(f"{where}: expected an array, got {json_type(value)}")
    return value


def string_map(parent: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    """Labels, annotations, nodeSelector: an object of strings."""
    value = mapping(parent, key, where)
    for name, item in value.items():
        if not isinstance(item, str):
            raise PodError(f"{where}[{name}]: expected a string, got {json_type(item)}")
    return value


@dataclass(frozen=True)
class Container:
    """One entry of ``spec.containers`` or ``spec.initContainers``, checked."""

    kind: ContainerList
    index: int
    body: dict[str, Any]

    @property
    def where(self) -> str:
        return f"spec.{self.kind}[{self.index}]"

    @property
    def name(self) -> str:
        name = self.body.get("name")
        return name if isinstance(name, str) else ""

    @property
    def sidecar(self) -> bool:
        """An init container with ``restartPolicy: Always`` runs beside the app."""
        return self.kind == "initContainers" and self.body.get("restartPolicy") == "Always"


@dataclass(frozen=True)
class GPURequest:
    """A container's one GPU resource and how many it asks for."""

    container: Container
    resource: str
    count: int
    in_requests: bool
    """Whether ``resources.requests`` names it too (it must then equal the limit)."""


def containers(pod: Mapping[str, Any]) -> Iterator[Container]:
    spec = mapping(pod, "spec", "spec")
    for kind in CONTAINER_LISTS:
        for index, body in enumerate(sequence(spec, kind, f"spec.{kind}")):
            if not isinstance(body, dict):
                raise PodError(f"spec.{kind}[{index}]: expected an object, got {json_type(body)}")
            yield Container(kind, index, body)


def gpu_requests(pod: Mapping[str, Any], *, most: int | None = MAX_GPU_COUNT) -> list[GPURequest]:
    """Every container's GPU request, in pod order (init containers first); a count
    above ``most`` (None: any) is refused naming the field (see :data:`MAX_GPU_COUNT`)."""
    found = []
    for container in containers(pod):
        request = _gpu_request(container)
        if request is None:
            continue
        if most is not None and request.count > most:
            where = f"{container.where}.resources.limits[{request.resource}]"
            raise PodError(
                f"{where}: {request.count} is above {most}, the most GPUs, replicas or "
                "MIG slices one container may ask for (kube-scheduler and kubelet read a "
                "count past 2^63 cut to 64 bits, e.g. 2^64 + 1 as 1)"
            )
        found.append(request)
    if most is not None:
        asked: dict[str, list[tuple[Container, int]]] = {}
        for request in found:
            asked.setdefault(request.resource, []).append((request.container, request.count))
        for resource, amounts in asked.items():
            if (total := effective_request(amounts)) > most:
                raise PodError(
                    f"spec: the pod asks for {total} {resource} in all (its containers' "
                    f"effective request), above {most}, the most one pod may ask for"
                )
    return found


def _gpu_request(container: Container) -> GPURequest | None:
    wanted = {name: count for name, count in gpu_counts(container).items() if count > 0}
    if not wanted:
        return None
    where = f"{container.where}.resources"
    if len(wanted) > 1:
        raise PodError(f"{where}: asks for more than one GPU resource: {', '.join(wanted)}")
    ((resource, count),) = wanted.items()
    requests = mapping(mapping(container.body, "resources", where), "requests", f"{where}.requests")
    return GPURequest(container, resource, count, in_requests=resource in requests)


def gpu_counts(container: Container) -> dict[str, int]:
    """Every GPU resource the container names, with its count: 0 included, which asks
    for no GPU and so must not stand beside declared memory (headroom.rewrite)."""
    where = f"{container.where}.resources"
    resources = mapping(container.body, "resources", where)
    limits = mapping(resources, "limits", f"{where}.limits")
    requests = mapping(resources, "requests", f"{where}.requests")
    names = sorted({key for key in (*limits, *requests) if is_gpu_resource(key)})
    return {name: _count(limits, requests, name, where) for name in names}


def effective_request(amounts: Iterable[tuple[Container, int]]) -> int:
    """A pod's effective request of one resource, from what each container asks.

    App containers and sidecars (init containers with ``restartPolicy: Always``)
    run together. A plain init container runs alone but for the sidecars
    started before it -- kubelet gives it devices of its own beside theirs,
    never a running sidecar's -- and hands its devices on when it finishes. So
    the pod needs the larger of Σ app + Σ sidecars and, over the plain init
    containers, each one's amount plus that of the sidecars before it: the rule
    of ``PodRequests`` in k8s.io/component-helpers (KEP-753), which
    kube-scheduler and kubelet apply to the same resources.
    """
    apps = 0
    inits = []
    for container, amount in amounts:
        if container.kind == "containers":
            apps += amount
        else:
            inits.append((container.index, container.sidecar, amount))
    sidecars = alone = 0
    for _, sidecar, amount in sorted(inits):
        if sidecar:
            sidecars += amount
        else:
            alone = max(alone, sidecars + amount)
    return max(apps + sidecars, alone)


def declared_memory(container: Container) -> int | None:
    """Bytes of ``headroom.dev/gpu-memory`` the container asks for; None when it asks none.

    Held to the extended-resource rules the apiserver applies (a limit, requests
    equal to it, a whole number) so the message names the field before the
    apiserver would refuse the pod with a less helpful one.
    """
    where = f"{container.where}.resources"
    resources = mapping(container.body, "resources", where)
    limits = mapping(resources, "limits", f"{where}.limits")
    requests = mapping(resources, "requests", f"{where}.requests")
    if GPU_MEMORY not in limits and GPU_MEMORY not in requests:
        return None
    amount = _count(limits, requests, GPU_MEMORY, where)
    if amount <= 0:
        raise PodError(f"{where}.limits[{GPU_MEMORY}]: must be above 0")
    return amount


def _count(limits: dict[str, Any], requests: dict[str, Any], name: str, where: str) -> int:
    if name not in limits:
        raise PodError(f"{where}.limits: {name} is requested but has no limit")
    limit = _whole(limits[name], f"{where}.limits[{name}]")
    if name in requests and _whole(requests[name], f"{where}.requests[{name}]") != limit:
        raise PodError(f"{where}: requests and limits of {name} differ")
    return limit


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PodError(f"{where}: expected a whole number, got {json_type(value)}")
    try:
        amount = parse_quantity(value)
    except QuantityTooLong as err:
        raise PodError(
            f"{where}: {shown(value)} is too long to read ({len(str(value))} characters, "
            "at most 64)"
        ) from err
    except QuantityError as err:
        raise PodError(f"{where}: {shown(value)} is not a quantity") from err
    if amount < 0 or amount != amount.to_integral_value():
        raise PodError(f"{where}: {shown(value)} is not a whole, non-negative number")
    return int(amount)


def shown(value: object, limit: int = 40) -> str:
    """A user's value quoted for a message: JSON-escaped, ASCII, cut short."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[: limit - 4] + '..."'
