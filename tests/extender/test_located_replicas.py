"""A pod of several replicas located by the agent's counts (``PodUsage.replicas``): it
keeps its node on the bound past the departure history, and leaves from its GPUs;
force-deleted, it is charged in full on each of them while it runs out its grace."""

from datetime import timedelta
from typing import Any

from extender.state import HISTORY_SECONDS, ClusterState
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, uid_of


def counted(node: str, gpus: int, allocated: dict[int, dict[str, int | None]], at: float) -> Any:
    """A fresh report of ``gpus`` idle GPUs, taken at ``at``, listing per GPU the pods
    kubelet allocated it and their replicas there (None: not counted)."""
    report = gpu_report(node, {g: {} for g in range(gpus)}, at=EPOCH + timedelta(seconds=at))
    for gpu in report["status"]["gpus"]:
        gpu["pods"] = [
            {"uid": uid, "usedBytes": 0, "allocated": True}
            | ({} if count is None else {"replicas": count})
            for uid, count in allocated.get(gpu["index"], {}).items()
        ]
    return report


def node_with_a_pair(counts: dict[int, int | None]) -> tuple[ClusterState, Clock, str]:
    """An 8-GPU node with a 4 GiB pod of two replicas bound at the start, reported
    allocated ``counts`` (GPU -> its replicas there)."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", gpu_node("gpu-a", gpus=8, replicas=16))  # no cap below 8 a GPU
    pair = gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2, phase="Running")
    state.on_pod("ADDED", pair)
    uid = uid_of(pair)
    state.on_report("ADDED", counted("gpu-a", 8, {g: {uid: n} for g, n in counts.items()}, 0))
    return state, clock, uid


def charges(state: ClusterState, clock: Clock, waiting: int) -> list[float]:
    """What each GPU is charged once ``waiting`` pods of 8 GiB, created now, are bound
    (none located yet), with a fresh report like the last."""
    for i in range(waiting):
        pod = gpu_pod(f"p{i}", node="gpu-a", declared="8Gi")
        pod["metadata"]["creationTimestamp"] = (
            (EPOCH + timedelta(seconds=clock.now - EPOCH.timestamp()))
            .isoformat()
            .replace("+00:00", "Z")
        )
        state.on_pod("ADDED", pod)
    account = state.account("gpu-a")
    assert account is not None
    return [gpu.accounted / GIB for gpu in account.gpus]


def test_a_located_pair_keeps_its_node_on_the_bound_past_the_history() -> None:
    state, clock, uid = node_with_a_pair({0: 1, 1: 1})
    clock.now += HISTORY_SECONDS + 100
    report = counted("gpu-a", 8, {0: {uid: 1}, 1: {uid: 1}}, clock.now - EPOCH.timestamp())
    state.on_report("MODIFIED", report)
    # Eight newcomers on eight GPUs: two a GPU at most, beside the pair on 0 and 1.
    assert max(charges(state, clock, 8)) <= 4 + 2 * 8


def test_a_pair_whose_counts_do_not_add_up_still_turns_the_bound_off() -> None:
    state, clock, uid = node_with_a_pair({0: 1})
    clock.now += HISTORY_SECONDS + 100
    report = counted("gpu-a", 8, {0: {uid: 1}}, clock.now - EPOCH.timestamp())
    state.on_report("MODIFIED", report)
    assert charges(state, clock, 8) == [4 + 8 * 8] * 8


def left_from(counts: dict[int, int | None]) -> list[int | None]:
    """The GPUs the pair of :func:`node_with_a_pair` leaves from, deleted."""
    state, _, _ = node_with_a_pair(counts)
    state.on_pod("DELETED", gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2))
    return sorted(
        (index for _, index in state.history("gpu-a").departures), key=lambda i: (i is None, i or 0)
    )


def test_a_located_pair_leaves_from_its_gpus() -> None:
    assert left_from({3: 1, 5: 1}) == [3, 5]
    assert left_from({6: 2}) == [6, 6]  # both on one GPU: two departures from it
    assert left_from({6: 1}) == [None, None]  # counted one of two: from any GPU, as before
    # As the trial accounts of preemption count it leaving (ClusterState._history_after).
    state, _, uid = node_with_a_pair({3: 1, 5: 1})
    gone = state._history_after("gpu-a", [uid])
    assert gone is not None
    assert sorted(index or -1 for _, index in gone.departures) == [3, 5]


def test_a_report_counting_a_pairs_replicas_is_room() -> None:
    # Located, the pair is no longer charged on the six GPUs it does not hold.
    state, _, uid = node_with_a_pair({0: None, 1: None})
    rooms: list[str] = []
    state.on_room = rooms.append
    state.on_report("MODIFIED", counted("gpu-a", 8, {0: {uid: 1}, 1: {uid: 1}}, 1))
    assert rooms == ["gpu-a"]


def force_deleted(counts: dict[int, int | None]) -> list[float]:
    """What each GPU is charged once the pair of :func:`node_with_a_pair`, its containers
    running, is force-deleted: it runs out its grace period where it was."""
    state, clock, uid = node_with_a_pair(counts)
    pair = gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2, phase="Running")
    pair["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    clock.now += 5
    state.on_pod("DELETED", pair)  # kubectl delete --force --grace-period=0
    _, lingering = state.lingering["gpu-a"][uid]
    assert lingering.deleted
    return charges(state, clock, 0)


def test_a_force_deleted_pair_is_charged_on_each_gpu_it_held() -> None:
    # Placed with both replicas counted: in full on each GPU it held one of, and only
    # there (kubelet frees its replicas at once, so the bound counts neither).
    assert force_deleted({3: 1, 5: 1}) == [0, 0, 0, 4, 0, 4, 0, 0]
    assert force_deleted({6: 2}) == [0, 0, 0, 0, 0, 0, 4, 0]
    # One of its two counted: it may be anywhere, as before.
    assert force_deleted({6: 1}) == [4] * 8
    assert force_deleted({3: None, 5: None}) == [4] * 8


def twice_listed(uid: str) -> Any:
    """A report that lists index 3 twice (the second is GPU 5, renumbered by a fault)
    and leaves index 5 out, the pair's replicas on both: which GPU each is is unknown."""
    report = counted("gpu-a", 8, {3: {uid: 1}, 5: {uid: 1}}, 0)
    for gpu in report["status"]["gpus"]:
        if gpu["index"] == 5:
            gpu["index"] = 3
    return report


def test_a_pair_on_a_gpu_listed_twice_is_placed_nowhere() -> None:
    # The accounting reads such a GPU as unread (headroom.accounting._readable); its
    # counts added up would place both replicas on GPU 3, one of which is on GPU 5.
    state, clock, uid = node_with_a_pair({})
    state.on_report("MODIFIED", twice_listed(uid))
    state.on_pod("DELETED", gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2))
    assert [index for _, index in state.history("gpu-a").departures] == [None, None]
    # Force-deleted, it may run on GPU 5: charged on every GPU, not on GPU 3 only.
    state, clock, uid = node_with_a_pair({})
    state.on_report("MODIFIED", twice_listed(uid))
    pair = gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2, phase="Running")
    pair["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    clock.now += 5
    state.on_pod("DELETED", pair)
    _, lingering = state.lingering["gpu-a"][uid]
    assert lingering.home is None
    assert charges(state, clock, 0)[5] >= 4


def test_a_force_deleted_pair_is_charged_everywhere_once_the_gpus_are_numbered_anew() -> None:
    # The pair, on GPUs 3 and 5, is force-deleted and runs on; then the driver numbers
    # the GPUs anew (GPU 3 is now index 2). Its home, kept by index, pointed at the
    # wrong GPU, as the departures did (they then count from any GPU): charged on the
    # new GPU 3 and not on index 2, where it may hold all 4 GiB.
    state, clock, _ = node_with_a_pair({3: 1, 5: 1})
    pair = gpu_pod("pair", node="gpu-a", declared="4Gi", shared=2, phase="Running")
    pair["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    clock.now += 5
    state.on_pod("DELETED", pair)
    assert charges(state, clock, 0) == [0, 0, 0, 4, 0, 4, 0, 0]
    report = counted("gpu-a", 8, {}, clock.now - EPOCH.timestamp())
    gpus = report["status"]["gpus"]
    gpus[2]["uuid"], gpus[3]["uuid"] = gpus[3]["uuid"], gpus[2]["uuid"]
    state.on_report("MODIFIED", report)
    assert charges(state, clock, 0) == [4] * 8


def test_a_pod_allocated_on_an_unread_gpu_is_not_placed_where_it_only_holds_memory() -> None:
    # A 4 GiB pod of one replica, allocated GPU 3, which NVML fails to read; it also
    # holds memory on GPU 4 (a GPU kubelet did not give it). Read without GPU 3 the
    # report lists no allocation at all, and the memory it holds would place it on
    # GPU 4: force-deleted, it would be charged in full there only, and on GPU 3, where
    # it runs, by nothing but what it was last seen holding.
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", gpu_node("gpu-a", gpus=8, replicas=16))
    solo = gpu_pod("solo", node="gpu-a", declared="4Gi", phase="Running")
    solo["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    state.on_pod("ADDED", solo)
    uid = uid_of(solo)
    report = counted("gpu-a", 8, {3: {uid: 1}}, 0)
    gpus = report["status"]["gpus"]
    gpus[3]["error"] = "Unknown Error"
    gpus[4]["pods"] = [{"uid": uid, "usedBytes": GIB}]
    state.on_report("ADDED", report)
    clock.now += 5
    state.on_pod("DELETED", solo)  # kubectl delete --force --grace-period=0
    _, lingering = state.lingering["gpu-a"][uid]
    assert lingering.home is None  # not (4,): it may run on any GPU
    assert [index for _, index in state.history("gpu-a").departures] == [None]
    assert min(charges(state, clock, 0)) >= 4
