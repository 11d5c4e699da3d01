"""Every name Headroom reads or writes on Kubernetes objects, in one place."""

from typing import Final

GROUP: Final = "headroom.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Resources advertised by the NVIDIA device plugin.
GPU: Final = "nvidia.com/gpu"
GPU_SHARED: Final = "nvidia.com/gpu.shared"
MIG_PREFIX: Final = "nvidia.com/mig-"

# Headroom's own extended resource (issue 7): the GPU memory a container
# declares, in bytes, written by the webhook into requests and limits (equal,
# as for every extended resource) and advertised by the extender as node
# capacity: the sum over the node's shared GPUs of (memory per GPU - margin).
# Pod resources are immutable, so the declaration cannot be patched after
# admission, and ResourceQuota, kube-scheduler's NodeResourcesFit and
# preemption, and kubelet's admission all see it. Same spelling as the user's
# annotation on purpose: "declare headroom.dev/gpu-memory: 10Gi" either way.
GPU_MEMORY: Final = "headroom.dev/gpu-memory"

# Labels set by GPU Feature Discovery.
LABEL_PRODUCT: Final = "nvidia.com/gpu.product"
LABEL_MEMORY_MIB: Final = "nvidia.com/gpu.memory"
LABEL_COUNT: Final = "nvidia.com/gpu.count"
LABEL_REPLICAS: Final = "nvidia.com/gpu.replicas"
LABEL_SHARING_STRATEGY: Final = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_CAPABLE: Final = "nvidia.com/mig.capable"
LABEL_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"

# Headroom's own labels and annotations.
LABEL_POLICY: Final = "headroom.dev/policy"
"""Namespace label naming the GPUSharingPolicy that applies to its pods."""
LABEL_EXEMPT: Final = "headroom.dev/exempt"
"""Namespace label, set by cluster admins only: ``"true"`` exempts the namespace from
Headroom's ValidatingAdmissionPolicies (stock time-slicing stays possible there; the
extender charges such undeclared shared pods the whole GPU)."""
LABEL_SKIP: Final = "headroom.dev/skip"
"""Pod label; ``"true"`` opts the pod out of mutation."""
ANNOTATION_GPU_MEMORY: Final = "headroom.dev/gpu-memory"
"""User input: GPU memory each GPU container declares (per GPU)."""
ANNOTATION_GPU_MEMORY_CONTAINER_PREFIX: Final = "headroom.dev/gpu-memory."
"""User input: per-container override, ``headroom.dev/gpu-memory.<container>``."""

# Written by the webhook as explanations. Only placement is read back (the
# extender's choice between binpack and spread, a preference); nothing is charged
# or guarded by them, since a tenant may patch a pod's annotations.
ANNOTATION_POLICY: Final = "headroom.dev/policy"
"""The policy that decided this pod."""
ANNOTATION_MODE: Final = "headroom.dev/mode"
"""``shared``, ``mig`` or ``exclusive``: what the webhook turned the request into."""
ANNOTATION_DECLARED_MEMORY: Final = "headroom.dev/declared-memory"
"""Bytes (as a quantity) the pod may hold on one GPU: the sum over its GPU
containers, because the device plugin may give every replica the same GPU."""
ANNOTATION_PLACEMENT: Final = "headroom.dev/placement"
"""``binpack`` or ``spread``, from the policy, for the extender's prioritize."""
ANNOTATION_MIG_PROFILE: Final = "headroom.dev/mig-profile"
"""The MIG profile chosen for a ``mig`` pod."""

DEFAULT_SCHEDULER: Final = "default-scheduler"
HEADROOM_SCHEDULER: Final = "headroom-scheduler"

# Custom resources.
POLICY_PLURAL: Final = "gpusharingpolicies"
POLICY_KIND: Final = "GPUSharingPolicy"
REPORT_PLURAL: Final = "gpunodereports"
REPORT_KIND: Final = "GPUNodeReport"


def mig_resource(profile: str) -> str:
    """``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me`` (the device plugin's spelling)."""
    return MIG_PREFIX + profile.replace("+", ".")


def is_time_sliced(name: str) -> bool:
    """A time-sliced replica the device plugin renamed (``renameByDefault``): of a whole
    GPU, ``nvidia.com/gpu.shared``, or of a MIG slice, ``nvidia.com/mig-1g.10gb.shared``."""
    return name == GPU_SHARED or (name.startswith(MIG_PREFIX) and name.endswith(".shared"))


def is_gpu_resource(name: str) -> bool:
    return name in (GPU, GPU_SHARED) or name.startswith(MIG_PREFIX)


ANNOTATION_SIMULATED_USAGE: Final = "sim.headroom.dev/usage"
"""Simulated backend only: a JSON usage pattern for the pod (steady, spiky, leak);
the demo and the local cluster use it to make fake GPUs behave like seed 001."""

EVENT_REASON_OVER_MEMORY: Final = "GPUMemoryOverDeclared"
"""Event the agent's guard records on a pod using more GPU memory than it declared."""

AGENT_USER: Final = "system:serviceaccount:headroom-system:headroom-agent"
"""The node agent's ServiceAccount as a user name: its evictions are checked
against the node its token is bound to (webhook.eviction)."""
