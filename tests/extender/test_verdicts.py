"""Per-node reasons and scores are reused, and dropped the moment the node's account changes."""

import json

from extender.state import ClusterState
from extender.verdicts import UNKNOWN_NODE, Verdicts
from extender.wire import json_array
from headroom.claims import parse_claim
from headroom.placement import fit, score
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import gpu_node, gpu_pod


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
    state.on_pod("DELETED", gpu_pod("big", node="gpu-a", declared="35Gi"))
    failed, scores = answers(state, names, "10Gi")
    assert "gpu-a" not in failed
    assert scores["gpu-a"] == first


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
    tables = [*verdicts._reasons._tables.values(), *verdicts._scores._tables.values()]
    assert len(tables) == 4  # two declarations each, the oldest dropped
    assert all(set(table) <= {"gpu-a"} for table in tables)
