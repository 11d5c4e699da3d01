"""The preempt verb's answer as kube-scheduler 1.34 reads it: victims most important first
(``pickOneNodeForPreemption`` takes the first as the highest), none for a preemptor the
filter refuses everywhere, and a preemptor asking a shared slot besides a MIG slice
checked as a shared one."""

from typing import Any

import pytest

from extender.preemption import HORIZON_SECONDS, Budgets, preempt
from extender.state import ClusterState
from extender.wire import ExtenderPreemptionArgs, MetaPod, MetaVictims
from headroom import names
from headroom.claims import parse_claim
from tests.extender.conftest import MARGIN, Clock, Harness
from tests.extender.objects import GIB, gpu_node, gpu_pod, gpu_report, stopped, uid_of
from tests.extender.test_preemption import HIGH, ask, keep_budget, preemptor, resident
from tests.extender.test_server import post
from tests.extender.test_spread_unknown import iso
from tests.extender.test_spread_unknown import report as allocated_report


@pytest.fixture
def budgets_harness(harness: Harness) -> Harness:
    harness.extender.budgets = Budgets()
    return harness


def _priorities(h: Harness, result: dict[str, Any], node: str) -> list[int]:
    return [h.state.pods[p["UID"]].priority for p in result["NodeNameToMetaVictims"][node]["Pods"]]


async def test_victims_are_answered_most_important_first(budgets_harness: Harness) -> None:
    # kube-scheduler's pickOneNodeForPreemption (pkg/scheduler/framework/preemption)
    # reads a node's highest-priority victim as Pods[0]: "It assumes pods in each map
    # entry are ordered by decreasing priority". gpu-a: kube-scheduler names plain
    # (priority 0) and the verb adds leaky (priority 50) after it; gpu-b: kube-scheduler
    # names mid (priority 10), which suffices. Read as Pods[0], gpu-a's highest victim
    # is 0 < 10, so kube-scheduler picks gpu-a and evicts a priority-50 pod where one of
    # priority 10 would have done.
    h = budgets_harness
    for name in ("gpu-a", "gpu-b"):
        h.state.on_node("ADDED", gpu_node(name))
    keep = resident("keep", "gpu-a", "10Gi")
    leaky = resident("leaky", "gpu-a", "10Gi", priority=50)
    plain = resident("plain", "gpu-a", "10Gi")
    mid = resident("mid", "gpu-b", "30Gi", priority=10)
    for pod in (keep, leaky, plain, mid):
        h.state.on_pod("ADDED", pod)
    used = {uid_of(keep): 10 * GIB, uid_of(leaky): 18 * GIB, uid_of(plain): 10 * GIB}
    h.state.on_report("ADDED", gpu_report("gpu-a", {0: used}))
    h.state.on_report("ADDED", gpu_report("gpu-b", {0: {uid_of(mid): GIB}}))
    keep_budget(h)
    proposed = {"gpu-a": [uid_of(plain)], "gpu-b": [uid_of(mid)]}
    status, result = await post(h, "preempt", ask(preemptor(), proposed))
    assert status == 200, result
    assert set(result["NodeNameToMetaVictims"]) == {"gpu-a", "gpu-b"}
    for node in ("gpu-a", "gpu-b"):
        priorities = _priorities(h, result, node)
        assert priorities == sorted(priorities, reverse=True), (node, priorities)


def _legacy_preemptor() -> dict[str, Any]:
    pod = gpu_pod("urgent", declared=None)  # gpu.shared, no headroom.dev/gpu-memory
    pod["spec"]["priority"] = HIGH
    return pod


async def test_a_preemptor_the_filter_never_admits_gets_no_victims(
    budgets_harness: Harness,
) -> None:
    # A legacy pod (gpu.shared without headroom.dev/gpu-memory: admitted by 0.1, or in
    # a headroom.dev/exempt namespace) is refused by the filter on every node as a
    # *resolvable* failure, so kube-scheduler runs preemption there. The verb hands
    # back kube-scheduler's victims unchecked: they are evicted, and the preemptor is
    # refused again once they are gone -- then preempts on the next node, and so on.
    h = budgets_harness
    h.state.on_node("ADDED", gpu_node("gpu-a"))
    plain = resident("plain", "gpu-a", "10Gi")
    h.state.on_pod("ADDED", plain)
    urgent = _legacy_preemptor()
    assert parse_claim(urgent).legacy
    status, result = await post(h, "preempt", ask(urgent, {"gpu-a": [uid_of(plain)]}))
    assert status == 200, result
    # Even with the victim gone the filter refuses it: no victim can help.
    h.state.on_pod("DELETED", stopped(plain))
    assert not h.state.fit(parse_claim(urgent), "gpu-a").fits
    assert not result.get("NodeNameToMetaVictims"), result


def _mixed_node(name: str) -> dict[str, Any]:
    # Strategy mixed: GPU 0 time-sliced (4 replicas), GPU 1 in MIG mode.
    node = gpu_node(name, gpus=2, replicas=4)
    node["status"]["capacity"][names.GPU_SHARED] = "4"
    node["status"]["capacity"][names.mig_resource("1g.5gb")] = "1"
    node["metadata"]["labels"][f"{names.mig_resource('1g.5gb')}.count"] = "1"
    node["status"]["allocatable"] = dict(node["status"]["capacity"])
    return node


def _mixed_preemptor() -> dict[str, Any]:
    # One container on a shared slot (16 GiB declared), one on a MIG slice.
    pod = preemptor("16Gi")
    side = {
        "name": "side",
        "image": "registry.example/cuda:12",
        "resources": {
            "limits": {names.mig_resource("1g.5gb"): "1"},
            "requests": {names.mig_resource("1g.5gb"): "1"},
        },
    }
    pod["spec"]["containers"].append(side)
    return pod


async def test_a_preemptor_asking_shared_and_mig_gets_victims_that_free_its_gpu(
    budgets_harness: Harness,
) -> None:
    # The e2e case (leaky holds 18 GiB measured on 10 declared) on a mixed node, with a
    # preemptor that also asks a MIG slice. kube-scheduler names plain (frees the
    # node-level declared sum) and m (the only 1g.5gb slice); the verb kept them as a
    # MIG preemptor's, yet without leaky the shared GPU has 11.5 GiB for 16 declared:
    # both evicted for nothing, the preemptor refused on this node.
    h = budgets_harness
    h.state.on_node("ADDED", _mixed_node("gpu-m"))
    keep = resident("keep", "gpu-m", "10Gi")
    leaky = resident("leaky", "gpu-m", "10Gi", priority=10)
    plain = resident("plain", "gpu-m", "10Gi")
    m = gpu_pod("m", node="gpu-m", declared=None, mig="1g.5gb", phase="Running")
    for pod in (keep, leaky, plain, m):
        h.state.on_pod("ADDED", pod)
    used = {uid_of(keep): 10 * GIB, uid_of(leaky): 18 * GIB, uid_of(plain): 10 * GIB}
    report = gpu_report("gpu-m", {0: used, 1: {}})
    report["status"]["gpus"][1]["migEnabled"] = True
    h.state.on_report("ADDED", report)
    keep_budget(h)
    urgent = _mixed_preemptor()
    claim = parse_claim(urgent)
    assert claim.shared == 1
    assert claim.mig == {"1g.5gb": 1}
    proposed = {"gpu-m": [uid_of(plain), uid_of(m)]}
    status, result = await post(h, "preempt", ask(urgent, proposed))
    assert status == 200, result
    kept = result.get("NodeNameToMetaVictims", {}).get("gpu-m")
    assert kept is not None, result
    victims = {p["UID"] for p in kept["Pods"]}
    assert h.state.fit(claim, "gpu-m", gone=victims).fits, victims


def test_an_added_pod_never_goes_ahead_of_a_victim_this_cache_does_not_know(
    budgets_harness: Harness,
) -> None:
    # kube-scheduler may name a pod the GPU cache does not hold (no GPU resource): its
    # priority is unknown here, so an added pod stays behind it, ahead of the known
    # ones it outranks.
    from extender.preemption import _ordered

    h = budgets_harness
    h.state.on_node("ADDED", gpu_node("gpu-a"))
    low = resident("low", "gpu-a", "10Gi", priority=1)
    high = resident("high", "gpu-a", "10Gi", priority=50)
    for pod in (low, high):
        h.state.on_pod("ADDED", pod)
    assert _ordered(h.state, ["cpu-pod", uid_of(low)], [uid_of(high)]) == [
        "cpu-pod",
        uid_of(high),
        uid_of(low),
    ]
    assert _ordered(h.state, [uid_of(low)], [uid_of(high)]) == [uid_of(high), uid_of(low)]


def _ghost_node() -> tuple[ClusterState, Clock, dict[str, Any], float]:
    """A 2-GPU node whose report shows a replica on GPU 1 held by ``ghost``, a pod the
    watch has not delivered yet, and p (24 GiB, unlocated) bound after it."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", gpu_node("n", gpus=2))
    clock.now += 1
    ghost_created = clock.now
    state.on_report("ADDED", allocated_report("n", clock.now, {1: ["ghost"]}))
    p = gpu_pod("p", node="n", declared="24Gi", uid="p", phase="Running")
    p["metadata"]["creationTimestamp"] = iso(clock.now)
    state.on_pod("ADDED", p)
    clock.now += 1
    return state, clock, p, ghost_created


async def test_a_first_victim_the_watch_has_not_delivered_is_judged_as_it_will_leave() -> None:
    # kube-scheduler names ghost, a pod bound on n that the extender's watch has not
    # delivered yet; the agent's report shows its replica on GPU 1. The trial took its
    # replica out of the report but recorded no departure for it, as the watch will
    # once it delivers the pod and its deletion: ghost alone "made room", was evicted,
    # and q was still refused there (p may sit on either GPU), evicted for nothing.
    state, clock, p, ghost_created = _ghost_node()
    q = gpu_pod("q", declared="24Gi", uid="q")
    q["spec"]["priority"] = 100
    claim = parse_claim(q)
    assert not state.fit(claim, "n").fits
    args = ExtenderPreemptionArgs(
        Pod=q, NodeNameToMetaVictims={"n": MetaVictims(Pods=[MetaPod(UID="ghost")])}
    )
    answer = await preempt(args, state, {})
    kept = answer.NodeNameToMetaVictims.get("n")
    assert kept is not None  # the pod it knows nothing of drops no node
    victims = [pod.UID for pod in kept.Pods]
    assert victims[0] == "ghost"
    # They leave as the watch will record it: ghost delivered, then every victim deleted.
    ghost = gpu_pod("ghost", node="n", declared="8Gi", uid="ghost", phase="Running")
    ghost["metadata"]["creationTimestamp"] = iso(ghost_created - 1)
    state.on_pod("ADDED", ghost)
    for pod in (ghost, p):
        if uid_of(pod) in victims:
            state.on_pod("DELETED", stopped(pod))
    clock.now += HORIZON_SECONDS
    state.on_report("MODIFIED", allocated_report("n", clock.now, {}))
    assert state.fit(claim, "n").fits, victims


async def test_a_first_victim_the_cache_cannot_know_frees_nothing_and_drops_no_node() -> None:
    # A pod with no GPU (kube-scheduler frees CPU for the preemptor too): neither the
    # cache nor the report holds it. It is answered first, as kube-scheduler ordered it,
    # counted as freeing no GPU memory: the pods that do are added after it.
    state, clock, *_ = _ghost_node()
    state.on_report("MODIFIED", allocated_report("n", clock.now, {}))
    q = gpu_pod("q", declared="24Gi", uid="q")
    q["spec"]["priority"] = 100
    claim = parse_claim(q)
    assert state.fit(claim, "n", without="q", gone={"cpu-pod"}, horizon=HORIZON_SECONDS).fits
    state.on_pod("ADDED", gpu_pod("r", node="n", declared="24Gi", uid="r", phase="Running"))
    assert not state.fit(claim, "n", without="q", gone={"cpu-pod"}, horizon=HORIZON_SECONDS).fits
    args = ExtenderPreemptionArgs(
        Pod=q, NodeNameToMetaVictims={"n": MetaVictims(Pods=[MetaPod(UID="cpu-pod")])}
    )
    answer = await preempt(args, state, {})
    kept = answer.NodeNameToMetaVictims.get("n")
    assert kept is not None
    victims = [pod.UID for pod in kept.Pods]
    assert victims[0] == "cpu-pod"
    assert len(victims) > 1
    assert state.fit(claim, "n", without="q", gone=set(victims), horizon=HORIZON_SECONDS).fits
