"""GPUSharingPolicy: the cluster-wide rule a namespace chooses with a label.

The model mirrors the CRD in ``manifests/base/crds/gpusharingpolicies.yaml``
field for field (``tests/headroom/test_crd_schema.py`` proves they agree), so a
policy the apiserver accepts is one the webhook can load, and the reverse.
Keys are the exact camelCase of the CRD; snake_case spellings are rejected like
any other unknown field, because a typo must never turn into a silent default.

Defaults, and why:

- ``mode: shared`` -- the point of Headroom; ``exclusive`` keeps whole GPUs.
- ``defaultMemory`` unset -- a pod that declares nothing is denied until the
  admin picks a default; a guessed default would make the accounting a guess.
- ``multiGPU: exclusive`` -- a shared request > 1 fails on nodes with
  ``failRequestsGreaterThanOne``, so ``nvidia.com/gpu: N`` (N > 1) is kept as N
  whole GPUs, with a warning; ``deny`` refuses such pods instead.
- ``nodeSelectorConflict: warn`` -- when the pod already selects a different
  value for a key the policy sets, the user's value is kept and the pod is
  warned; ``deny`` refuses the pod. Never silently overwritten.
- ``invalidMemory: deny`` -- a malformed ``headroom.dev/gpu-memory`` annotation
  denies the pod naming the annotation and value; ``warn`` passes the pod
  unchanged with a warning if it asks only for whole GPUs or MIG slices (one
  asking for a shared slot or declaring memory itself would skip
  ``minMemory``/``maxMemory``, and is denied).
- ``guard: warn`` -- the agent records an Event when a pod holds more GPU
  memory than it declared; ``evict`` also evicts it; ``off`` does nothing.
- ``envHints: false`` -- environment is the user's; hints are opt-in.
- ``allowSkip: false`` -- the pod label ``headroom.dev/skip=true`` is ignored
  (with a warning), so a tenant cannot opt a GPU pod out of the accounting;
  ``true`` lets it pass unchanged (a whole GPU stays a whole GPU).
- ``foreignSchedulers: deny`` -- in ``mode: shared``, a GPU pod naming another
  scheduler (kai-scheduler, volcano) would skip the GPU memory fit, so it is
  denied; ``ignore`` leaves it unchanged, outside Headroom (whole GPUs).
"""

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from headroom.names import API_VERSION, HEADROOM_SCHEDULER, POLICY_KIND
from headroom.quantity import QuantityError, parse_bytes

MEMORY_PATTERN = r"^[1-9][0-9]*(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?$"
"""Positive memory quantities only (``4Gi``, ``1.5G``, ``512Mi``); the CRD uses
the same pattern. No exponents, no milli-bytes, no zero: none mean memory."""
MIG_PROFILE_PATTERN = r"^[1-9][0-9]*g\.[1-9][0-9]*gb([+-][a-z]+(\.[a-z]+)*)?$"
"""``3g.20gb``, ``1g.10gb+me``, ``1g.24gb-me``: NVIDIA's MIG profile names."""
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""What the apiserver accepts as a nodeSelector or toleration value (a label value)."""
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key (``prefix/name``, name at most 63): a nodeSelector or toleration key."""

Mode = Literal["shared", "mig", "exclusive", "passthrough"]


def _memory_in_range(value: str) -> str:
    try:
        parse_bytes(value)
    except QuantityError as err:
        raise ValueError(str(err)) from err
    return value


MemoryQuantity = Annotated[
    str, Field(pattern=MEMORY_PATTERN, max_length=32), AfterValidator(_memory_in_range)
]


class _Strict(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


class Toleration(_Strict):
    """``core/v1`` Toleration, the shape the pod gets verbatim."""

    key: str | None = Field(default=None, max_length=316, pattern=LABEL_KEY_PATTERN)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_PATTERN)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "Toleration":
        # The apiserver's own pod validation rules; checked here so a policy can
        # never produce a pod that the apiserver then refuses.
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("effect must be NoExecute when tolerationSeconds is set")
        return self

    def as_pod_toleration(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class MigPolicy(_Strict):
    allowed_profiles: list[Annotated[str, Field(pattern=MIG_PROFILE_PATTERN, max_length=32)]] = (
        Field(default_factory=list, max_length=32)
    )
    """Empty: every profile the cluster advertises (without a cluster view,
    every profile in the built-in table)."""
    fallback: Literal["larger", "deny"] = "larger"
    """When the smallest fitting profile is not advertised by any node:
    ``larger`` takes the smallest advertised one that fits, ``deny`` refuses."""


class GPUSharingPolicySpec(_Strict):
    mode: Mode = "shared"
    default_memory: MemoryQuantity | None = None
    min_memory: MemoryQuantity | None = None
    max_memory: MemoryQuantity | None = None
    mig: MigPolicy = Field(default_factory=MigPolicy)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    node_selector: dict[
        Annotated[str, Field(max_length=316, pattern=LABEL_KEY_PATTERN)],
        Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)],
    ] = Field(default_factory=dict, max_length=32)
    scheduler_name: str = Field(
        default=HEADROOM_SCHEDULER, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253
    )
    placement: Literal["binpack", "spread"] = "binpack"
    sharing: Literal["timeSlicing", "mps"] = "timeSlicing"
    env_hints: bool = False
    dry_run: bool = False
    multi_gpu: Literal["exclusive", "deny"] = Field(default="exclusive", alias="multiGPU")
    node_selector_conflict: Literal["warn", "deny"] = "warn"
    invalid_memory: Literal["deny", "warn"] = "deny"
    guard: Literal["off", "warn", "evict"] = "warn"
    allow_skip: bool = False
    foreign_schedulers: Literal["deny", "ignore"] = "deny"

    @model_validator(mode="after")
    def _default_within_max(self) -> "GPUSharingPolicySpec":
        default, limit = self.default_memory_bytes, self.max_memory_bytes
        if default is not None and limit is not None and default > limit:
            raise ValueError(
                f"defaultMemory {self.default_memory} is above maxMemory {self.max_memory}"
            )
        least = self.min_memory_bytes
        if least is not None and limit is not None and least > limit:
            raise ValueError(f"minMemory {self.min_memory} is above maxMemory {self.max_memory}")
        if least is not None and default is not None and default < least:
            raise ValueError(
                f"defaultMemory {self.default_memory} is below minMemory {self.min_memory}"
            )
        return self

    # Cached: a policy is parsed once per watch event and read on every admission.
    @cached_property
    def default_memory_bytes(self) -> int | None:
        return None if self.default_memory is None else parse_bytes(self.default_memory)

    @cached_property
    def min_memory_bytes(self) -> int | None:
        return None if self.min_memory is None else parse_bytes(self.min_memory)

    @cached_property
    def max_memory_bytes(self) -> int | None:
        return None if self.max_memory is None else parse_bytes(self.max_memory)


class PolicyMeta(BaseModel):
    """The part of ObjectMeta Headroom reads; the rest (uid, labels...) is ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class GPUSharingPolicy(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    api_version: Literal["headroom.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GPUSharingPolicy"]
    metadata: PolicyMeta
    spec: GPUSharingPolicySpec

    @property
    def name(self) -> str:
        return self.metadata.name


class PolicyError(ValueError):
    """A policy document that is not a valid GPUSharingPolicy; says where and why."""


def _explain(err: ValidationError) -> str:
    parts = []
    for problem in err.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in problem["loc"]) or "(document)"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


def parse_policy(obj: Any) -> GPUSharingPolicy:
    """Validate one policy object (a dict as the apiserver or YAML gives it)."""
    if not isinstance(obj, Mapping):
        raise PolicyError(f"a {POLICY_KIND} must be an object, got {type(obj).__name__}")
    name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    label = f"{POLICY_KIND} {name!r}" if isinstance(name, str) else POLICY_KIND
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != POLICY_KIND:
        raise PolicyError(
            f"expected apiVersion {API_VERSION} kind {POLICY_KIND}, "
            f"got {obj.get('apiVersion')!r} {obj.get('kind')!r}"
        )
    try:
        return GPUSharingPolicy.model_validate(obj)
    except ValidationError as err:
        raise PolicyError(f"{label}: {_explain(err)}") from err


def load_policies(text: str) -> list[GPUSharingPolicy]:
    """Every policy in a (multi-document) YAML text; a ``List`` of them works too."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        raise PolicyError(yaml_error(err)) from err
    policies = []
    for number, document in enumerate(_flatten(documents), start=1):
        try:
            policies.append(parse_policy(document))
        except PolicyError as err:
            raise PolicyError(f"document {number}: {err}") from err
    return policies


def yaml_error(err: yaml.YAMLError) -> str:
    """One line: what is wrong and where, not yaml's multi-line excerpt of the text."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is not None and problem:
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return "not valid YAML: " + " ".join(str(err).split())


def _flatten(documents: Iterable[Any]) -> Iterable[Any]:
    for document in documents:
        if isinstance(document, dict) and isinstance(document.get("items"), list):
            yield from document["items"]
        else:
            yield document


def index_policies(policies: Iterable[GPUSharingPolicy]) -> dict[str, GPUSharingPolicy]:
    """By name, refusing two policies with one name (which one applied would be luck)."""
    by_name: dict[str, GPUSharingPolicy] = {}
    for policy in policies:
        if policy.name in by_name:
            raise PolicyError(f"two {POLICY_KIND} objects are named {policy.name!r}")
        by_name[policy.name] = policy
    return by_name
