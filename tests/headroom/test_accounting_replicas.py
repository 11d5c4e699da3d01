"""Pods of several replicas located from kubelet's allocations (``PodUsage.replicas``):
charged on the GPUs they hold, counted there in the bound on unlocated pods, and left
unlocated where the report's counts do not add up to all they asked for."""

from dataclasses import replace
from datetime import UTC, datetime

from headroom.accounting import History, NodeAccount, account_node, placed
from headroom.claims import PodClaim
from headroom.nodes import NodeGPUs
from headroom.reports import GPUUsage, PodUsage, ReportStatus
from tests.headroom.test_accounting import GIB, MARGIN, NOW, STALE_AFTER, pod

Counts = dict[int, dict[str, int | None]]
"""GPU -> pod -> its replicas there as the report counts them (None: not counted)."""


def node(count: int, per_gpu: int | None = None) -> NodeGPUs:
    return NodeGPUs(
        name="gpu-a",
        product="NVIDIA-A100-PCIE-40GB",
        count=count,
        memory_bytes=40 * GIB,
        replicas=per_gpu or 8,
        shared_capacity=(per_gpu or 8) * count,
        confirmed=count,
        replicas_per_gpu=per_gpu,
    )


def allocated(count: int, counts: Counts) -> ReportStatus:
    """A fresh report of ``count`` idle GPUs listing the pods kubelet allocated each."""
    gpus = [
        GPUUsage(
            index=index,
            uuid=f"GPU-{index}",
            total_bytes=40 * GIB,
            used_bytes=0,
            free_bytes=40 * GIB,
            pods=[
                PodUsage(uid=uid, used_bytes=0, allocated=True, replicas=n)
                for uid, n in counts.get(index, {}).items()
            ],
        )
        for index in range(count)
    ]
    return ReportStatus(
        node_name="gpu-a",
        backend="nvml",
        observed_at=datetime.fromtimestamp(NOW - 1, UTC),
        gpus=gpus,
    )


def account(
    gpus: int,
    claims: list[PodClaim],
    counts: Counts,
    history: History | None = None,
    per_gpu: int | None = None,
) -> NodeAccount:
    return account_node(
        node(gpus, per_gpu),
        claims,
        allocated(gpus, counts),
        now=NOW,
        margin=MARGIN,
        stale_after=STALE_AFTER,
        history=history,
    )


def charged(result: NodeAccount) -> list[float]:
    return [gpu.accounted / GIB for gpu in result.gpus]


def test_a_pod_of_two_replicas_located_on_two_gpus_is_charged_on_those_two_only() -> None:
    pair = pod("pair", 10, shared=2)
    result = account(4, [pair], {0: {"pair": 1}, 2: {"pair": 1}})
    assert charged(result) == [10, 0, 10, 0]
    assert all(p.located for gpu in result.gpus for p in gpu.pods)
    # Both replicas on one GPU: it may hold all it declared there, and only there.
    result = account(4, [pair], {3: {"pair": 2}})
    assert charged(result) == [0, 0, 0, 10]
    # What it holds beyond its declaration counts where it holds it, as for one replica.
    report = allocated(4, {0: {"pair": 1}, 2: {"pair": 1}})
    gpus = list(report.gpus)
    gpus[2] = replace(
        gpus[2], pods=[PodUsage(uid="pair", used_bytes=12 * GIB, allocated=True, replicas=1)]
    )
    gpus[1] = replace(gpus[1], pods=[PodUsage(uid="pair", used_bytes=3 * GIB)])  # not given GPU 1
    result = account_node(
        node(4), [pair], replace(report, gpus=gpus), now=NOW, margin=MARGIN, stale_after=STALE_AFTER
    )
    assert charged(result) == [10, 3, 12, 0]


def test_counts_that_do_not_add_up_leave_the_pod_unlocated() -> None:
    pair = pod("pair", 10, shared=2)
    everywhere = [10.0] * 4
    cases: list[Counts] = [
        {0: {"pair": 1}},  # one of its two replicas listed
        {0: {"pair": 2}, 1: {"pair": 1}},  # three of two
        {0: {"pair": None}, 1: {"pair": None}},  # an agent that does not count
        {0: {"pair": 1}, 1: {"pair": None}},  # counted on one GPU only
    ]
    for counts in cases:
        result = account(4, [pair], counts)
        assert charged(result) == everywhere, counts
        assert not any(p.located for gpu in result.gpus for p in gpu.pods), counts
    # A one-replica pod: uncounted (an older agent) it is located as before; a count
    # that says otherwise than its one replica leaves it unlocated.
    one = pod("one", 10)
    assert charged(account(2, [one], {1: {"one": None}})) == [0, 10]
    assert charged(account(2, [one], {1: {"one": 1}})) == [0, 10]
    assert charged(account(2, [one], {1: {"one": 2}})) == [10, 10]


def test_a_located_pods_replicas_each_count_in_the_bound() -> None:
    # pair holds two replicas of GPU 0; four pods of 8 GiB are bound and not located.
    # When the last of GPU 0's replicas was allocated, GPU 1 held at least one fewer
    # than GPU 0 then: x0 - 1 + 2 <= x1 and x0 + x1 <= 4, so x0 <= 1. Counted as one
    # replica, pair would let two come to GPU 0 (x0 - 1 + 1 <= x1).
    pair = pod("pair", 10, shared=2, created=NOW - 60)
    waiting = [pod(f"p{i}", 8, created=NOW - 30) for i in range(4)]
    history = History(since=NOW - 300)
    result = account(2, [pair, *waiting], {0: {"pair": 2}}, history)
    gpu0, gpu1 = result.gpus
    # pair in full beside one of them; or, were pair's replicas freed (kubelet frees
    # them when its containers end, before the report shows it), two of them alone.
    assert gpu0.accounted == 18 * GIB
    # GPU 1 had held no fewer than GPU 0's two when its last came: three of them.
    assert gpu1.accounted == 3 * 8 * GIB
    # The cap on replicas per GPU counts both of pair's: with 2 a GPU, none of the
    # four is on GPU 0 beside pair; two are, were pair's replicas freed.
    result = account(2, [pair, *waiting], {0: {"pair": 2}}, history, per_gpu=2)
    assert [gpu.accounted for gpu in result.gpus] == [16 * GIB, 16 * GIB]


def test_a_located_pod_of_several_replicas_keeps_no_node_off_the_bound() -> None:
    # Created before the history: unlocated, it would turn the bound off for its node
    # and every pod waiting there would be charged on all eight GPUs.
    pair = pod("pair", 4, shared=2, created=NOW - 3600)
    waiting = [pod(f"p{i}", 8, created=NOW - 30) for i in range(8)]
    history = History(since=NOW - 600)
    result = account(8, [pair, *waiting], {0: {"pair": 1}, 1: {"pair": 1}}, history)
    assert max(charged(result)) <= 4 + 8 * 2
    unlocated = account(8, [pair, *waiting], {0: {"pair": 1}}, history)
    assert charged(unlocated) == [4 + 8 * 8] * 8


def test_placed_lists_the_pods_whose_counts_are_complete() -> None:
    report = allocated(
        3,
        {
            0: {"pair": 1, "both": 2, "half": 1, "old": None},
            1: {"pair": 1, "half": None, "odd": None},
            2: {"odd": None},
        },
    )
    assert placed(report) == {"pair": {0: 1, 1: 1}, "both": {0: 2}, "old": {0: 1}}


def test_a_force_deleted_pair_is_charged_in_full_where_it_was_and_in_no_bound() -> None:
    # pair (10 GiB, two replicas) was located on GPUs 0 and 2 when it was force-deleted:
    # it runs out its grace period there, free to hold all it declared on each, while
    # kubelet's device manager counts neither replica (kubernetes#104824), so newcomers
    # may be given GPUs 0 and 2 as if it had left: its departures from them, stamped
    # its grace period on, are in the history (ClusterState._linger_on). Four pods of
    # 8 GiB wait, bound and not located.
    waiting = [pod(f"p{i}", 8, created=NOW - 30) for i in range(4)]
    left = History(since=NOW - 300, departures=((NOW + 630, 0), (NOW + 630, 2)))
    gone = pod("pair", 10, shared=2, created=NOW - 60, deleted=True, home=(0, 2))
    without = charged(account(4, waiting, {}, left))
    assert without == [16, 16, 16, 16]
    # Whether or not the report still lists it allocated there (taken before kubelet
    # dropped it), it adds its whole declaration on GPUs 0 and 2 and nothing on 1 and
    # 3, and leaves the bound as it was without it: no located replica on 0 or 2 (two
    # of the four may come beside it there), no unlocated one (a pod of two replicas
    # unlocated is charged on every GPU).
    listed: list[Counts] = [{}, {0: {"pair": 1}, 2: {"pair": 1}}]
    for counts in listed:
        result = account(4, [gone, *waiting], counts, left)
        assert charged(result) == [16 + 10, 16, 16 + 10, 16], counts
        lines = {gpu.index: [p.charged for p in gpu.pods if p.uid == "pair"] for gpu in result.gpus}
        assert lines == {0: [10 * GIB], 1: [], 2: [10 * GIB], 3: []}, counts
    # The control: not deleted, located there (and so not yet left), it counts as a
    # located replica on 0 and 2, and one of the four at most comes beside it.
    live = replace(gone, deleted=False, home=None)
    located = account(4, [live, *waiting], {0: {"pair": 1}, 2: {"pair": 1}}, History(NOW - 300))
    assert charged(located) == [10 + 8, 16, 10 + 8, 16]
