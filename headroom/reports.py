"""GPUNodeReport: what a node agent measured, as the extender reads it.

One cluster-scoped object per node (name = node name), written only by that
node's agent. The model is versioned (``schemaVersion``) and shared by both
sides so that neither parses the other's strings.

The models are pydantic dataclasses with slots, validated like models: the
extender keeps the last report of every node, and a pydantic ``BaseModel``
carries a ``__dict__`` and a set of the fields given for each GPU and pod,
~1.5 KiB per GPU (issue 8: 5,000 eight-GPU reports were 42 MiB of its heap;
as slotted dataclasses, with repeated strings interned, ~9). Copies are
``dataclasses.replace``; :func:`parse_report` and :func:`report_object` read
and write the wire form.
"""

import sys
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, computed_field
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass

from headroom.names import API_VERSION, REPORT_KIND
from headroom.podspec import MAX_GPU_COUNT

SCHEMA_VERSION = 1
"""Bumped only when a field changes meaning, so that a reader must not trust what it
would misread: readers fall back to declarations on any other version. A field
added with a default that means "as before" (``PodUsage.allocated``,
``PodUsage.replicas``) is no bump:
an older extender ignores it, a newer one reads an older report as before."""
MAX_GPU_INDEX = 1023
"""No node has more GPUs; a report giving a larger index is unreadable (and then
never vouches for its node), rather than making every account of the node, and
the NUMA groups kept for it, as large as the index (a review's case)."""


MAX_REPLICAS = MAX_GPU_COUNT
"""The most replicas of one GPU a report counts for one pod: the most a pod may ask
for (headroom.podspec); a larger count makes the report unreadable."""


_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
"""Every report model: camelCase on the wire, unknown fields ignored (and keyword
arguments only, slots: ``@dataclass(config=_CONFIG, slots=True, kw_only=True)``)."""

Shared = Annotated[str, AfterValidator(sys.intern)]
"""A string many GPUs or pods repeat (a product, a namespace): one copy in memory."""


@dataclass(config=_CONFIG, slots=True, kw_only=True)
class PodUsage:
    """GPU memory one pod's processes hold on one GPU (or MIG device)."""

    uid: str
    namespace: Shared = ""
    name: str = ""
    containers: list[str] = Field(default_factory=list)
    used_bytes: int = Field(ge=0)
    starved_bytes: int | None = Field(default=None, ge=0)
    """Simulated backend only: memory the pod asked for and the full GPU refused
    (what real CUDA reports as out-of-memory). Absent from NVML reports."""
    allocated: bool = False
    """kubelet allocated this GPU (or one of its replicas) to the pod, per PodResources
    (the simulated backend: its stand-in device plugin did): listed even at 0 bytes."""
    replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    """How many of this GPU's time-slicing (or MPS) replicas kubelet allocated the pod,
    per PodResources (distinct ``<GPU-uuid>::<n>`` IDs over its containers); None: not
    counted (an agent older than this field, the simulated backend's own placement, a
    whole GPU, a MIG device). None as before: no schema bump. With the counts of every
    GPU it is allocated, the extender locates a pod of several replicas
    (headroom.accounting.placed)."""


@dataclass(config=_CONFIG, slots=True, kw_only=True)
class MigDeviceUsage:
    uuid: str
    profile: Shared = ""
    total_bytes: int = Field(ge=0)
    used_bytes: int = Field(ge=0)
    pods: list[PodUsage] = Field(default_factory=list)


@dataclass(config=_CONFIG, slots=True, kw_only=True)
class GPUUsage:
    index: int = Field(ge=0, le=MAX_GPU_INDEX)
    uuid: str
    product: Shared = ""
    total_bytes: int = Field(ge=0)
    used_bytes: int = Field(ge=0)
    free_bytes: int = Field(ge=0)
    mig_enabled: bool = False
    mig_devices: list[MigDeviceUsage] = Field(default_factory=list)
    pods: list[PodUsage] = Field(default_factory=list)
    unattributed_bytes: int = Field(default=0, ge=0)
    """Memory NVML sees in use that belongs to no pod the agent knows."""
    numa_node: int | None = Field(default=None, ge=0, le=1023)
    """The GPU's NUMA node as the NVIDIA device plugin reports it to kubelet (sysfs
    ``numa_node`` of its PCI device); None: none, or not read. kubelet's Topology
    Manager (any policy but ``none``) offers the plugin only one NUMA node's GPUs
    (headroom.spread)."""
    unlisted_replicas: int = Field(default=0, ge=0)
    """Time-slicing replicas of this GPU kubelet allocated that the device plugin no
    longer lists (its replicas were cut on a live node; agent.allocations): the
    plugin's balance counts their pods nowhere, so a reader must not bound where
    unlocated pods go by it. 0 as before: no schema bump."""
    error: str = ""
    """Why NVML could not read this GPU now (or, with NVML unavailable, the node).
    Its figures are then the last the agent read (zero if none): evidence to
    charge, not a measurement. They used to be zeros; a reader that ignores them
    charges what it did then, so this is no schema bump."""


@dataclass(config=_CONFIG, slots=True, kw_only=True)
class Condition:
    type: Shared
    status: Literal["True", "False", "Unknown"]
    reason: Shared = ""
    message: Shared = ""
    last_transition_time: datetime | None = None


@dataclass(config=_CONFIG, slots=True, kw_only=True)
class ReportStatus:
    schema_version: int = SCHEMA_VERSION
    node_name: str
    backend: Literal["nvml", "simulated"]
    observed_at: datetime
    """When the agent began the reads behind this report: no figure in it is older."""
    gpus: list[GPUUsage] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    heartbeat_seconds: int | None = Field(default=None, ge=1)
    """The agent rewrites the report at least this often, changed or not; a
    reader may call a report older than a few heartbeats stale."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_count(self) -> int:
        """Written for ``kubectl get gpunodereports``; ignored when read back."""
        return len(self.gpus)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def age_seconds(self, now: datetime | None = None) -> float:
        return ((now or datetime.now(UTC)) - self.observed_at).total_seconds()


CONDITION_NVML_AVAILABLE = "NVMLAvailable"


_STATUS = TypeAdapter(ReportStatus)


def report_object(status: ReportStatus) -> dict[str, object]:
    """The whole Kubernetes object the agent writes for its node."""
    return {
        "apiVersion": API_VERSION,
        "kind": REPORT_KIND,
        "metadata": {"name": status.node_name},
        "status": _STATUS.dump_python(status, mode="json", by_alias=True, exclude_none=True),
    }


def parse_report(obj: dict[str, object]) -> ReportStatus:
    """The status of a GPUNodeReport object; raises pydantic.ValidationError."""
    return _STATUS.validate_python(obj.get("status") or {})
