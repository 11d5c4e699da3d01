"""Per-node reasons and scores are reused, and dropped the moment the node's account changes."""

import json
import random
from typing import Any

from extender.state import ClusterState
from extender.verdicts import UNKNOWN_NODE, Verdicts
from extender.wire import json_array
from headroom.claims import parse_claim
from headroom.placement import LEGACY, fit, score
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import gpu_node, gpu_pod, stopped


def cluster(*nodes: str) -> ClusterState:
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=Clock())
    for name in nodes:
        state.on_node("ADDED", gpu_node(name))
    state.prepare(state.clock())
    return state


def answers(
    state: ClusterState, names: list[str], declared: str
) -> tuple[dict[str, str], dict[str, int]]:
    claim = parse_claim(gpu_pod("new", declared=declared))
    state.prepare(state.clock())
    _, failed = state.verdicts.filter(names, claim, state.shared_headroom, state.accounts())
    items = json.loads(json_array(state.verdicts.scores(names, claim, state.shared_room)))
    return failed, {item["Host"]: item["Score"] for item in items}


def test_answers_match_the_core_rules_and_follow_account_changes() -> None:
    state = cluster("gpu-a", "gpu-b")
    names = ["gpu-a", "gpu-b", "ghost"]
    failed, scores = answers(state, names, "10Gi")
    assert failed == {"ghost": UNKNOWN_NODE}
    first = scores["gpu-a"]
    # Fill gpu-a: the reused answers must give way to the new account at once.
    state.on_pod("ADDED", gpu_pod("big", node="gpu-a", declared="35Gi"))
    failed, scores = answers(state, names, "10Gi")
    claim = parse_claim(gpu_pod("new", declared="10Gi"))
    account = state.account("gpu-a")
    assert account is not None
    assert failed["gpu-a"] == fit(account, claim).reason
    assert "headroom < 10.0 GiB declared" in failed["gpu-a"]
    assert scores["gpu-a"] == score(account, claim) == 0 != first
    assert "gpu-b" not in failed
    assert scores["ghost"] == 0
    # And back, when the pod goes.
    state.on_pod("DELETED", stopped(gpu_pod("big", node="gpu-a", declared="35Gi")))
    failed, scores = answers(state, names, "10Gi")
    assert "gpu-a" not in failed
    assert scores["gpu-a"] == first


def test_a_legacy_pod_is_refused_as_fit_refuses_it() -> None:
    # Declaring nothing is not declaring 0: a filter that passed a legacy pod would
    # send it to a bind that refuses it (fit), and kube-scheduler would loop.
    state = cluster("gpu-a", "gpu-b")
    legacy = parse_claim(gpu_pod("old", declared=None))
    names = ["gpu-a", "gpu-b", "ghost"]
    for _ in range(2):  # and again for the same candidates
        passed, failed = state.verdicts.filter(
            names, legacy, state.shared_headroom, state.accounts()
        )
        assert passed == []
        assert failed == {"gpu-a": LEGACY, "gpu-b": LEGACY, "ghost": UNKNOWN_NODE}
        account = state.account("gpu-a")
        assert account is not None
        assert failed["gpu-a"] == fit(account, legacy).reason


def test_scores_agree_with_score_for_binpack_and_spread() -> None:
    state = cluster("gpu-a", "gpu-b", "gpu-c")
    state.on_pod("ADDED", gpu_pod("p1", node="gpu-b", declared="12Gi"))
    state.on_pod("ADDED", gpu_pod("p2", node="gpu-c", declared="25Gi"))
    state.prepare(state.clock())
    for placement in ("binpack", "spread"):
        for declared in ("1Gi", "5Gi", "10Gi", "14Gi"):
            claim = parse_claim(gpu_pod("new", declared=declared, placement=placement))
            names = list(state.nodes)
            got = json.loads(json_array(state.verdicts.scores(names, claim, state.shared_room)))
            for item in got:
                account = state.account(item["Host"])
                assert account is not None
                assert item["Score"] == score(account, claim), (placement, declared, item)


def test_only_cached_nodes_are_remembered_and_tables_are_bounded() -> None:
    state = cluster("gpu-a")
    verdicts = Verdicts(keep=2)
    ghosts = [f"ghost-{i}" for i in range(100)]
    for declared in ("1Gi", "2Gi", "3Gi"):
        claim = parse_claim(gpu_pod("new", declared=declared))
        verdicts.filter(["gpu-a", *ghosts], claim, state.shared_headroom, state.accounts())
        verdicts.scores(["gpu-a", *ghosts], claim, state.shared_room)
    answers = list(verdicts._filters.values.values())
    scores = [table.items for table in verdicts._scores.values.values()]
    assert len(answers) == len(scores) == 2  # two declarations each, the oldest dropped
    assert all(set(a.passing) | set(a.reasons) <= {"gpu-a"} for a in answers)
    assert all(set(table) <= {"gpu-a"} for table in scores)


def test_answers_reused_for_the_same_candidates_follow_every_change() -> None:
    """The last answer, patched node by node, equals one worked out from scratch."""
    nodes = [f"gpu-{i}" for i in range(6)]
    state = cluster(*nodes)
    names = [*nodes, "ghost"]
    rng = random.Random(3)
    bound: list[dict[str, Any]] = []
    for step in range(60):
        event = rng.choice(("add", "add", "delete", "node", "none"))
        if event == "add":
            pod = gpu_pod(f"p{step}", node=rng.choice(nodes), declared=f"{rng.randint(1, 12)}Gi")
            state.on_pod("ADDED", pod)
            bound.append(pod)
        elif event == "delete" and bound:
            state.on_pod("DELETED", stopped(bound.pop(rng.randrange(len(bound)))))
        elif event == "node":  # a node leaves or comes back
            name = rng.choice(nodes)
            kind = "DELETED" if name in state.nodes else "ADDED"
            state.on_node(kind, gpu_node(name))
        for declared, placement in (("30Gi", "binpack"), ("4Gi", "spread")):
            claim = parse_claim(gpu_pod("new", declared=declared, placement=placement))
            state.prepare(state.clock())
            candidates = list(names)  # equal, not the same list: as parsed from a request
            got = state.verdicts.filter(candidates, claim, state.shared_headroom, state.accounts())
            got_scores = state.verdicts.scores(got[0], claim, state.shared_room)
            fresh = Verdicts()
            want = fresh.filter(candidates, claim, state.shared_headroom, state.accounts())
            assert got == want, (step, event, declared)
            assert got_scores == fresh.scores(got[0], claim, state.shared_room), (step, event)
