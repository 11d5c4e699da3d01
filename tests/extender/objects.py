"""Nodes, pods and GPUNodeReports as the apiserver serves them, for extender tests."""

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from headroom import names
from headroom.reports import GPUUsage, PodUsage, ReportStatus, report_object

Object = dict[str, Any]
A100_40GB = "NVIDIA-A100-PCIE-40GB"
A100_MIB = 40960
GIB = 2**30
EPOCH = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def gpu_node(
    name: str,
    *,
    gpus: int = 1,
    memory_mib: int = A100_MIB,
    product: str = A100_40GB,
    replicas: int = 4,
    mig: Mapping[str, int] | None = None,
) -> Object:
    """A node as GPU Feature Discovery and the device plugin label it (time-slicing or MIG)."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        names.LABEL_COUNT: str(gpus),
        names.LABEL_MEMORY_MIB: str(memory_mib),
        names.LABEL_PRODUCT: product + ("-SHARED" if replicas > 1 and not mig else ""),
        names.LABEL_REPLICAS: str(replicas),
        names.LABEL_SHARING_STRATEGY: "time-slicing" if replicas > 1 and not mig else "none",
    }
    capacity = {"cpu": "32", "memory": "263767936Ki", "pods": "110"}
    if mig:
        labels[names.LABEL_MIG_STRATEGY] = "mixed"
        for profile, count in mig.items():
            resource = names.mig_resource(profile)
            capacity[resource] = str(count)
            labels[f"{resource}.count"] = str(count)
    else:
        capacity[names.GPU_SHARED] = str(gpus * replicas)
    return {
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": "1001",
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2025-06-01T12:00:00Z",
                    "lastTransitionTime": "2025-06-01T10:00:00Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "nodeInfo": {"kubeletVersion": "v1.34.4", "architecture": "amd64"},
        },
    }


def gpu_pod(
    name: str,
    *,
    namespace: str = "research",
    node: str = "",
    declared: str | None = "10Gi",
    shared: int = 1,
    mig: str | None = None,
    placement: str | None = "binpack",
    phase: str = "Pending",
    uid: str | None = None,
) -> Object:
    """A pod as the webhook leaves it: shared (or MIG) resource, a shared pod's declared
    ``headroom.dev/gpu-memory`` resource, and the explanatory annotations."""
    annotations: dict[str, str] = {}
    if declared is not None:
        annotations[names.ANNOTATION_DECLARED_MEMORY] = declared
        annotations[names.ANNOTATION_MODE] = "mig" if mig else "shared"
    if placement is not None:
        annotations[names.ANNOTATION_PLACEMENT] = placement
    limits: dict[str, str] = {}
    if mig:
        limits[names.mig_resource(mig)] = "1"
        annotations[names.ANNOTATION_MIG_PROFILE] = mig
    elif shared:
        limits[names.GPU_SHARED] = str(shared)
        if declared is not None:
            limits[names.GPU_MEMORY] = declared
    spec: Object = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/cuda:12",
                "resources": {"limits": limits, "requests": dict(limits)},
            }
        ],
        "schedulerName": names.HEADROOM_SCHEDULER,
        "restartPolicy": "Always",
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
            "resourceVersion": "2001",
            "creationTimestamp": "2025-06-01T12:00:00Z",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase, "qosClass": "BestEffort"},
    }


def stopped(pod: Object) -> Object:
    """The pod as kubelet leaves it before its deletion completes: every container
    reported terminated, so it holds none of its GPU any more."""
    statuses = [
        {"name": c.get("name", ""), "state": {"terminated": {"exitCode": 0}}}
        for c in pod["spec"].get("containers", [])
    ]
    return {**pod, "status": {**pod.get("status", {}), "containerStatuses": statuses}}


def uid_of(pod: Object) -> str:
    return str(pod["metadata"]["uid"])


def gpu_report(
    node: str,
    usage: Mapping[int, Mapping[str, int]],
    *,
    total_mib: int = A100_MIB,
    unattributed: Mapping[int, int] | None = None,
    at: datetime = EPOCH,
    age: float = 0.0,
    numa: Mapping[int, int] | None = None,
) -> Object:
    """A GPUNodeReport: per GPU index, pod UID -> bytes used (and its NUMA node)."""
    gpus = [
        GPUUsage(
            index=index,
            uuid=f"GPU-{node}-{index}",
            product=A100_40GB,
            total_bytes=total_mib * 2**20,
            used_bytes=sum(pods.values()) + (unattributed or {}).get(index, 0),
            free_bytes=max(total_mib * 2**20 - sum(pods.values()), 0),
            pods=[PodUsage(uid=uid, used_bytes=used) for uid, used in pods.items()],
            unattributed_bytes=(unattributed or {}).get(index, 0),
            numa_node=(numa or {}).get(index),
        )
        for index, pods in usage.items()
    ]
    status = ReportStatus(
        node_name=node, backend="simulated", observed_at=at - timedelta(seconds=age), gpus=gpus
    )
    return report_object(status)
