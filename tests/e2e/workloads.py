"""Objects the e2e tests create, and how they read the cluster back."""

import json
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from devcluster.cluster import Cluster
from devcluster.kubectl import wait_until
from headroom import names
from headroom.claims import parse_claim

MIB = 1024**2
GIB = 1024**3


def gpu_container(name: str = "main", gpus: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.example/cuda-app:1",
        "resources": {"limits": {names.GPU: str(gpus)}},
    }


def gpu_pod(
    namespace: str, name: str, *, memory: str | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    annotations = {names.ANNOTATION_GPU_MEMORY: memory} if memory else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations,
            "labels": labels or {},
        },
        "spec": {"containers": [gpu_container()]},
    }


def gpu_deployment(
    namespace: str,
    name: str,
    *,
    replicas: int,
    memory: str,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {"containers": [gpu_container()]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {names.ANNOTATION_GPU_MEMORY: memory},
                },
                "spec": spec,
            },
        },
    }


def pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return items


def running(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in items if p.get("status", {}).get("phase") == "Running"]


def unscheduled(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in items if not p["spec"].get("nodeName")]


def failed_scheduling(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Pod name -> the latest FailedScheduling message in ``namespace``."""
    events = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", "reason=FailedScheduling"
    )["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return {e["involvedObject"]["name"]: e["message"] for e in events}


def declared_by_node(cluster: Cluster) -> dict[str, int]:
    """Node -> bytes declared by the live shared pods bound to it (all namespaces).

    Read from the pods' ``headroom.dev/gpu-memory`` resources, the immutable
    declaration, as kubelet and quota see it -- never from Headroom's state."""
    totals: dict[str, int] = {}
    for pod in cluster.kubectl_json("get", "pods", "-A")["items"]:
        claim = parse_claim(pod)
        if claim.node and claim.declared and not claim.terminated:
            totals[claim.node] = totals.get(claim.node, 0) + claim.declared
    return totals


def node_memory(cluster: Cluster) -> dict[str, int]:
    """Node -> GPU memory per GPU (bytes) from the GFD label, for GPU nodes."""
    result = {}
    for node in cluster.kubectl_json("get", "nodes")["items"]:
        label = node["metadata"]["labels"].get(names.LABEL_MEMORY_MIB)
        if label:
            result[node["metadata"]["name"]] = int(label) * MIB
    return result


def eventually(
    description: str,
    check: Callable[[], bool],
    *,
    timeout: float = 60,
    interval: float = 0.5,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll ``check()`` until true; a timeout fails the test, naming ``description``
    and, with ``explain``, the state that kept it from becoming true."""
    try:
        wait_until(description, check, timeout=timeout, interval=interval)
    except TimeoutError as err:
        detail = f"\n{explain()}" if explain else ""
        raise AssertionError(f"{err}{detail}") from None


def placement(cluster: Cluster, namespace: str) -> str:
    """Where the namespace's pods are, and why the others wait: for failure messages."""
    items = pods(cluster, namespace)
    by_node: dict[str, int] = {}
    for pod in running(items):
        by_node[pod["spec"]["nodeName"]] = by_node.get(pod["spec"]["nodeName"], 0) + 1
    reasons = failed_scheduling(cluster, namespace)
    waiting = sorted(
        {reasons.get(p["metadata"]["name"], "no event yet") for p in unscheduled(items)}
    )
    lines = [f"{len(items)} pods, Running per node: {by_node}"]
    lines += [f"  pending because: {reason}" for reason in waiting[:5]]
    return "\n".join(lines)


def settle(cluster: Cluster, namespace: str, *, total: int, timeout: float = 120) -> None:
    """Until ``total`` pods exist, and each is Running, or unbound with a FailedScheduling event.

    A bound pod that is not Running yet is not settled, whatever events it has:
    a pod refused once may be bound a moment later, when room frees up.
    """

    def settled() -> bool:
        items = pods(cluster, namespace)
        if len(items) < total:
            return False
        if any(p["spec"].get("nodeName") and p["status"].get("phase") != "Running" for p in items):
            return False
        waiting = {p["metadata"]["name"] for p in unscheduled(items)}
        return waiting <= set(failed_scheduling(cluster, namespace))

    eventually(
        f"{total} pods in {namespace} Running or FailedScheduling",
        settled,
        timeout=timeout,
        explain=lambda: placement(cluster, namespace),
    )


def extender_state(cluster: Cluster) -> dict[str, Any]:
    """The extender's /state: its accounting, node by node."""
    url = f"http://127.0.0.1:{cluster.ports['extender']}/state"
    with urllib.request.urlopen(url, timeout=10) as response:
        state: dict[str, Any] = json.load(response)
    return state


def charged(cluster: Cluster, nodes: Iterable[str]) -> dict[str, int]:
    """Node -> bytes the extender still charges on its GPUs (declared or measured), or
    holds for binds it has not seen land; only the nodes that are not idle."""
    state = extender_state(cluster)
    held = {node for holds in state["assumed"].values() for node in holds}
    result = {}
    for node in nodes:
        gpus = state["nodes"].get(node, {}).get("gpus", [])
        total = sum(gpu["accounted"] for gpu in gpus)
        if total or node in held or any(gpu["pods"] for gpu in gpus):
            result[node] = total
    return result


def wait_idle(cluster: Cluster, nodes: Iterable[str], *, timeout: float = 90) -> None:
    """Until the extender charges nothing on ``nodes``: earlier tests' pods, deleted,
    keep counting until the agent reports them gone (charge more, never less)."""
    nodes = list(nodes)
    eventually(
        f"the extender to charge nothing on {', '.join(nodes)}",
        lambda: not charged(cluster, nodes),
        timeout=timeout,
        explain=lambda: f"still charged (bytes): {charged(cluster, nodes)}",
    )


def legacy_pod(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """A shared pod as 0.1 admitted it: ``nvidia.com/gpu.shared`` and an annotation only."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {names.ANNOTATION_DECLARED_MEMORY: "1Mi"},
        },
        "spec": {
            "schedulerName": names.HEADROOM_SCHEDULER,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {names.GPU_SHARED: "1"}}}
            ],
            **spec,
        },
    }
