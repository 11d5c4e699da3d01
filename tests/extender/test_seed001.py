"""Seed 001 end to end through the extender's HTTP verbs.

The pods are the scenario's Deployments as Headroom's webhook rewrites them
(``headroom.mutation.decide``, the webhook's own code); GPU memory comes from
their simulated usage patterns (``agent.usage``, what the simulated agent runs),
published as GPUNodeReports. Two time-sliced A100 40GB nodes, binpack.

gpu-a already runs the *before* notebook, left over from stock time-slicing: no
declaration, leaking. Headroom places the simulation and the inference service
(binpack: both on gpu-a, where declarations fit), then keeps the third pod, the
notebook, off gpu-a, whose GPU the leak has nearly filled, and binds it to gpu-b.
"""

import copy
from typing import Any

import jsonpatch

from agent.usage import parse_usage
from devcluster import scenario
from headroom import names
from headroom.mutation import decide
from headroom.policy import index_policies, parse_policy
from tests.extender.conftest import Harness
from tests.extender.objects import GIB, gpu_node, gpu_report, uid_of
from tests.extender.test_server import post

NAMESPACE = "seed001"
NODES = ["gpu-a", "gpu-b"]
SPIKE_AT = 5.0
"""Seconds into the phase: the inference service spikes, the simulation is near its peak."""


def mutated_pod(deployment: dict[str, Any], policy_name: str, policy: Any) -> dict[str, Any]:
    template = copy.deepcopy(deployment["spec"]["template"])
    name = deployment["metadata"]["name"]
    template["metadata"].update(
        name=f"{name}-0", namespace=NAMESPACE, uid=f"uid-{name}", generateName=f"{name}-"
    )
    pod = {"apiVersion": "v1", "kind": "Pod", **template, "status": {"phase": "Pending"}}
    decision = decide(
        pod,
        namespace=NAMESPACE,
        namespace_labels={names.LABEL_POLICY: policy_name},
        policies=index_policies([policy]),
    )
    assert decision.outcome == "mutated", decision.message
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, decision.patch)
    return patched


def demand(pod: dict[str, Any], seconds: float) -> int:
    usage = parse_usage(pod["metadata"]["annotations"][names.ANNOTATION_SIMULATED_USAGE])
    return usage.demand(seconds)


async def schedule(h: Harness, pod: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """What kube-scheduler does with the extender: filter, prioritize, bind the best."""
    args = {"Pod": pod, "Nodes": None, "NodeNames": NODES}
    _, filtered = await post(h, "filter", args)
    assert filtered["Error"] == ""
    feasible = filtered["NodeNames"]
    assert feasible, filtered["FailedNodes"]
    _, scores = await post(h, "prioritize", {**args, "NodeNames": feasible})
    best = max(scores, key=lambda s: s["Score"])["Host"]  # ties: first, as listed
    meta = pod["metadata"]
    bind = {"PodName": meta["name"], "PodNamespace": NAMESPACE, "PodUID": meta["uid"], "Node": best}
    _, bound = await post(h, "bind", bind)
    assert bound == {"Error": ""}
    h.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": best}})
    return best, filtered["FailedNodes"]


async def test_notebook_is_kept_off_the_gpu_the_leak_has_filled(harness: Harness) -> None:
    loaded = scenario.load()
    policy = parse_policy(loaded.policy)
    pods = {
        d["metadata"]["name"]: mutated_pod(d, loaded.policy_name, policy)
        for d in loaded.deployments
    }
    assert {
        p["metadata"]["annotations"][names.ANNOTATION_DECLARED_MEMORY] for p in pods.values()
    } == {
        "10Gi",
        "6Gi",
    }
    for node in NODES:
        harness.state.on_node("ADDED", gpu_node(node))
    (leftover,) = (
        d
        for d in scenario.before_deployments(loaded, NAMESPACE, node="gpu-a")
        if d["metadata"]["name"] == loaded.leaker
    )
    before = {
        "metadata": {
            **leftover["spec"]["template"]["metadata"],
            "name": "before-notebook",
            "namespace": NAMESPACE,
            "uid": "uid-before-notebook",
        },
        "spec": leftover["spec"]["template"]["spec"],
        "status": {"phase": "Running"},
    }
    before["spec"]["nodeName"] = "gpu-a"
    # Declared like the notebook after Headroom (6Gi), so what counts is its observed leak;
    # undeclared it would be a legacy pod, charged the whole GPU.
    for container in before["spec"]["containers"]:
        for section in ("limits", "requests"):
            container["resources"].setdefault(section, {})[names.GPU_MEMORY] = "6Gi"
    harness.state.on_pod("ADDED", before)
    harness.state.on_report("ADDED", gpu_report("gpu-a", {0: {uid_of(before): demand(before, 2)}}))
    harness.state.on_report("ADDED", gpu_report("gpu-b", {0: {}}))

    assert (await schedule(harness, pods["simulation"]))[0] == "gpu-a"
    assert (await schedule(harness, pods["inference"]))[0] == "gpu-a"

    # The agent's next report: the inference spike, the simulation near its peak, the leak.
    running = {"simulation": SPIKE_AT, "inference": SPIKE_AT}
    used = {uid_of(pods[name]): demand(pods[name], t) for name, t in running.items()}
    used[uid_of(before)] = demand(before, SPIKE_AT + 4)
    assert used[uid_of(pods["inference"])] == 10 * GIB
    harness.state.on_report("MODIFIED", gpu_report("gpu-a", {0: used}))

    node, failed = await schedule(harness, pods["notebook"])
    assert node == "gpu-b"
    assert failed["gpu-a"].startswith("gpu 0 NVIDIA-A100-PCIE-40GB: 3.1 GiB headroom < 6.0 GiB")

    # Declarations alone would put it on gpu-a and starve the GPU: the report matters, and
    # losing it (agent gone, report deleted) must not forget the leak it showed.
    harness.state.on_report("DELETED", gpu_report("gpu-a", {}))
    account = harness.state.account("gpu-a")
    assert account is not None
    assert account.source == "declarations"
    assert account.shared_headroom < 6 * GIB
