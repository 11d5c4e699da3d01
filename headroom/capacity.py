"""The ``headroom.dev/gpu-memory`` capacity a node should advertise.

Declared GPU memory is an extended resource (:data:`headroom.names.GPU_MEMORY`),
so a node must advertise how much of it it has for kube-scheduler's
NodeResourcesFit, its preemption, ResourceQuota's view and kubelet's admission
to count it. A node's capacity is the sum over its shared GPUs of the memory
each has (GPU Feature Discovery's ``nvidia.com/gpu.memory``) less the
extender's margin: the node-level form of the promise
``sum(declared) <= total - margin`` that the extender keeps per GPU.

A node counts as shared when the device plugin advertises
``nvidia.com/gpu.shared``. Its GPUs are those both the ``nvidia.com/gpu.count``
label and that capacity show (:attr:`headroom.nodes.NodeGPUs.confirmed`): a
label raised above the GPUs the device plugin has adds no room, and on a node
that also runs MIG (strategy mixed), whose label counts the MIG GPUs too, the
figure is what shared pods may use. The per-GPU fit is the extender's. A node
without shared GPUs advertises none, and one whose device plugin offers none
for now keeps what it advertised (:func:`capacity_patch`).
"""

from collections.abc import Mapping
from typing import Any

from headroom import names
from headroom.nodes import NodeGPUs
from headroom.quantity import QuantityError, format_bytes, parse_bytes


def desired_capacity(node: NodeGPUs, margin: int) -> int:
    """Bytes of ``headroom.dev/gpu-memory`` ``node`` should advertise (0: none)."""
    if node.shared_capacity <= 0 or node.confirmed <= 0 or node.memory_bytes <= margin:
        return 0
    return node.confirmed * (node.memory_bytes - margin)


def advertised(node: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(capacity, allocatable) of ``headroom.dev/gpu-memory`` in the Node's status;
    None where absent or unreadable."""
    status = node.get("status")
    status = status if isinstance(status, Mapping) else {}
    return _read(status.get("capacity")), _read(status.get("allocatable"))


def capacity_patch(node: Mapping[str, Any], node_gpus: NodeGPUs, margin: int) -> dict[str, Any]:
    """The merge patch that makes the Node advertise what it should; {} if it does.

    Nothing while the device plugin offers no shared GPU: kubelet reports its
    resource as 0 after every restart until the plugin registers again
    (pkg/kubelet/cm/devicemanager/manager.go), and re-admits the running pods
    meanwhile. Lowered to 0 then, this resource would fail every running shared
    pod (``OutOfheadroom.dev/gpu-memory``; only an absent resource is forgiven).
    A value left on a node that stopped sharing is harmless: no pod can use it
    without a ``nvidia.com/gpu.shared`` slot beside it.
    """
    if node_gpus.shared_capacity <= 0:
        return {}
    want = desired_capacity(node_gpus, margin)
    capacity, allocatable = advertised(node)
    if want == 0 and capacity in (None, 0) and allocatable in (None, 0):
        return {}
    if capacity == want and allocatable == want:
        return {}
    value = format_bytes(want)
    return {
        "status": {"capacity": {names.GPU_MEMORY: value}, "allocatable": {names.GPU_MEMORY: value}}
    }


def _read(resources: object) -> int | None:
    if not isinstance(resources, Mapping):
        return None
    value = resources.get(names.GPU_MEMORY)
    if not isinstance(value, str):
        return None
    try:
        return parse_bytes(value)
    except QuantityError:
        return None
