"""The rewrite rules, applied in place to a copy of the pod.

:func:`headroom.mutation.decide` owns the outcome (allow, deny, dry run, the
patch); this module owns what a policy does to each part of the pod, with
where the pod may run in :mod:`headroom.scheduling`. Every rule looks before
it writes, so running it on its own output changes nothing.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headroom import names
from headroom.mig import MigOffer, choose_profile, described_memory_mib, profile_from_resource
from headroom.podspec import (
    Container,
    GPURequest,
    PodError,
    containers,
    declared_memory,
    effective_request,
    gpu_counts,
    gpu_requests,
    json_type,
    mapping,
    sequence,
    shown,
    string_map,
)
from headroom.policy import GPUSharingPolicy, GPUSharingPolicySpec
from headroom.quantity import GIB, MIB, QuantityError, format_bytes, parse_bytes
from headroom.scheduling import SelectorConflict, schedule

Kind = Literal["shared", "mig", "exclusive"]


class Denied(Exception):
    """The policy refuses the pod; the message says which field and why."""


class InvalidMemory(Denied):
    """A ``headroom.dev/gpu-memory*`` annotation is not a usable quantity."""


@dataclass(frozen=True)
class Placed:
    """Where one container's GPU request ends up."""

    request: GPURequest
    resource: str
    kind: Kind
    memory: int | None = None
    """Declared bytes per GPU (shared and MIG containers only)."""

    @property
    def label(self) -> str:
        return _label(self.request.container)


class Declarations:
    """The memory each container declares: its ``headroom.dev/gpu-memory`` resource if it
    asks for one, else the annotations, else the policy default.

    The resource wins because it is what Kubernetes enforces; on the webhook's
    own output (reinvocation) it holds the value the annotations gave.
    """

    def __init__(self, annotations: Mapping[str, str], spec: GPUSharingPolicySpec, policy: str):
        self.spec = spec
        self.policy = policy
        self.pod_level: int | None = None
        self.per_container: dict[str, int] = {}
        # Every memory annotation is checked, used or not: a typo is never ignored.
        for key, value in annotations.items():
            if key == names.ANNOTATION_GPU_MEMORY:
                self.pod_level = _memory(key, value)
            elif key.startswith(names.ANNOTATION_GPU_MEMORY_CONTAINER_PREFIX):
                container = key[len(names.ANNOTATION_GPU_MEMORY_CONTAINER_PREFIX) :]
                self.per_container[container] = _memory(key, value)

    def of(self, placed_label: str, container: Container) -> int:
        declared = declared_memory(container)
        if declared is None:
            declared = self.per_container.get(container.name, self.pod_level)
        if declared is None:
            declared = self.spec.default_memory_bytes
        if declared is None:
            raise Denied(
                f"{placed_label} declares no GPU memory: set annotation "
                f"{names.ANNOTATION_GPU_MEMORY} (policy {self.policy} has no defaultMemory)"
            )
        self._within_limit(placed_label, declared)
        return declared

    def source(self, container: Container) -> str | None:
        """The annotation :meth:`of` reads for ``container``; None for the policy default."""
        if container.name in self.per_container:
            return names.ANNOTATION_GPU_MEMORY_CONTAINER_PREFIX + container.name
        return names.ANNOTATION_GPU_MEMORY if self.pod_level is not None else None

    def check_unplaced(self, container: Container) -> None:
        """Raise Denied for a container that asks for no GPU yet declares memory wrongly.

        Its ``headroom.dev/gpu-memory`` is charged with the pod's all the same
        (:mod:`headroom.claims` sums every container's), so maxMemory holds for
        it too. Beside a GPU resource at a count of 0 it is a tenant's way past
        both the limit and the "memory needs a slot" rule: the container looks
        like a GPU container, yet no slot backs the memory.
        """
        label = _label(container)
        for resource, count in gpu_counts(container).items():
            if count == 0:
                raise Denied(
                    f"{label} asks for {resource}: 0 beside {names.GPU_MEMORY} "
                    f"({container.where}.resources.limits[{resource}]): a count of 0 is no "
                    f"GPU, so no slot backs the memory; ask for 1 or drop {names.GPU_MEMORY}"
                )
        declared = declared_memory(container)
        if declared is not None:
            self._within_limit(label, declared)

    def _within_limit(self, label: str, declared: int) -> None:
        least = self.spec.min_memory_bytes
        if least is not None and declared < least:
            # A declaration of a few bytes would place the pod on an all but full GPU,
            # leaving only the guard between its real use and its neighbours.
            raise Denied(
                f"{label} declares {format_bytes(declared)} of GPU memory, below "
                f"minMemory {self.spec.min_memory} of policy {self.policy}"
            )
        limit = self.spec.max_memory_bytes
        if limit is not None and declared > limit:
            raise Denied(
                f"{label} declares {format_bytes(declared)} of GPU memory, above "
                f"maxMemory {self.spec.max_memory} of policy {self.policy}"
            )


def _memory(key: str, value: str) -> int:
    try:
        amount = parse_bytes(value)
    except QuantityError as err:
        reason = str(err)
        problem = (
            "must be above 0"
            if "negative" in reason
            else "is out of range"
            if "range" in reason
            else "is not a quantity (e.g. 10Gi)"
        )
        raise InvalidMemory(f"annotation {key}={shown(value)} {problem}") from err
    if amount <= 0:
        raise InvalidMemory(f"annotation {key}={shown(value)} must be above 0")
    return amount


class Rewrite:
    """One pod being rewritten; ``changes`` and ``notes`` become the warnings."""

    def __init__(self, pod: dict[str, Any], offer: MigOffer | None) -> None:
        self.pod = pod
        self.offer = offer
        self.requests = gpu_requests(pod)
        placing = {(request.container.kind, request.container.index) for request in self.requests}
        self.unplaced = [
            container
            for container in containers(pod)
            if (container.kind, container.index) not in placing
            and declared_memory(container) is not None
        ]
        """Containers that declare ``headroom.dev/gpu-memory`` yet ask for no GPU."""
        self.changes: list[str] = []
        """What was rewritten (shown as such, or as "would" in a dry run)."""
        self.notes: list[str] = []
        """What was deliberately left alone, and why."""
        self.annotations: dict[str, str] = {}

    def apply(self, policy: GPUSharingPolicy) -> None:
        spec = policy.spec
        metadata = mapping(self.pod, "metadata", "metadata")
        annotations = string_map(metadata, "annotations", "metadata.annotations")
        for request in self.requests:  # first: no annotation's fault hides this one
            if request.resource != names.GPU_SHARED and names.is_time_sliced(request.resource):
                raise Denied(
                    f"{_label(request.container)} asks for {request.resource}, a time-sliced "
                    f"MIG slice: Headroom accounts GPU memory on {names.GPU_SHARED} only, so "
                    "pods sharing the slice could take each other's memory; ask for "
                    f"{names.GPU} (the policy places it) or for the slice itself, "
                    f"{request.resource.removesuffix('.shared')}"
                )
        declared = Declarations(annotations, spec, policy.name)
        known = {container.name for container in containers(self.pod)}
        for name in sorted(set(declared.per_container) - known):
            self.notes.append(f"annotation {names.ANNOTATION_GPU_MEMORY}.{name} names no container")
        for container in self.unplaced:
            declared.check_unplaced(container)
        if not self.requests:
            return  # only such containers: nothing to place, schedule or annotate
        placed = [self._place(request, policy, declared) for request in self.requests]
        for item in placed:
            if item.kind != "shared" and declared_memory(item.request.container) is not None:
                _stray_memory(item, policy.name)
        for item in placed:
            self._set_resource(item)
            if item.kind == "shared" and item.memory is not None:
                self._set_memory(item)
        if spec.mode == "exclusive" or any(item.kind != "exclusive" for item in placed):
            foreign = {item.kind for item in placed} - {spec.mode}
            try:
                schedule(self.pod["spec"], policy, foreign, changes=self.changes, notes=self.notes)
            except SelectorConflict as err:
                # decide() turns every Denied into the denial; the text is kept as is.
                raise Denied(str(err)) from err
        if spec.env_hints:
            for item in placed:
                if item.kind == "shared" and item.memory is not None:
                    self._env_hints(item, spec)
        self._annotate(placed, policy)

    def _place(
        self, request: GPURequest, policy: GPUSharingPolicy, declared: Declarations
    ) -> Placed:
        spec, resource, count = policy.spec, request.resource, request.count
        label = _label(request.container)
        if resource == names.GPU_SHARED:
            return Placed(request, resource, "shared", declared.of(label, request.container))
        if resource != names.GPU:
            profile = _profile(resource)
            allowed = spec.mig.allowed_profiles
            if spec.mode == "mig" and allowed and profile not in allowed:
                raise Denied(
                    f"{label} asks for {resource}; policy {policy.name} allows "
                    f"only {', '.join(allowed)}"
                )
            memory = declared.of(label, request.container)
            return Placed(
                request,
                resource,
                "mig",
                self._within_slice(label, resource, memory, declared, request.container),
            )
        if spec.mode in ("shared", "mig") and count > 1:
            # A CUDA process sees one MIG device and MIG slices have no peer-to-peer,
            # and a shared request above 1 fails on the node: N GPUs stay N whole GPUs.
            if spec.multi_gpu == "deny":
                raise Denied(
                    f"{label} asks for {names.GPU}: {count}; policy {policy.name} gives one "
                    f"{'MIG slice' if spec.mode == 'mig' else 'shared GPU'} per container "
                    "(multiGPU: deny)"
                )
            why = (
                "a process sees one MIG device and slices have no peer-to-peer"
                if spec.mode == "mig"
                else "shared requests above 1 fail on the node"
            )
            self.notes.append(f"{label} keeps {count} whole GPUs ({names.GPU}): {why}")
            return Placed(request, resource, "exclusive")
        if spec.mode == "mig":
            memory = declared.of(label, request.container)
            choice = choose_profile(
                memory,
                allowed=spec.mig.allowed_profiles,
                fallback=spec.mig.fallback,
                offer=self.offer,
            )
            if choice.profile is None:
                raise Denied(
                    f"{label} declares {format_bytes(memory)} of GPU memory: {choice.reason}"
                )
            if choice.reason:
                self.notes.append(f"{label}: {choice.reason}")
            return Placed(request, names.mig_resource(choice.profile), "mig", memory)
        if spec.mode == "shared":
            return Placed(
                request, names.GPU_SHARED, "shared", declared.of(label, request.container)
            )
        return Placed(request, resource, "exclusive")

    def _within_slice(
        self, label: str, resource: str, memory: int, declared: Declarations, container: Container
    ) -> int:
        """The declaration of a container that asks for a MIG slice itself: refused where
        an annotation declares more than the slice holds; the policy's default (which
        sizes ``nvidia.com/gpu``) is cut to the slice. A profile neither the nodes nor
        the table describe is not guessed at."""
        slice_mib = described_memory_mib(_profile(resource), self.offer)
        if slice_mib is None or memory <= slice_mib * MIB or declared_memory(container):
            return memory  # (a declared resource beside a slice is refused: _stray_memory)
        key = declared.source(container)
        if key is not None:
            raise Denied(
                f"{label}: annotation {key} declares {format_bytes(memory)}, but "
                f"{resource} holds {slice_mib}Mi: declare at most that, or ask for a "
                "larger slice"
            )
        self.notes.append(
            f"{label}: declares {slice_mib}Mi, all {resource} holds "
            f"(defaultMemory {declared.spec.default_memory} is more)"
        )
        return slice_mib * MIB

    def _set_resource(self, item: Placed) -> None:
        old, new, count = item.request.resource, item.resource, item.request.count
        if old == new:
            return
        resources = item.request.container.body["resources"]
        # Requests and limits are rewritten together: for extended resources they must be equal.
        for section in ("limits", "requests"):
            values = resources.get(section)
            if isinstance(values, dict) and old in values:
                del values[old]
                values[new] = str(count)
        extra = (
            f" ({format_bytes(item.memory)} declared)" if item.kind == "mig" and item.memory else ""
        )
        self.changes.append(f"{item.label}: {old}: {count} -> {new}: {count}{extra}")

    def _set_memory(self, item: Placed) -> None:
        """Declare the memory as the extended resource, in limits and requests alike.

        Pod resources are immutable after creation, so from here on nothing a
        tenant patches can change the charge; quota, kube-scheduler and kubelet
        see it too (README, "Declared memory is a resource").
        """
        assert item.memory is not None
        if declared_memory(item.request.container) == item.memory:
            return
        resources = item.request.container.body["resources"]
        value = format_bytes(item.memory)
        for section in ("limits", "requests"):
            values = resources.get(section)
            if not isinstance(values, dict):
                values = resources[section] = {}
            values[names.GPU_MEMORY] = value
        self.changes.append(f"{item.label}: {names.GPU_MEMORY}: {value}")

    def _env_hints(self, item: Placed, spec: GPUSharingPolicySpec) -> None:
        body = item.request.container.body
        if sequence(body, "envFrom", f"{item.request.container.where}.envFrom"):
            # An explicit env entry beats envFrom, and which names a ConfigMap or
            # Secret sets is unknown here: a hint could override the user's value.
            self.notes.append(f"{item.label}: env hints not added (it uses envFrom)")
            return
        where = f"{item.request.container.where}.env"
        env = sequence(body, "env", where)
        present: dict[str, dict[str, Any]] = {}
        for index, entry in enumerate(env):
            if not isinstance(entry, dict):
                raise PodError(f"{where}[{index}]: expected an object, got {json_type(entry)}")
            name = entry.get("name")
            if not isinstance(name, str):
                raise PodError(f"{where}[{index}].name: expected a string, got {json_type(name)}")
            present[name] = entry
        hints = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
        if spec.sharing == "mps" and item.memory is not None:
            pin = f"0={mps_limit(item.memory)}"
            hints[MPS_PIN] = pin
            own = present.get(MPS_PIN)
            if own is not None and own.get("value") != pin:
                # Never overridden; it may allow more than the declaration, which the
                # guard then holds the pod to (and the extender charges what it holds).
                self.notes.append(
                    f"own {MPS_PIN} kept, not {pin} (the guard still applies): {item.label}"
                )
        new = [
            {"name": name, "value": value} for name, value in hints.items() if name not in present
        ]
        if new:
            body["env"] = [*env, *new]
            text = ", ".join(f"{entry['name']}={entry['value']}" for entry in new)
            self.changes.append(f"{item.label}: env {text} added")

    def _annotate(self, placed: list[Placed], policy: GPUSharingPolicy) -> None:
        kinds = {item.kind for item in placed}
        mode = "mig" if "mig" in kinds else "shared" if "shared" in kinds else "exclusive"
        wanted = {
            names.ANNOTATION_POLICY: policy.name,
            names.ANNOTATION_MODE: mode,
            names.ANNOTATION_PLACEMENT: policy.spec.placement,
        }
        declaring = [(p.request.container, p.memory) for p in placed if p.memory]
        if declaring:
            total = effective_request(declaring)
            wanted[names.ANNOTATION_DECLARED_MEMORY] = format_bytes(total)
        profiles = [_profile(p.resource) for p in placed if p.kind == "mig"]
        if profiles:
            wanted[names.ANNOTATION_MIG_PROFILE] = ",".join(dict.fromkeys(profiles))
        metadata = self.pod.get("metadata")
        if not isinstance(metadata, dict):
            metadata = self.pod["metadata"] = {}
        annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            annotations = metadata["annotations"] = {}
        replaced = {key: annotations[key] for key in wanted if key in annotations}
        annotations.update(wanted)
        after = annotation_bytes(annotations)
        if after > ANNOTATIONS_LIMIT:
            before = after - annotation_bytes(wanted) + annotation_bytes(replaced)
            # The apiserver checks after mutating admission, and would refuse the pod
            # for a limit its author had not passed.
            raise Denied(
                f"metadata.annotations: the pod's annotations take {before} bytes, and "
                f"Headroom's ({', '.join(wanted)}) would bring them to {after} bytes, above "
                f"Kubernetes' limit of {ANNOTATIONS_LIMIT} (keys and values together): "
                f"shorten them by {after - ANNOTATIONS_LIMIT} "
                f"byte{'' if after - ANNOTATIONS_LIMIT == 1 else 's'}"
            )
        self.annotations = wanted


ANNOTATIONS_LIMIT = 256 * 1024
"""kube-apiserver's limit on a pod's annotations, keys and values together, in bytes
(``TotalAnnotationSizeLimitB``, apimachinery ``pkg/api/validation/objectmeta.go``)."""


def annotation_bytes(annotations: Mapping[str, str]) -> int:
    """Their size as the apiserver counts it: UTF-8 bytes of every key and value. A lone
    surrogate (no JSON from the apiserver holds one) counts 3, as the U+FFFD that Go
    decodes it to."""
    return sum(
        len(key.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass"))
        for key, value in annotations.items()
    )


def _stray_memory(item: Placed, policy: str) -> None:
    """Raise Denied: the container declares the memory resource, yet gets no shared GPU.

    ``headroom.dev/gpu-memory`` goes with ``nvidia.com/gpu.shared`` only: beside a MIG
    slice or whole GPUs it takes node capacity no slot backs, and the admission policy
    ``headroom-shared-gpu-pods`` would refuse the rewritten pod, telling the tenant to
    ask for ``nvidia.com/gpu: 1`` -- which is what they did.
    """
    count = item.request.count
    given = (
        f"a MIG slice ({item.resource})"
        if item.kind == "mig"
        else f"{count} whole GPU{'s' if count > 1 else ''} ({item.resource})"
    )
    where = f"{item.request.container.where}.resources.limits[{names.GPU_MEMORY}]"
    raise Denied(
        f"{item.label} declares {where}, which goes with {names.GPU_SHARED} only, and "
        f"policy {policy} gives it {given}: drop the resource (declare the memory "
        f"with annotation {names.ANNOTATION_GPU_MEMORY} to size a MIG slice)"
    )


def _label(container: Container) -> str:
    return f"container {shown(container.name, 60)}"


def _profile(resource: str) -> str:
    return profile_from_resource(resource) or resource[len(names.MIG_PREFIX) :]


MPS_PIN = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def mps_limit(memory: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``'s value: whole GiB as ``G``, else MiB as ``M``,
    rounded down: the pin is what the client may allocate, never more than it declared
    (the NVIDIA device plugin's own pins are whole MiB, rounded down too). The format
    has nothing below ``1M``, which a declaration under 1 MiB is given."""
    if memory % GIB == 0:
        return f"{memory // GIB}G"
    return f"{max(memory // MIB, 1)}M"
