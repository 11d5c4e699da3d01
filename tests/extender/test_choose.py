"""Filter choosing the node (``Extender(choose=True)``, the service's default): one node
back for a GPU pod, the one prioritize would score highest, so kube-scheduler neither
scores nor calls prioritize; every node that fits for a pod with soft preferences."""

from typing import Any

import pytest

from extender.verbs import Extender
from extender.wire import ExtenderArgs, ExtenderBindingArgs, HostPriorityList
from tests.extender.conftest import Harness
from tests.extender.objects import gpu_node, gpu_pod

NODES = ["empty", "half", "most", "full"]


@pytest.fixture
def chooser(harness: Harness) -> Extender:
    """gpu nodes holding 0, 20, 28 and 36 GiB of declared memory (40 GiB GPUs)."""
    for name, used in (("empty", 0), ("half", 20), ("most", 28), ("full", 36)):
        harness.state.on_node("ADDED", gpu_node(name))
        if used:
            harness.state.on_pod("ADDED", gpu_pod(f"p-{name}", node=name, declared=f"{used}Gi"))
    harness.extender.choose = True
    return harness.extender


def args(pod: dict[str, Any], nodes: list[str] = NODES) -> ExtenderArgs:
    return ExtenderArgs(Pod=pod, NodeNames=nodes)


def prioritized(extender: Extender, pod: dict[str, Any], nodes: list[str]) -> list[str]:
    """Every node with the best score prioritize gives."""
    scores = HostPriorityList.validate_json(extender.prioritize(args(pod, nodes)))
    best = max(s.Score for s in scores)
    return [s.Host for s in scores if s.Score == best]


def test_binpack_gets_the_fullest_node_that_fits(chooser: Extender) -> None:
    pod = gpu_pod("new", declared="8Gi")
    best = prioritized(chooser, pod, NODES)  # before the filter holds the pod

    result = chooser.filter(args(pod))

    assert result.NodeNames == ["most"]
    assert "most" in best
    # The nodes not chosen are left out, not refused: only refusals name a reason.
    assert set(result.FailedNodes) == {"full"}


def test_spread_gets_the_emptiest_node(chooser: Extender) -> None:
    pod = gpu_pod("new", declared="8Gi", placement="spread")
    best = prioritized(chooser, pod, NODES)

    result = chooser.filter(args(pod))

    assert result.NodeNames == ["empty"]
    assert "empty" in best


def test_the_choice_is_exact_where_prioritize_rounds_to_a_tie(harness: Harness) -> None:
    # 8 GiB and 8.5 GiB left on two 40 GiB GPUs: prioritize scores both 10 for binpack.
    for name, used in (("a", "23.5Gi"), ("b", "23Gi")):
        harness.state.on_node("ADDED", gpu_node(name))
        harness.state.on_pod("ADDED", gpu_pod(f"p-{name}", node=name, declared=used))
    harness.extender.choose = True
    pod = gpu_pod("new", declared="8Gi")

    assert prioritized(harness.extender, pod, ["b", "a"]) == ["b", "a"]
    assert harness.extender.filter(args(pod, ["b", "a"])).NodeNames == ["a"]


def test_a_node_the_pod_already_holds_is_chosen_again(harness: Harness, chooser: Extender) -> None:
    pod = gpu_pod("retried", declared="8Gi")
    harness.state.on_pod("ADDED", pod)
    claim = harness.state.lookup(pod["metadata"]["uid"], "research", "retried")
    assert claim is not None
    assert harness.state.assume(claim, "half").fits  # an earlier bind that may have landed

    assert chooser.filter(args(pod)).NodeNames == ["half"]


@pytest.mark.parametrize(
    "spec",
    [
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}},
        {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}},
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                        "whenUnsatisfiable": "ScheduleAnyway"}]},
    ],
    ids=["preferred-node-affinity", "preferred-pod-anti-affinity", "schedule-anyway-spread"],
)  # fmt: skip
def test_a_pod_with_soft_preferences_gets_every_node_that_fits(
    chooser: Extender, spec: dict[str, Any]
) -> None:
    pod = gpu_pod("picky", declared="8Gi")
    pod["spec"].update(spec)

    assert chooser.filter(args(pod)).NodeNames == ["empty", "half", "most"]


def test_a_hard_spread_constraint_is_kube_schedulers_filter_and_changes_nothing(
    chooser: Extender,
) -> None:
    pod = gpu_pod("strict", declared="8Gi")
    pod["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]

    assert chooser.filter(args(pod)).NodeNames == ["most"]


def test_without_choose_every_node_that_fits_is_answered(harness: Harness) -> None:
    for name in NODES[:2]:
        harness.state.on_node("ADDED", gpu_node(name))
    assert harness.extender.choose is False  # the class default; the service turns it on

    assert harness.extender.filter(args(gpu_pod("new"), NODES[:2])).NodeNames == NODES[:2]


@pytest.mark.parametrize(
    "spec",
    [{"affinity": "x"}, {"affinity": {"nodeAffinity": []}}, {"topologySpreadConstraints": {}}],
    ids=["affinity-not-an-object", "node-affinity-not-an-object", "constraints-not-a-list"],
)
def test_odd_shapes_where_preferences_live_are_no_preference(
    chooser: Extender, spec: dict[str, Any]
) -> None:
    pod = gpu_pod("odd", declared="8Gi")
    pod["spec"].update(spec)

    result = chooser.filter(args(pod))

    assert (result.Error, result.NodeNames) == ("", ["most"])


def test_the_chosen_node_holds_the_pod_until_its_bind(harness: Harness, chooser: Extender) -> None:
    """kube-scheduler filters the next pod before it binds this one: the hold is what
    keeps the next pod off room this one is about to take."""
    first, second = gpu_pod("first", declared="8Gi"), gpu_pod("second", declared="8Gi")
    for pod in (first, second):
        harness.state.on_pod("ADDED", pod)

    assert chooser.filter(args(first)).NodeNames == ["most"]
    assert set(harness.state.assumed[first["metadata"]["uid"]]) == {"most"}
    # 28 + 8 GiB on "most" leaves less than 8 GiB: the second pod goes to "half".
    assert chooser.filter(args(second)).NodeNames == ["half"]


async def test_the_bind_to_the_chosen_node_goes_through_and_the_watch_ends_the_hold(
    harness: Harness, chooser: Extender
) -> None:
    pod = gpu_pod("bound", declared="8Gi")
    harness.state.on_pod("ADDED", pod)
    uid = pod["metadata"]["uid"]
    assert chooser.filter(args(pod)).NodeNames == ["most"]

    result = await chooser.bind(
        ExtenderBindingArgs(PodName="bound", PodNamespace="research", PodUID=uid, Node="most")
    )

    assert result.Error == ""
    assert harness.binder.calls == [("research", "bound", uid, "most")]
    harness.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "most"}})
    assert harness.state.assumed == {}


async def test_a_hold_made_at_filter_is_released_by_a_read_that_finds_the_pod_unbound(
    harness: Harness, chooser: Extender
) -> None:
    """kube-scheduler may never bind a pod it filtered (a later plugin refused it)."""
    pod = gpu_pod("dropped", declared="8Gi")
    harness.state.on_pod("ADDED", pod)
    harness.reader.put(pod)
    chooser.filter(args(pod))
    assert pod["metadata"]["uid"] in harness.state.assumed

    assert await chooser.verify_due() == 0  # not on a timer, and not before it is due
    harness.clock.now += harness.state.verify_after + 1
    assert await chooser.verify_due() == 1

    assert harness.state.assumed == {}


def test_a_pod_with_soft_preferences_is_not_held_anywhere(
    harness: Harness, chooser: Extender
) -> None:
    pod = gpu_pod("picky", declared="8Gi")
    pod["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ]
    harness.state.on_pod("ADDED", pod)

    chooser.filter(args(pod))

    assert harness.state.assumed == {}


async def test_a_pod_held_at_filter_and_offered_elsewhere_is_charged_once_and_bound_there(
    harness: Harness, chooser: Extender
) -> None:
    """The storm: kube-scheduler's own filters drop the held node on a retry. The answer
    is another node, not held a second time while the first hold may still be a bind
    in flight; the bind there reads the pod unbound, lands, and ends the first hold."""
    pod = gpu_pod("moved", declared="8Gi")
    harness.state.on_pod("ADDED", pod)
    harness.reader.put(pod)
    uid = pod["metadata"]["uid"]
    assert chooser.filter(args(pod)).NodeNames == ["most"]

    assert chooser.filter(args(pod, ["empty", "half"])).NodeNames == ["half"]
    assert set(harness.state.assumed[uid]) == {"most"}

    result = await chooser.bind(
        ExtenderBindingArgs(PodName="moved", PodNamespace="research", PodUID=uid, Node="half")
    )
    assert result.Error == ""
    assert harness.binder.calls == [("research", "moved", uid, "half")]
    assert set(harness.state.assumed[uid]) == {"half"}


async def test_a_bind_that_times_out_keeps_the_filters_hold(
    harness: Harness, chooser: Extender
) -> None:
    """The storm: no answer from the apiserver may mean the binding landed. The room
    stays taken, the next pod goes elsewhere, and a read that fails releases nothing."""
    first, second = gpu_pod("slow", declared="8Gi"), gpu_pod("next", declared="8Gi")
    for pod in (first, second):
        harness.state.on_pod("ADDED", pod)
        harness.reader.put(pod)
    uid = first["metadata"]["uid"]
    assert chooser.filter(args(first)).NodeNames == ["most"]
    harness.binder.fail_with, harness.binder.uncertain = "read timeout", True

    result = await chooser.bind(
        ExtenderBindingArgs(PodName="slow", PodNamespace="research", PodUID=uid, Node="most")
    )

    assert "read timeout" in result.Error
    assert set(harness.state.assumed[uid]) == {"most"}
    assert chooser.filter(args(second)).NodeNames == ["half"]
    harness.reader.fail = True
    harness.clock.now += harness.state.verify_after + 1
    assert await chooser.verify_due() == 0
    assert set(harness.state.assumed[uid]) == {"most"}


def test_a_filter_body_cannot_shrink_a_known_pods_declaration(
    harness: Harness, chooser: Extender
) -> None:
    # The pod watch saw the pod declare 10Gi; a request body naming its UID with
    # 1Mi (forged, or a copy that disagrees) is not read for the figures, so the
    # pod is not chosen onto the 4 GiB left on "full".
    pod = gpu_pod("known", declared="10Gi")
    harness.state.on_pod("ADDED", pod)
    forged = gpu_pod("known", declared="1Mi", uid=pod["metadata"]["uid"])

    result = chooser.filter(args(forged))

    assert result.NodeNames == ["most"]
    assert "full" in result.FailedNodes
    held = harness.state.assumed[pod["metadata"]["uid"]]["most"][0]
    assert held.declared == 10 * 2**30
