"""Priority preemption per GPU (issue 7 §4), through the real kube-scheduler's preemption.

One A100-40GB (39.5 GiB after the margin, four slots) holds three priority-low
pods declaring 10 GiB each: ``keep`` (a PodDisruptionBudget forbids evicting
it), ``leaky`` (PriorityClass value 10, and the node agent measures it holding
18 GiB) and ``plain`` (priority 0). A priority-100000 pod declaring 16 GiB
arrives. By the node-level ``headroom.dev/gpu-memory`` alone kube-scheduler's
preemption evicts only ``plain`` (the least important pod; 19.5 GiB declared
free), but the GPU would then have 11.5 GiB measured free, so without the
extender's ``preempt`` verb the high-priority pod stayed Pending for good
("expected at least one victim pod" on the next attempt). The extender adds
``leaky`` and spares ``keep``.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import GIB, eventually, gpu_pod, pods

NODE = "a100-shared-1"
HIGH, LOW = "e2e-gpu-high", "e2e-gpu-low"


@pytest.fixture
def priority_classes(cluster: Cluster) -> Iterator[None]:
    classes = [
        {"metadata": {"name": HIGH}, "value": 100000},
        {"metadata": {"name": LOW}, "value": 10},
    ]
    for spec in classes:
        obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", **spec}
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj), check=False)
    yield
    cluster.kubectl("delete", "priorityclass", HIGH, LOW, "--wait=false", check=False)


def pinned(
    namespace: str,
    name: str,
    memory: str,
    *,
    priority_class: str | None = None,
    uses: str | None = None,
) -> dict[str, Any]:
    pod = gpu_pod(namespace, name, memory=memory, labels={"app": name})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    if priority_class:
        pod["spec"]["priorityClassName"] = priority_class
    if uses:
        usage = {"pattern": "steady", "base": uses, "amplitude": "0"}
        pod["metadata"]["annotations"][names.ANNOTATION_SIMULATED_USAGE] = json.dumps(usage)
    return pod


def phases(cluster: Cluster, namespace: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: (p["spec"].get("nodeName") or "Pending")
        + ("/deleting" if p["metadata"].get("deletionTimestamp") else "")
        for p in pods(cluster, namespace)
    }


def events(cluster: Cluster, namespace: str, reason: str) -> dict[str, str]:
    items = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", f"reason={reason}"
    )["items"]
    return {e["involvedObject"]["name"]: e.get("message", "") for e in items}


def measured_on_node(cluster: Cluster) -> int:
    report = cluster.kubectl_json("get", names.REPORT_PLURAL, NODE)
    return sum(pod["usedBytes"] for gpu in report["status"]["gpus"] for pod in gpu.get("pods", []))


def test_preemption_frees_one_gpu_by_memory_and_respects_a_pdb(
    cluster: Cluster, namespace: NamespaceFactory, priority_classes: None
) -> None:
    ns = namespace("gpu-shared")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "keep"}}},
    }
    cluster.apply([budget])
    for pod in (
        pinned(ns, "keep", "10Gi"),
        pinned(ns, "leaky", "10Gi", priority_class=LOW, uses="18Gi"),
        pinned(ns, "plain", "10Gi"),
    ):
        cluster.apply([pod])
    eventually(
        "keep, leaky and plain bound to " + NODE,
        lambda: (
            all(v == NODE for v in phases(cluster, ns).values()) and len(phases(cluster, ns)) == 3
        ),
        timeout=120,
    )
    eventually(
        "the agent measuring leaky's 18 GiB",
        lambda: measured_on_node(cluster) >= 38 * GIB,
        timeout=90,
    )
    eventually(
        "the PDB forbidding any disruption",
        lambda: (
            cluster.kubectl_json("get", "pdb", "keep", "-n", ns)
            .get("status", {})
            .get("disruptionsAllowed")
            == 0
            and cluster.kubectl_json("get", "pdb", "keep", "-n", ns)["status"].get("currentHealthy")
            == 1
        ),
        timeout=60,
    )

    cluster.apply([pinned(ns, "urgent", "16Gi", priority_class=HIGH)])
    eventually(
        "urgent bound to " + NODE,
        lambda: phases(cluster, ns).get("urgent") == NODE,
        timeout=180,
        explain=lambda: (
            f"pods {phases(cluster, ns)}; "
            f"FailedScheduling {events(cluster, ns, 'FailedScheduling')}"
        ),
    )
    left = phases(cluster, ns)
    assert left.get("keep") == NODE, left  # the PDB's pod was spared
    assert "plain" not in left, left
    assert "leaky" not in left, left
    preempted = events(cluster, ns, "Preempted")
    assert set(preempted) == {"plain", "leaky"}, preempted
    assert all(NODE in message for message in preempted.values()), preempted
    # ... and the preemptor is told which pods make room for it, and why.
    eventually(
        "a GPUMemoryPreemption Event on urgent",
        lambda: "urgent" in events(cluster, ns, "GPUMemoryPreemption"),
        timeout=30,
    )
    told = events(cluster, ns, "GPUMemoryPreemption")["urgent"]
    assert f"{ns}/plain" in told, told
    assert f"{ns}/leaky" in told, told
    assert "16.0 GiB" in told, told
    # Nothing over-committed on the GPU by declarations: keep 10 + urgent 16 of 39.5.
    declared = {
        p["metadata"]["name"]: p["spec"]["containers"][0]["resources"]["limits"][names.GPU_MEMORY]
        for p in pods(cluster, ns)
    }
    assert declared == {"keep": "10Gi", "urgent": "16Gi"}, declared
