"""The fake nodes of the local cluster: specs from YAML, Node objects for kwok.

The defaults (``devcluster/data/nodes.yaml``) are the seed documents' nodes:
two time-sliced A100-PCIE-40GB (``nvidia.com/gpu.shared: 4``), one A100 in the
MIG ``3g.20gb-2x2g.10gb`` layout (strategy mixed), one time-sliced Tesla T4 and
one CPU-only node, with the labels GPU Feature Discovery sets and the GPU taint
``node-role.kubernetes.io/gpu=true:NoSchedule``. The file's header comment
documents the format; ``headroom cluster up --nodes FILE`` reads the same.
"""

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from headroom.names import GPU, GPU_SHARED, MIG_PREFIX
from headroom.quantity import QuantityError, parse_quantity

DEFAULT_NODES = Path(__file__).parent / "data" / "nodes.yaml"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok manages the nodes carrying ``kwok.x-k8s.io/node: fake`` (and no others)."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class NodesError(ValueError):
    """The node file is unreadable or invalid; the message names the field."""


def _stringify(value: Any) -> Any:
    # YAML reads `4` and `true` as numbers and booleans; labels and quantities are strings.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_stringify)]


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    value: Text = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_LABEL, max_length=63)
    labels: dict[str, Text] = Field(default_factory=dict)
    capacity: dict[str, Text]
    allocatable: dict[str, Text] | None = None
    taints: list[Taint] = Field(default_factory=list)

    def has_gpu(self) -> bool:
        """Advertises a GPU resource, so it gets an agent and GPU pods may land here."""
        return any(
            (name in (GPU, GPU_SHARED) or name.startswith(MIG_PREFIX)) and _positive(value)
            for name, value in self.capacity.items()
        )

    def to_object(self) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                # ttl 0: the kubelet-less node has no node-status cache to tune.
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": [t.model_dump() for t in self.taints]},
            "status": {
                "capacity": dict(self.capacity),
                "allocatable": dict(self.allocatable or self.capacity),
            },
        }


def _positive(value: str) -> bool:
    try:
        return parse_quantity(value) > 0
    except QuantityError:
        return False


class NodeFile(BaseModel):
    # Extra top-level keys are allowed: they hold the YAML anchors the nodes share.
    model_config = ConfigDict(extra="allow")

    nodes: list[NodeSpec] = Field(min_length=1)


def load(path: Path | None = None) -> list[NodeSpec]:
    """The nodes in ``path`` (default: the seeds' nodes); names must be unique."""
    path = path or DEFAULT_NODES
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise NodesError(f"cannot read node file {path}: {err}") from err
    try:
        specs = NodeFile.model_validate(document).nodes
    except ValidationError as err:
        raise NodesError(f"invalid node file {path}: {err}") from err
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise NodesError(f"invalid node file {path}: duplicate node names {duplicates}")
    for spec in specs:
        for resource, value in {**spec.capacity, **(spec.allocatable or {})}.items():
            try:
                parse_quantity(value)
            except QuantityError as err:
                raise NodesError(
                    f"invalid node file {path}: node {spec.name} {resource}={value!r}: {err}"
                ) from err
    return specs


def mig_resources(specs: list[NodeSpec]) -> list[str]:
    """Every ``nvidia.com/mig-*`` resource some node advertises, sorted."""
    return sorted({name for spec in specs for name in spec.capacity if name.startswith(MIG_PREFIX)})
