"""Room kube-scheduler's preemption freed for a nominated pod is kept for it.

kube-scheduler nominates a preemptor to the node whose victims it deleted
(``status.nominatedNodeName``) and, filtering any other pod of no higher
priority, counts the nominated pod as if it ran there (``addGENominatedPods`` in
pkg/scheduler/framework/runtime/framework.go: nominated pods of priority >= the
pod's, not the pod itself). It does so with its own plugins only: on a node of
several GPUs the node-level ``headroom.dev/gpu-memory`` still has room for both,
while no GPU has. The extender's filter must keep that room too, or a pod of
lower priority takes it, the preemptor preempts again, and so on.
"""

from typing import Any

from extender.preemption import Budgets
from extender.verbs import Extender
from extender.wire import ExtenderArgs
from tests.extender.conftest import Harness
from tests.extender.objects import gpu_node, gpu_pod, uid_of
from tests.extender.test_server import post


def pod(name: str, declared: str, priority: int, nominated: str = "") -> dict[str, Any]:
    made = gpu_pod(name, declared=declared)
    made["spec"]["priority"] = priority
    if nominated:
        made["status"]["nominatedNodeName"] = nominated
    return made


def filtered(
    extender: Extender, made: dict[str, Any], nodes: list[str]
) -> tuple[list[str], dict[str, str]]:
    result = extender.filter(ExtenderArgs(Pod=made, NodeNames=nodes))
    return list(result.NodeNames or []), dict(result.FailedNodes or {})


def test_a_lower_priority_pod_does_not_take_the_room_kept_for_a_nominated_preemptor(
    harness: Harness,
) -> None:
    # Two 40 GiB GPUs, the victims gone: node-level room for 30 + 20 GiB (80 GiB), but
    # wherever the device plugin puts the preemptor, its GPU has 9.5 GiB left.
    harness.state.on_node("ADDED", gpu_node("n", gpus=2))
    preemptor = pod("urgent", "30Gi", 1000, nominated="n")
    harness.state.on_pod("ADDED", preemptor)

    passed, failed = filtered(harness.extender, pod("batch", "20Gi", 0), ["n"])

    assert passed == []
    assert "research/urgent" in failed["n"], failed
    # The preemptor itself still fits where its room was made.
    assert filtered(harness.extender, preemptor, ["n"])[0] == ["n"]


def test_a_pod_of_equal_priority_waits_too_and_a_higher_one_does_not(harness: Harness) -> None:
    harness.state.on_node("ADDED", gpu_node("n", gpus=2))
    harness.state.on_pod("ADDED", pod("urgent", "30Gi", 1000, nominated="n"))

    assert filtered(harness.extender, pod("peer", "20Gi", 1000), ["n"])[0] == []
    assert filtered(harness.extender, pod("boss", "20Gi", 2000), ["n"])[0] == ["n"]


def test_the_room_is_let_go_once_the_preemptor_is_bound_or_gone(harness: Harness) -> None:
    harness.state.on_node("ADDED", gpu_node("n", gpus=2))
    harness.state.on_node("ADDED", gpu_node("m", gpus=2))
    urgent = pod("urgent", "30Gi", 1000, nominated="n")
    harness.state.on_pod("ADDED", urgent)
    assert filtered(harness.extender, pod("batch", "12Gi", 0), ["n"])[0] == []

    # Bound elsewhere: charged there, and no longer kept room for on n.
    harness.state.on_pod("MODIFIED", {**urgent, "spec": {**urgent["spec"], "nodeName": "m"}})
    assert filtered(harness.extender, pod("batch", "12Gi", 0), ["n"])[0] == ["n"]

    again = pod("urgent2", "30Gi", 1000, nominated="n")
    harness.state.on_pod("ADDED", again)
    assert filtered(harness.extender, pod("batch", "12Gi", 0), ["n"])[0] == []
    harness.state.on_pod("DELETED", again)
    assert filtered(harness.extender, pod("batch", "12Gi", 0), ["n"])[0] == ["n"]


async def test_preemption_frees_room_beside_a_preemptor_nominated_ahead(harness: Harness) -> None:
    # kube-scheduler picks victims with the nominated pods of no lower priority on the
    # node (SelectVictimsOnNode, through RunFilterPluginsWithNominatedPods): victims
    # that make room only in the GPU kept for one of them would be evicted for nothing.
    harness.extender.budgets = Budgets()
    harness.state.on_node("ADDED", gpu_node("n", gpus=2))
    low = gpu_pod("low", node="n", declared="20Gi", phase="Running")
    harness.state.on_pod("ADDED", low)
    harness.state.on_pod("ADDED", pod("first", "30Gi", 2000, nominated="n"))
    second = pod("second", "15Gi", 1000)

    status, result = await post(
        harness,
        "preempt",
        {
            "Pod": second,
            "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": uid_of(low)}], "NumPDBViolations": 0}},
        },
    )

    assert status == 200, result
    assert not result.get("NodeNameToMetaVictims"), result
