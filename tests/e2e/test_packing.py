"""An 8-GPU server packed by memory (issue 8 §1), with the simulated agent locating pods.

A KWOK node with eight A100-40GB (four time-slicing replicas each: 32 slots)
is added through the API with its own simulated agent, which places pods as
the NVIDIA device plugin's distributed policy does. 32 pods declaring 8 GiB
fit exactly: four per GPU. Headroom 0.1 charged every unlocated pod to all
eight GPUs, so four pods took the node and the other 28 waited for pods to be
located one refusal and one flush at a time; now unlocated pods are charged
where the device plugin can have put them (headroom.spread) and located ones
where they are.
"""

from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import nodes
from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import (
    GIB,
    eventually,
    failed_scheduling,
    gpu_deployment,
    placement,
    pods,
    running,
)

NODE = "a100x8-e2e"
TAINT = "headroom.dev/e2e-eight-gpus"


@pytest.fixture
def eight_gpus(cluster: Cluster) -> Iterator[str]:
    template = next(spec for spec in nodes.load() if spec.name == "a100-shared-0")
    labels = {**template.labels, names.LABEL_COUNT: "8"}
    capacity = {**template.capacity, names.GPU_SHARED: "32", "cpu": "256", "memory": "2Ti"}
    spec = nodes.NodeSpec(
        name=NODE,
        labels=labels,
        capacity=capacity,
        taints=[nodes.Taint(key=TAINT, value="true", effect="NoSchedule")],
    )
    cluster.add_node(spec)
    eventually(
        f"a GPUNodeReport for {NODE}",
        lambda: cluster.kubectl("get", names.REPORT_PLURAL, NODE, check=False).returncode == 0,
        timeout=60,
    )
    yield NODE
    cluster.remove_node(NODE)


def test_an_eight_gpu_node_takes_four_8gi_pods_per_gpu(
    cluster: Cluster, eight_gpus: str, namespace: NamespaceFactory
) -> None:
    # (eight_gpus before namespace: the node outlives the namespace's pods.)
    ns = namespace("gpu-shared")
    deployment = gpu_deployment(
        ns, "packed", replicas=32, memory="8Gi", node_selector={"kubernetes.io/hostname": NODE}
    )
    template = deployment["spec"]["template"]["spec"]
    template["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    cluster.apply([deployment])
    eventually(
        "32 pods Running on the 8-GPU node",
        lambda: len(running(pods(cluster, ns))) == 32,
        timeout=150,
        explain=lambda: placement(cluster, ns),
    )
    # Where the agent (as the device plugin would) put them: four per GPU, none
    # starved, no GPU holding more than 40 GiB less the margin.

    def per_gpu() -> dict[int, list[dict[str, Any]]]:
        report = cluster.kubectl_json("get", names.REPORT_PLURAL, NODE)["status"]
        return {gpu["index"]: gpu.get("pods", []) for gpu in report["gpus"]}

    eventually(
        "the agent's report showing 32 pods",
        lambda: sum(len(held) for held in per_gpu().values()) == 32,
        timeout=60,
    )
    held_by = per_gpu()
    assert sorted(len(held) for held in held_by.values()) == [4] * 8, held_by
    for held in held_by.values():
        assert sum(p["usedBytes"] for p in held) <= 40 * GIB - 512 * 2**20
        assert not any(p.get("starvedBytes") for p in held), held
    # A 33rd pod finds no room (slots and memory are both spent).
    more = gpu_deployment(
        ns, "one-more", replicas=1, memory="8Gi", node_selector={"kubernetes.io/hostname": NODE}
    )
    more["spec"]["template"]["spec"]["tolerations"] = template["tolerations"]
    cluster.apply([more])
    eventually(
        "a FailedScheduling event for the 33rd pod",
        lambda: any(name.startswith("one-more") for name in failed_scheduling(cluster, ns)),
        timeout=60,
    )
    assert len(running(pods(cluster, ns))) == 32
