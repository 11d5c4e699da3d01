"""The GPUs a simulated node has: from ``--sim-gpus`` or the Node's labels.

GPU Feature Discovery labels a GPU node with ``nvidia.com/gpu.count``,
``nvidia.com/gpu.memory`` (MiB per GPU) and ``nvidia.com/gpu.product``; under
MIG strategy ``mixed`` the node's capacity lists ``nvidia.com/mig-<profile>``
and a ``nvidia.com/mig-<profile>.memory`` label gives each profile's MiB. The
KWOK nodes of the local cluster carry the same labels, so the simulation sees
the GPUs the scheduler sees. MIG strategy ``single`` is simulated as whole GPUs.

A simulated GPU's UUID is derived from the node's name and the GPU's index
(:func:`simulated_gpu_uuid`), so it is the same after a restart, and the test
device plugin of the local cluster's real node (``devcluster``), standing in
for NVIDIA's, advertises replicas of the very GPUs this backend simulates.
"""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.probe import ProbeUnavailable
from headroom import names
from headroom.mig import MigOffer
from headroom.quantity import MIB, QuantityError, parse_bytes

SIMULATED_UUID_NAMESPACE = uuid.UUID("6f1c8a2e-3b4d-5e6f-8a9b-0c1d2e3f4a5b")
"""The uuid5 namespace of every simulated device UUID; changing it renames them all."""


def simulated_gpu_uuid(node: str, index: int) -> str:
    """``GPU-<uuid>`` of simulated GPU ``index`` on ``node``, as NVML would spell a real one."""
    return f"GPU-{uuid.uuid5(SIMULATED_UUID_NAMESPACE, f'{node}/{index}')}"


def simulated_mig_uuid(node: str, index: int, profile: str, instance: int) -> str:
    """``MIG-<uuid>`` of simulated MIG device ``instance`` of ``profile`` on GPU ``index``."""
    return f"MIG-{uuid.uuid5(SIMULATED_UUID_NAMESPACE, f'{node}/{index}/{profile}/{instance}')}"


@dataclass(frozen=True)
class GPUSpec:
    count: int
    memory_bytes: int
    product: str = "NVIDIA-SIMULATED"
    mig: tuple[tuple[str, int, int], ...] = ()
    """(profile, memory bytes, instances on the node), spread over the GPUs."""


def parse_gpu_spec(text: str) -> GPUSpec:
    """``2x40Gi`` or ``1x80Gi:NVIDIA-H100-80GB-HBM3``: count, memory per GPU, product."""
    shape, _, product = text.partition(":")
    count_text, sep, memory_text = shape.partition("x")
    try:
        count = int(count_text)
        memory = parse_bytes(memory_text)
    except (ValueError, QuantityError) as err:
        raise ValueError(
            f"GPU spec {text!r}: expected COUNTxMEMORY[:PRODUCT], e.g. 1x40Gi"
        ) from err
    if not sep or not 1 <= count <= 64 or memory <= 0:
        raise ValueError(f"GPU spec {text!r}: expected 1..64 GPUs of positive memory, e.g. 1x40Gi")
    return GPUSpec(count, memory, product or GPUSpec.product)


def spec_from_node(node: Mapping[str, Any]) -> GPUSpec:
    """The GPUs a Node's GFD labels and capacity describe."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    name = metadata.get("name", "")
    capacity = (node.get("status") or {}).get("capacity") or {}
    offer = MigOffer.from_nodes([node])
    try:
        count = int(labels.get(names.LABEL_COUNT) or capacity.get(names.GPU) or 0)
        memory_mib = int(labels.get(names.LABEL_MEMORY_MIB) or 0)
    except ValueError as err:
        raise ProbeUnavailable("BadGPULabels", f"node {name}: GPU labels: {err}") from err
    if count <= 0 and offer.profiles:
        count = 1
    if count <= 0 or memory_mib <= 0:
        raise ProbeUnavailable(
            "NoGPULabels",
            f"node {name} has no {names.LABEL_COUNT} / {names.LABEL_MEMORY_MIB} labels to "
            "simulate GPUs from (or pass --sim-gpus)",
        )
    mig = tuple((p.name, p.memory_mib * MIB, p.instances) for p in offer.profiles.values())
    return GPUSpec(count, memory_mib * MIB, str(labels.get(names.LABEL_PRODUCT) or "GPU"), mig)
