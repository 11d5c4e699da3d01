"""A node's GPUs as the cluster describes them: GPU Feature Discovery labels and capacity.

This is the fallback view the accounting uses when the node agent's report is
missing or stale, and the inventory of MIG slices either way. Labels are read
defensively: a label that is absent or not a number is noted in ``problems``
and the conservative value is used instead (one GPU, zero memory), because a
node whose GPUs we cannot describe must not look roomy.

Two sources count a node's shared GPUs: GFD's ``nvidia.com/gpu.count`` label
and the device plugin's ``nvidia.com/gpu.shared`` capacity divided by
``nvidia.com/gpu.replicas``. They can disagree for a while (GFD relabelling, an
admin's edit). Neither wins: every GPU either shows is kept and charged
(``count``), so that no measured GPU is dropped, and only the GPUs both show
are counted on (``confirmed``), so that a phantom GPU adds no room.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from headroom import names
from headroom.mig import memory_mib, profile_from_resource
from headroom.quantity import MIB

_MIG_MEMORY_LABEL = re.compile(r"^nvidia\.com/mig-(?P<resource>.+)\.memory$")
_SHARED_SUFFIX = "-SHARED"


@dataclass(frozen=True)
class MigSlices:
    """One MIG profile a node advertises (``nvidia.com/mig-<profile>`` capacity)."""

    profile: str
    capacity: int
    memory_bytes: int


@dataclass(frozen=True)
class NodeGPUs:
    name: str
    product: str = ""
    """``nvidia.com/gpu.product`` without GFD's ``-SHARED`` suffix."""
    count: int = 0
    """GPUs the label or the device plugin's capacity shows, the more of the two."""
    confirmed: int = 0
    """GPUs both show (the fewer): what the multi-GPU spread bound and the advertised
    capacity count on (headroom.spread, headroom.capacity); 0 counts on none."""
    counted: bool = True
    """False where :attr:`confirmed` is a stand-in: GFD's count label missing, or
    disagreeing with the capacity (as a node joins, or while a GPU is lost)."""
    memory_bytes: int = 0
    """Per GPU, from ``nvidia.com/gpu.memory`` (MiB); 0 when the label is unusable."""
    replicas: int = 1
    shared_capacity: int = 0
    """Capacity of ``nvidia.com/gpu.shared`` (GPUs x replicas)."""
    replicas_per_gpu: int | None = None
    """The replicas the device plugin gives each GPU, where GFD's count and replicas
    labels and the device plugin's capacity agree exactly on a node without MIG: no GPU
    holds more pods than that at once (headroom.spread). None: not known for sure."""
    mig: Mapping[str, MigSlices] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    """Why a value above is a conservative stand-in, for filter reasons and ``top``."""


def parse_node(node: Mapping[str, Any]) -> NodeGPUs:
    """A Node object (JSON dict) -> its GPUs; never raises on a malformed node."""
    metadata = _mapping(node, "metadata")
    name = metadata.get("name")
    labels = {k: v for k, v in _mapping(metadata, "labels").items() if isinstance(v, str)}
    capacity = _mapping(_mapping(node, "status"), "capacity")
    problems: list[str] = []

    product = labels.get(names.LABEL_PRODUCT, "")
    product = product.removesuffix(_SHARED_SUFFIX)
    shared = _count(capacity.get(names.GPU_SHARED))
    labelled_replicas = _count(labels.get(names.LABEL_REPLICAS))
    replicas = labelled_replicas or 1

    labelled = _count(labels.get(names.LABEL_COUNT))
    # Without the replicas label the capacity says replicas, not GPUs.
    offered = -(-shared // labelled_replicas) if labelled_replicas else 0
    count = max(labelled, offered)
    confirmed = min(labelled, offered) or count
    mig = _mig_slices(capacity, labels)
    counted = True
    if not labelled and count:
        # One source only, and one a wrong replicas label skews: charged on every GPU
        # it shows, counted on one, as with no figure at all.
        confirmed, counted = 1, False
        problems.append(
            f"label {names.LABEL_COUNT} missing or not a number; charging the {count} "
            f"GPUs {names.GPU_SHARED} capacity shows, counting on 1"
        )
    elif offered and labelled != offered and not (mig and offered < labelled):
        # (With MIG strategy mixed the label also counts the GPUs in MIG mode.)
        counted = False
        problems.append(
            f"label {names.LABEL_COUNT}={labelled} but {names.GPU_SHARED} capacity shows "
            f"{offered} GPUs: charging {count}, counting on {confirmed}"
        )
    if not count and (shared or names.GPU_SHARED in capacity):
        # One GPU is the conservative guess: every pod is then charged to it.
        count = confirmed = 1
        counted = False
        problems.append(f"label {names.LABEL_COUNT} missing or not a number; assuming 1 GPU")

    # Two components, GFD and the device plugin, agreeing exactly on every GPU.
    consistent = labelled_replicas and labelled and not mig and not problems
    per_gpu = labelled_replicas if consistent and labelled * labelled_replicas == shared else None

    memory = _count(labels.get(names.LABEL_MEMORY_MIB)) * MIB
    if count and not memory:
        problems.append(f"label {names.LABEL_MEMORY_MIB} missing or not a number")

    return NodeGPUs(
        name=name if isinstance(name, str) else "",
        product=product,
        count=count,
        confirmed=confirmed,
        counted=counted,
        memory_bytes=memory,
        replicas=replicas,
        shared_capacity=shared,
        replicas_per_gpu=per_gpu,
        mig=mig,
        problems=tuple(problems),
    )


def _mig_slices(capacity: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, MigSlices]:
    advertised: dict[str, int] = {}
    for key, value in labels.items():
        match = _MIG_MEMORY_LABEL.match(key)
        profile = profile_from_resource(names.MIG_PREFIX + match["resource"]) if match else None
        if profile is not None and _count(value):
            advertised[profile] = _count(value)
    slices: dict[str, MigSlices] = {}
    for resource, amount in capacity.items():
        profile = profile_from_resource(resource)
        count = _count(amount)
        if profile is None or not count:
            continue
        mib = advertised.get(profile) or memory_mib(profile)
        slices[profile] = MigSlices(profile, count, mib * MIB)
    return slices


def _mapping(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _count(value: object) -> int:
    """A whole, non-negative count as labels and capacity spell it; 0 otherwise."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        return int(value)
    return 0
