"""The cluster state: informer events, cached accounts, staleness over time, assumptions."""

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import extender.state
from extender.state import ClusterState
from headroom import accounting, names
from headroom.accounting import NodeAccount
from kube.informer import identity
from tests.extender.conftest import MARGIN, Clock, Harness
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, stopped, uid_of
from tests.extender.test_server import post


def fresh_state() -> tuple[ClusterState, Clock]:
    clock = Clock()
    return ClusterState(margin=MARGIN, stale_after=90.0, clock=clock), clock


def headroom(state: ClusterState, node: str = "gpu-a") -> int:
    state.refresh(state.clock())
    account = state.account(node)
    assert account is not None
    return account.shared_headroom


def test_accounts_follow_pod_events() -> None:
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pod = gpu_pod("sim", node="gpu-a", declared="10Gi")
    state.on_pod("ADDED", pod)
    assert headroom(state) == empty - 10 * GIB
    done = stopped(pod)
    state.on_pod("MODIFIED", {**done, "status": {**done["status"], "phase": "Succeeded"}})
    assert headroom(state) == empty
    state.on_pod("ADDED", pod)
    state.on_pod("DELETED", stopped(pod))
    assert headroom(state) == empty
    assert state.pods == {}


def test_a_pod_deleted_before_kubelet_stopped_it_stays_charged_for_its_grace_period() -> None:
    # kubectl delete --force, or the pod GC: kubelet may run the pod on until its
    # grace period ends, and it may use all it declared meanwhile.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pod = gpu_pod("sim", node="gpu-a", declared="10Gi", phase="Running")
    pod["spec"]["terminationGracePeriodSeconds"] = 60
    state.on_pod("ADDED", pod)
    state.on_pod("DELETED", pod)
    assert state.pods == {}
    assert headroom(state) == empty - 10 * GIB
    clock.now += 60 + 29
    assert headroom(state) == empty - 10 * GIB
    clock.now += 1  # the grace period and the allowance (LINGER_ALLOWANCE_SECONDS) over
    assert headroom(state) == empty
    assert state.lingering == {}


def test_a_pod_that_ended_or_never_ran_is_not_charged_after_it() -> None:
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pending = gpu_pod("pending", declared="10Gi")  # deleted before any binding was stored
    state.on_pod("ADDED", pending)
    state.on_pod("DELETED", pending)
    done = stopped(gpu_pod("done", node="gpu-a", declared="10Gi", phase="Running"))
    state.on_pod("ADDED", done)
    state.on_pod("MODIFIED", {**done, "status": {**done["status"], "phase": "Failed"}})
    assert headroom(state) == empty
    assert state.lingering == {}


def test_pods_without_gpu_or_headroom_annotations_are_not_kept() -> None:
    state, _ = fresh_state()
    state.on_pod("ADDED", {"metadata": {"name": "web", "namespace": "d", "uid": "w"}, "spec": {}})
    state.on_pod("ADDED", {"metadata": {"name": "bad", "uid": "b"}, "spec": {"containers": 1}})
    assert state.pods == {}


def test_report_turns_stale_with_time_alone() -> None:
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    pod = gpu_pod("nb", node="gpu-a", declared="6Gi")
    state.on_pod("ADDED", pod)
    state.on_report(
        "ADDED", gpu_report("gpu-a", {0: {uid_of(pod): 2 * GIB}}, unattributed={0: 4 * GIB})
    )
    fresh = headroom(state)
    assert state.account("gpu-a").source == "report"  # type: ignore[union-attr]
    clock.now += 91
    stale = headroom(state)
    account = state.account("gpu-a")
    assert account is not None
    assert account.source == "stale-report"
    # Issue 7: staleness used to drop the 4 GiB unattributed (headroom up by 4 GiB).
    # What was last observed keeps counting until a fresh report replaces it.
    assert stale == fresh


def test_heartbeat_keeps_the_account_and_moves_its_staleness() -> None:
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    pod = gpu_pod("nb", node="gpu-a", declared="6Gi")
    state.on_pod("ADDED", pod)
    usage = {0: {uid_of(pod): 2 * GIB}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, unattributed={0: 4 * GIB}))
    first = state.account("gpu-a")
    assert first is not None
    assert first.stale_at == clock.now + 90
    clock.now += 60
    # Same figures, 60 s later: the agent's heartbeat.
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, unattributed={0: 4 * GIB}, age=-60))
    kept = state.account("gpu-a")
    assert kept is not None
    assert kept.gpus is first.gpus  # not accounted again
    assert kept.stale_at == clock.now + 90
    clock.now += 89  # stale under the first report, fresh under the heartbeat
    assert headroom(state) == first.shared_headroom
    assert state.account("gpu-a").source == "report"  # type: ignore[union-attr]
    clock.now += 2
    state.refresh(clock.now)
    assert state.account("gpu-a").source != "report"  # type: ignore[union-attr]
    # New figures, or a report dated too far ahead, are accounted afresh.
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, unattributed={0: 4 * GIB}, age=-151))
    assert state.account("gpu-a").source == "report"  # type: ignore[union-attr]
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, unattributed={0: 1 * GIB}, age=-151))
    assert headroom(state) == first.shared_headroom + 3 * GIB
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, unattributed={0: 1 * GIB}, age=-400))
    assert state.account("gpu-a").source == "stale-report"  # type: ignore[union-attr]


def test_unreadable_report_is_dropped() -> None:
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}}))
    state.on_report("MODIFIED", {"metadata": {"name": "gpu-a"}, "status": {"gpus": "many"}})
    assert "gpu-a" not in state.reports
    assert state.account("gpu-a").source == "declarations"  # type: ignore[union-attr]


def test_assumption_ends_when_seen_bound_never_by_a_timer() -> None:
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    pods = [gpu_pod(f"p{i}", declared="10Gi") for i in range(2)]
    for pod in pods:
        state.on_pod("ADDED", pod)
    claims = [state.lookup(uid_of(p), "research", p["metadata"]["name"]) for p in pods]
    assert all(c is not None for c in claims)
    empty = headroom(state)
    assert state.assume(claims[0], "gpu-a").fits  # type: ignore[arg-type]
    assert state.assume(claims[1], "gpu-a").fits  # type: ignore[arg-type]
    assert headroom(state) == empty - 20 * GIB
    # p0 seen bound: charged once, by the cache.
    state.on_pod("MODIFIED", {**pods[0], "spec": {**pods[0]["spec"], "nodeName": "gpu-a"}})
    assert set(state.assumed) == {uid_of(pods[1])}
    assert headroom(state) == empty - 20 * GIB
    # p1's bind does not show up: still charged (issue 7: 100 assumptions expired
    # together while the watch lagged); due for an authoritative read instead.
    clock.now += 600
    assert headroom(state) == empty - 20 * GIB
    assert [c.uid for c in state.due(clock())] == [uid_of(pods[1])]


def test_assume_same_pod_elsewhere_is_refused() -> None:
    state, _ = fresh_state()
    for name in ("gpu-a", "gpu-b"):
        state.on_node("ADDED", gpu_node(name))
    pod = gpu_pod("p", declared="1Gi")
    state.on_pod("ADDED", pod)
    claim = state.lookup(uid_of(pod), "research", "p")
    assert claim is not None
    assert state.assume(claim, "gpu-a").fits
    verdict = state.assume(claim, "gpu-b")
    assert not verdict.fits
    assert "may already be bound to gpu-a" in verdict.reason
    assert not state.assume(claim, "nowhere").fits
    # Read as unbound, it may be held on both until one binding lands.
    assert state.assume(claim, "gpu-b", also=True).fits
    assert set(state.assumed[claim.uid]) == {"gpu-a", "gpu-b"}
    state.forget(claim.uid, "gpu-a")
    assert set(state.assumed[claim.uid]) == {"gpu-b"}


def test_node_deleted_has_no_account() -> None:
    state, _ = fresh_state()
    node = gpu_node("gpu-a")
    state.on_node("ADDED", node)
    assert state.account("gpu-a") is not None
    state.on_node("DELETED", node)
    assert state.account("gpu-a") is None


def test_lookup_without_uid_finds_by_name() -> None:
    state, _ = fresh_state()
    pod = gpu_pod("p")
    state.on_pod("ADDED", pod)
    found = state.lookup("", "research", "p")
    assert found is not None
    assert found.uid == uid_of(pod)


def test_bind_rechecks_against_a_report_that_turned_stale_since_the_filter() -> None:
    """Fresh, the report locates two 20 GiB pods on two GPUs; stale, each may be anywhere
    (both were created before the extender started, so no history bounds where)."""
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    a = gpu_pod("a", node="gpu-a", declared="20Gi")
    b = gpu_pod("b", node="gpu-a", declared="20Gi")
    for pod in (a, b):
        pod["metadata"]["creationTimestamp"] = "2025-06-01T11:00:00Z"
        state.on_pod("ADDED", pod)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {uid_of(a): GIB}, 1: {uid_of(b): GIB}}))
    pod = gpu_pod("new", declared="10Gi")
    state.on_pod("ADDED", pod)
    claim = state.lookup(uid_of(pod), "research", "new")
    assert claim is not None
    state.prepare(clock())  # what the filter does: the account is cached while fresh
    assert state.account("gpu-a").shared_headroom >= 10 * GIB  # type: ignore[union-attr]
    clock.now += 91
    verdict = state.assume(claim, "gpu-a")
    assert not verdict.fits
    assert "GPUNodeReport is 91s old" in verdict.reason
    assert state.assumed == {}


# --- unlocated pods on many-GPU nodes (issue 8 §1, headroom.spread) -------------


def tightest(state: ClusterState) -> int:
    """The least headroom of any GPU now (not the room for one more pod)."""
    account = state.account("gpu-a")
    assert account is not None
    return min(gpu.headroom for gpu in account.gpus)


def eight_gpu_node_with(state: ClusterState, count: int, declared: str = "8Gi") -> list[str]:
    """An 8-GPU node whose agent has reported (no NUMA node: one group), and ``count``
    pods bound to it that no report locates yet."""
    state.on_node("ADDED", gpu_node("gpu-a", gpus=8))
    state.on_report("ADDED", gpu_report("gpu-a", {g: {} for g in range(8)}))
    uids = []
    for i in range(count):
        pod = gpu_pod(f"p{i}", node="gpu-a", declared=declared)
        state.on_pod("ADDED", pod)
        uids.append(uid_of(pod))
    return uids


def test_ten_unlocated_pods_on_eight_gpus_are_charged_two_per_gpu() -> None:
    # Issue 8: each unlocated pod was charged to all eight GPUs, so a node took 4.
    state, _ = fresh_state()
    eight_gpu_node_with(state, 10)
    account = state.account("gpu-a")
    assert account is not None
    assert {gpu.headroom for gpu in account.gpus} == {40 * GIB - 2 * 8 * GIB - MARGIN}
    gpu = account.gpus[0]
    assert sum(1 for p in gpu.pods if p.charged) == 2
    assert sum(1 for p in gpu.pods if p.spread and not p.charged) == 8
    # An 11th pod still can land at most beside one other on any GPU.
    assert headroom(state) == 40 * GIB - 8 * GIB - MARGIN


def test_a_new_pod_goes_where_the_fewest_pods_are_once_they_are_located() -> None:
    # 25 pods located: GPU 0 holds four, the others three. The device plugin gives
    # a 26th pod one of the GPUs with three (they were all there before it).
    state, clock = fresh_state()
    uids = eight_gpu_node_with(state, 25)
    usage: dict[int, dict[str, int]] = {g: {} for g in range(8)}
    for i, uid in enumerate(uids):
        usage[i % 8][uid] = 8 * GIB
    clock.now += 1
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=EPOCH + timedelta(seconds=1)))
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].headroom == 40 * GIB - 4 * 8 * GIB - MARGIN  # 7.5 GiB: too little
    assert headroom(state) == 40 * GIB - 3 * 8 * GIB - MARGIN  # but no new pod goes there


def test_pods_that_left_are_remembered_and_restarts_forget_nothing_unsafely() -> None:
    state, clock = fresh_state()
    eight_gpu_node_with(state, 8)
    assert tightest(state) == 40 * GIB - 8 * GIB - MARGIN  # one per GPU
    # Seven pods leave (unlocated: each may have left any GPU). The eighth could
    # then have gone anywhere, and so could the next seven: two on one GPU at most.
    for i in range(1, 8):
        state.on_pod("DELETED", stopped(gpu_pod(f"p{i}", node="gpu-a", declared="8Gi")))
    for i in range(8, 15):
        state.on_pod("ADDED", gpu_pod(f"p{i}", node="gpu-a", declared="8Gi"))
    assert tightest(state) == 40 * GIB - 2 * 8 * GIB - MARGIN
    # An extender started after the pods were created knows no departures: any of
    # them on any GPU, as many as a GPU has replicas (4): its four largest.
    later = ClusterState(margin=MARGIN, stale_after=90.0, clock=lambda: clock.now + 3600)
    later.on_node("ADDED", gpu_node("gpu-a", gpus=8))
    for i, size in enumerate(("4Gi",) * 6 + ("5Gi", "6Gi")):
        later.on_pod("ADDED", gpu_pod(f"q{i}", node="gpu-a", declared=size))
    assert tightest(later) == 40 * GIB - (6 + 5 + 4 + 4) * GIB - MARGIN
    # Where the labels and the device plugin's capacity disagree on the replicas,
    # nothing caps a GPU: all eight on every one.
    node = gpu_node("gpu-a", gpus=8)
    node["status"]["capacity"][names.GPU_SHARED] = "64"
    later.on_node("MODIFIED", node)
    assert tightest(later) == 40 * GIB - (6 * 4 + 5 + 6) * GIB - MARGIN
    assert headroom(later) == tightest(later)


def two_gpu_node_with_located(
    state: ClusterState, located: dict[int, dict[str, str]], *, memory_mib: int = 40960
) -> dict[str, str]:
    """A 2-GPU node whose report locates ``located`` (GPU -> pod name -> declared)."""
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, memory_mib=memory_mib))
    uids: dict[str, str] = {}
    usage: dict[int, dict[str, int]] = {0: {}, 1: {}}
    for gpu, pods in located.items():
        for name, declared in pods.items():
            pod = gpu_pod(name, node="gpu-a", declared=declared, phase="Running")
            state.on_pod("ADDED", pod)
            uids[name] = uid_of(pod)
            usage[gpu][uids[name]] = 2**20  # holding memory: located
    state.on_report("ADDED", gpu_report("gpu-a", usage, total_mib=memory_mib))
    return uids


def test_a_located_pod_kubelet_already_freed_does_not_keep_newcomers_off_its_gpu() -> None:
    # z is located on GPU 0, y on GPU 1. z's container ends: kubelet frees its
    # replica at once, the report and the API show it later. The device plugin
    # then sees GPU 0 emptier than the extender does: 13.5 GiB pods a, b, c, d
    # go 0, 0, 1, 0 -- 40.5 GiB on GPU 0. So after a, b, c no 13.5 GiB pod fits
    # (found by a randomized model of the allocator, 2026-11-25).
    state, _ = fresh_state()
    two_gpu_node_with_located(state, {0: {"z": "512Mi"}, 1: {"y": "512Mi"}})
    for name in "abc":
        state.on_pod("ADDED", gpu_pod(name, node="gpu-a", declared="13824Mi"))
    assert headroom(state) < 13824 * 2**20
    # Were z really gone, a and b could be on GPU 0 (27 GiB): charged at least that.
    account = state.account("gpu-a")
    assert account is not None
    assert min(gpu.accounted for gpu in account.gpus) >= 27 * GIB


def test_a_located_pod_that_leaves_before_the_next_is_allocated_frees_its_gpu() -> None:
    # 16 GiB GPUs: a (8 GiB) and x are located on GPU 0, y on GPU 1. GPU 0 has
    # more pods, so the device plugin would give a new pod GPU 1 -- unless x
    # leaves between n's bind and kubelet admitting n: then it gives GPU 0, and
    # a + n = 16 GiB there, over the 15.5 GiB usable.
    state, _ = fresh_state()
    two_gpu_node_with_located(
        state, {0: {"a": "8Gi", "x": "512Mi"}, 1: {"y": "512Mi"}}, memory_mib=16384
    )
    pod = gpu_pod("n", declared="8Gi")
    state.on_pod("ADDED", pod)
    claim = state.lookup(uid_of(pod), "research", "n")
    assert claim is not None
    verdict = state.assume(claim, "gpu-a")
    assert not verdict.fits
    assert state.assumed == {}


def test_a_pod_with_two_replicas_fits_only_beside_what_its_replicas_let_come_together() -> None:
    # 16 GiB GPUs, nothing located. a (10 GiB) and b (6 GiB) are bound: on three
    # GPUs they cannot share one. m (5 GiB x 2 replicas) adds two replicas, and
    # then a and b can: a on 0, m on 1 and 2, b on 0 -- 16 GiB on GPU 0.
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=3, memory_mib=16384))
    for name, declared in (("a", "10Gi"), ("b", "6Gi")):
        state.on_pod("ADDED", gpu_pod(name, node="gpu-a", declared=declared))
    pod = gpu_pod("m", declared="5Gi", shared=2)
    state.on_pod("ADDED", pod)
    claim = state.lookup(uid_of(pod), "research", "m")
    assert claim is not None
    verdict = state.assume(claim, "gpu-a")
    assert not verdict.fits
    assert "2 replicas" in verdict.reason


def test_a_multi_replica_trial_is_worked_out_once_per_node_until_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A whole account per node and pod: 1.3 s per filter at 1,000 eight-GPU nodes of
    # two dozen pods not located yet, on every retry. Pods of one shape created in
    # the same 30 s share the answer; an event on the node drops it.
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=3, memory_mib=16384))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}, 2: {}}, total_mib=16384))
    for name, declared in (("a", "10Gi"), ("b", "6Gi")):
        state.on_pod("ADDED", gpu_pod(name, node="gpu-a", declared=declared))
    worked = []
    real = accounting.account_node

    def counted(*args: Any, **kwargs: Any) -> NodeAccount:
        worked.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(extender.state, "account_node", counted)
    first, second = gpu_pod("m1", declared="5Gi", shared=2), gpu_pod("m2", declared="5Gi", shared=2)
    second["metadata"]["creationTimestamp"] = "2025-06-01T12:00:20Z"
    answers, claim = [], None
    for pod in (first, second, first):
        state.on_pod("ADDED", pod)
        claim = state.lookup(uid_of(pod), "research", pod["metadata"]["name"])
        assert claim is not None
        answers.append(state.fit(claim, "gpu-a"))
    assert [a.fits for a in answers] == [False] * 3
    assert answers[0] == answers[1] == answers[2]
    assert len(worked) == 2  # the node's account, and one trial
    state.on_pod("ADDED", gpu_pod("c", node="gpu-a", declared="1Gi"))
    assert claim is not None
    assert not state.fit(claim, "gpu-a").fits
    assert len(worked) == 4  # both worked out anew


def admit(
    state: ClusterState, declared: str, *names: str, created: datetime | None = None
) -> list[bool]:
    """Pods ``names`` arriving one after another: whether each is held on gpu-a."""
    fits = []
    for name in names:
        pod = gpu_pod(name, declared=declared)
        if created is not None:
            pod["metadata"]["creationTimestamp"] = created.isoformat().replace("+00:00", "Z")
        state.on_pod("ADDED", pod)
        fits.append(state.assume(state.parse(pod), "gpu-a").fits)
    return fits


@pytest.mark.parametrize(
    ("numa", "second"),
    [(None, True), ({0: 0, 1: 0}, True), ({0: 0, 1: 1}, False), ({0: 0}, False)],
    ids=["not-reported", "one-numa-node", "two-numa-nodes", "one-unknown"],
)
def test_the_spread_bound_counts_on_a_gpu_only_for_its_own_numa_node(
    numa: dict[int, int] | None, second: bool
) -> None:
    # Two 40 GiB GPUs. kubelet's Topology Manager (any policy but none) offers the
    # device plugin the replicas of the lowest NUMA node with one free: with each GPU
    # on its own node, two 30 GiB pods bound before a report locates them both land
    # on GPU 0 (60 GiB declared against 39.5 usable), where the bound over both
    # GPUs charged each GPU 30. A GPU the report gives no node stands alone too.
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=4))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}, numa=numa))
    fits = admit(state, "30Gi", "p0", "p1")
    assert fits == [True, second]


def test_before_its_agent_reports_a_nodes_gpus_may_be_on_different_numa_nodes() -> None:
    # A node just joined: no report yet says whether kubelet may offer its GPUs
    # together. Each stands alone until one does: the two 30 GiB pods of the case
    # above are not both admitted, and once an agent reports the GPUs without NUMA
    # nodes (one group), the second fits.
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=4))
    fits = admit(state, "30Gi", "p0", "p1")
    assert fits == [True, False]
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}))
    assert state.assume(state.parse(gpu_pod("p1", declared="30Gi")), "gpu-a").fits


def test_replicas_cut_while_pods_run_cap_a_gpu_by_the_most_it_offered() -> None:
    # Time-slicing reconfigured from 8 replicas to 4: the device plugin restarts and
    # the labels follow, but kubelet keeps the pods it allocated on the old replicas.
    # Eight 4 GiB pods not located yet may all be on one GPU still; capped at the new
    # 4, the GPU would be charged 16 GiB where 32 can be.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=8))
    clock.now += 3600  # no history covers the pods: only the cap bounds them
    state.on_pod_resync()
    for i in range(8):
        state.on_pod("ADDED", gpu_pod(f"p{i}", node="gpu-a", declared="4Gi"))
    assert tightest(state) == 40 * GIB - 8 * 4 * GIB - MARGIN
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    assert tightest(state) == 40 * GIB - 8 * 4 * GIB - MARGIN


@pytest.mark.parametrize(
    ("how", "second"),
    [
        ("force-deleted", False),
        ("deleted-once-stopped", True),
        ("force-deleted-with-a-sidecar-running", False),
        ("force-deleted-in-a-watch-gap", False),
    ],
)
def test_a_pod_deleted_before_kubelet_stopped_it_still_counts_on_its_gpu(
    how: str, second: bool
) -> None:
    # Two 40 GiB GPUs. P (2 GiB, a 300 s grace period) is located on GPU 1 and
    # force-deleted (kubectl delete --force): the API, the extender and the agent's
    # pod cache forget it at once, kubelet keeps its replica while the containers
    # stop. 100 s later A and B (25 GiB) arrive: the allocator sees GPU 0 at 0, GPU 1
    # at 1, puts A on GPU 0, then breaks the 1:1 tie towards GPU 0 too -- 50 GiB on
    # 40. P's departure counts until its grace is over; a pod whose containers kubelet
    # reported terminated released its replica (a review's case). A sidecar still
    # running keeps the pod, and its replica, on the node; deleted while the pod
    # watch was down, the re-list's DELETED carries only the pod's name and UID, and
    # the grace period is the one the cache read before (later reviews' cases).
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=4))
    p = gpu_pod("p", node="gpu-a", declared="2Gi", phase="Running")
    p["spec"]["terminationGracePeriodSeconds"] = 300
    main = "terminated" if how == "deleted-once-stopped" else "running"
    p["status"]["containerStatuses"] = [{"name": "main", "state": {main: {}}}]
    if how == "force-deleted-with-a-sidecar-running":
        p["spec"]["initContainers"] = [
            {"name": "log", "image": "busybox", "restartPolicy": "Always"}
        ]
        p["status"]["initContainerStatuses"] = [{"name": "log", "state": {"running": {}}}]
        p["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": {}}}]
    state.on_pod("ADDED", p)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {uid_of(p): 2 * GIB}}))
    clock.now += 5
    if how == "force-deleted-in-a-watch-gap":
        state.on_pod("DELETED", identity(p))  # as kube.informer replays it after a re-list
        state.on_pod_resync()
    else:
        state.on_pod("DELETED", p)
    clock.now += 100
    late = EPOCH + timedelta(seconds=105)
    state.on_report(
        "MODIFIED", gpu_report("gpu-a", {0: {}, 1: {}}, unattributed={1: 2 * GIB}, at=late)
    )
    fits = admit(state, "25Gi", "a", "b", created=late)
    assert fits == [True, second]


def test_a_tenants_long_grace_period_keeps_no_departure_from_being_forgotten() -> None:
    # The tenant sets terminationGracePeriodSeconds. A pod force-deleted with a year of
    # grace counts as departing 10 minutes and 30 s on at most; and the departures after
    # it are still forgotten once older than the history, not kept behind it forever.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    forced = gpu_pod("forced", node="gpu-a", declared="2Gi", phase="Running")
    forced["spec"]["terminationGracePeriodSeconds"] = 365 * 86400
    state.on_pod("ADDED", forced)
    state.on_pod("DELETED", forced)
    for i in range(3):
        pod = gpu_pod(f"done{i}", node="gpu-a", declared="2Gi", phase="Running")
        state.on_pod("ADDED", pod)
        state.on_pod("MODIFIED", {**pod, "status": {"phase": "Succeeded"}})
    start = clock.now
    assert len(state.history("gpu-a").departures) == 4
    clock.now += 700
    assert [at for at, _ in state.history("gpu-a").departures] == [start + 630]
    clock.now += 600
    assert state.history("gpu-a").departures == ()


def test_a_pod_re_list_forgets_the_history_a_watch_gap_may_have_cut() -> None:
    # The pod watch breaks and the informer re-lists. A pod created and deleted in
    # the gap was never seen: it may have held a GPU's count up while others were
    # allocated, and its departure is missing from the bound. Pods bound before
    # the re-list are charged on every GPU until located; pods after it are not.
    state, clock = fresh_state()
    eight_gpu_node_with(state, 8)
    assert tightest(state) == 40 * GIB - 8 * GIB - MARGIN  # one per GPU
    clock.now += 30
    state.on_pod_resync()
    assert tightest(state) == 40 * GIB - 4 * 8 * GIB - MARGIN  # four replicas a GPU
    later = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    later.on_node("ADDED", gpu_node("gpu-a", gpus=8))
    later.on_pod_resync()  # the first list: history starts once it is complete
    pod = gpu_pod("new", node="gpu-a", declared="8Gi")
    pod["metadata"]["creationTimestamp"] = "2025-06-01T12:00:31Z"
    later.on_pod("ADDED", pod)
    assert tightest(later) == 40 * GIB - 8 * GIB - MARGIN


def test_a_pod_is_located_where_kubelet_allocated_it_not_where_it_holds_memory() -> None:
    # P was given GPU 0, but reaches GPU 1 too (NVIDIA_VISIBLE_DEVICES) and holds
    # memory only there. a and b, 7.5 GiB each, arrive before the report shows
    # them: kubelet, counting P on GPU 0, gives both GPU 1. Then P leaves. Were P
    # placed by its memory, GPU 1 would look as if it had lost a pod: charged 8 GiB
    # while 15 GiB are there, with room for another 7.5 GiB pod.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, memory_mib=16384))
    p = gpu_pod("p", node="gpu-a", declared="2Gi", phase="Running")
    state.on_pod("ADDED", p)
    report = gpu_report("gpu-a", {0: {}, 1: {uid_of(p): GIB // 2}}, total_mib=16384)
    report["status"]["gpus"][0]["pods"] = [{"uid": uid_of(p), "usedBytes": 0, "allocated": True}]
    state.on_report("ADDED", report)
    for name in "ab":
        clock.now += 1
        pod = gpu_pod(name, declared="7680Mi")
        pod["metadata"]["creationTimestamp"] = f"2025-06-01T12:00:0{int(clock.now) % 10}Z"
        state.on_pod("ADDED", pod)
        claim = state.lookup(uid_of(pod), "research", name)
        assert claim is not None
        assert state.assume(claim, "gpu-a").fits
        state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "gpu-a"}})
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[1].accounted >= 15 * GIB + GIB // 2  # a, b and P's stray memory
    state.on_pod("DELETED", p)
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[1].accounted >= 15 * GIB


def test_an_apiserver_clock_ahead_of_the_extenders_hides_no_departure() -> None:
    # GPU 1 held three located pods; a, b and c (13 GiB each) were bound, and kubelet
    # gave all three GPU 0 (the fewest); then the three on GPU 1 left. The apiserver's
    # clock is a minute ahead of the extender's: the newcomers' creationTimestamps
    # come after those departures by the extender's clock, and counted from them the
    # bound would forget the departures: 26 GiB charged on GPU 0 where 39 GiB are.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    old = [gpu_pod(f"o{i}", node="gpu-a", declared="1Gi", phase="Running") for i in range(3)]
    for pod in old:
        state.on_pod("ADDED", pod)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {uid_of(p): GIB // 4 for p in old}}))
    clock.now += 5
    for name in "abc":
        pod = gpu_pod(name, node="gpu-a", declared="13Gi")
        pod["metadata"]["creationTimestamp"] = "2025-06-01T12:01:05Z"  # 60 s ahead
        state.on_pod("ADDED", pod)
    clock.now += 1
    for pod in old:
        state.on_pod("DELETED", pod)
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].accounted >= 39 * GIB


@pytest.mark.parametrize("step", [0, 60, 600])
def test_the_extenders_wall_clock_stepping_back_hides_no_departure(step: int) -> None:
    # The case above, with the clocks agreeing until NTP steps the extender's back
    # (a minute; ten) just before the three on GPU 1 leave, and the node agent's with
    # it (one time source): their departures are stamped before a, b and c were
    # created, and the bound forgets them (or the history drops them, as older than
    # its start): 26 GiB charged on GPU 0 where 39 GiB are.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    old = [gpu_pod(f"o{i}", node="gpu-a", declared="1Gi", phase="Running") for i in range(3)]
    for pod in old:
        state.on_pod("ADDED", pod)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {uid_of(p): GIB // 4 for p in old}}))
    clock.now += 5
    for name in "abc":
        pod = gpu_pod(name, node="gpu-a", declared="13Gi")
        pod["metadata"]["creationTimestamp"] = "2025-06-01T12:00:05Z"
        state.on_pod("ADDED", pod)
    clock.now += 1 - step
    for pod in old:
        state.on_pod("DELETED", stopped(pod))
    at = datetime.fromtimestamp(clock.now, UTC)
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {}, 1: {}}, at=at))
    account = state.account("gpu-a")
    assert account is not None
    assert account.source == "report"
    assert account.gpus[0].accounted >= 39 * GIB


def test_an_unknown_device_plugin_policy_charges_unlocated_pods_everywhere() -> None:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock, spread=False)
    eight_gpu_node_with(state, 4)
    assert tightest(state) == 40 * GIB - 4 * 8 * GIB - MARGIN
    assert headroom(state) == tightest(state)


def test_claims_on_a_node_match_the_assumptions_through_any_sequence() -> None:
    # claims_on reads holds through a by-node index; through random holds,
    # releases, binds seen by the watch and deletions it must always name
    # exactly the pods bound there plus those held there and not bound there.
    state, _ = fresh_state()
    nodes = ["gpu-a", "gpu-b", "gpu-c"]
    for name in nodes:
        state.on_node("ADDED", gpu_node(name, memory_mib=800 * 1024))
    pods = [gpu_pod(f"p{i}", declared="1Gi") for i in range(6)]
    for pod in pods:
        state.on_pod("ADDED", pod)
    rng = random.Random(8)
    for _ in range(2000):
        pod, node = rng.choice(pods), rng.choice(nodes)
        claim = state.lookup(uid_of(pod), "research", pod["metadata"]["name"])
        action = rng.randrange(6)
        if claim is None:
            state.on_pod("ADDED", pod)
        elif action == 0:
            state.assume(claim, node, also=rng.random() < 0.5)
        elif action == 1:
            state.hold(claim, node)
        elif action == 2:
            state.forget(claim.uid, node if rng.random() < 0.5 else None)
        elif action == 3:
            state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": node}})
        elif action == 4:
            state.on_pod("DELETED", pod)
        else:
            state.on_pod("ADDED", pod)
        for name in nodes:
            bound = {c.uid for c in state.pods.values() if c.node == name}
            held = {uid for uid, holds in state.assumed.items() if name in holds}
            assert sorted(c.uid for c in state.claims_on(name)) == sorted(bound | held)


def test_a_status_only_update_keeps_the_nodes_account() -> None:
    # kubelet's updates (Running, conditions, IPs) change nothing an account reads:
    # recomputing the node's account for each would be most of a storm's work.
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    pod = gpu_pod("p", node="gpu-a", declared="10Gi")
    state.on_pod("ADDED", pod)
    before = state.account("gpu-a")
    assert before is not None
    running = {**pod, "status": {"phase": "Running", "podIP": "10.0.0.7"}}
    state.on_pod("MODIFIED", running)
    assert state.account("gpu-a") is before
    # What an account does read still counts: a deletion, or the pod ending.
    done = stopped(running)
    state.on_pod("MODIFIED", {**done, "status": {**done["status"], "phase": "Succeeded"}})
    after = state.account("gpu-a")
    assert after is not before
    assert after is not None
    assert after.shared_headroom == before.shared_headroom + 10 * GIB


def test_a_status_only_update_changes_no_hold() -> None:
    # on_pod skips an event whose claim equals the cached one. That is safe for
    # holds because a pod the cache has bound is never held (assume and hold
    # both refuse), and an unbound pod's hold must outlive such events: kube-
    # scheduler writes PodScheduled conditions while the pod waits.
    state, _ = fresh_state()
    for name in ("gpu-a", "gpu-b"):
        state.on_node("ADDED", gpu_node(name))
    waiting = gpu_pod("w", declared="10Gi")
    state.on_pod("ADDED", waiting)
    claim = state.pods[uid_of(waiting)]
    assert state.assume(claim, "gpu-a").fits
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    status = {"phase": "Pending", "conditions": [unschedulable]}
    state.on_pod("MODIFIED", {**waiting, "status": status})
    assert list(state.assumed[uid_of(waiting)]) == ["gpu-a"]
    assert [c.uid for c in state.claims_on("gpu-a")] == [uid_of(waiting)]

    bound = gpu_pod("b", node="gpu-a", declared="10Gi")
    state.on_pod("ADDED", bound)
    claim = state.pods[uid_of(bound)]
    assert not state.assume(claim, "gpu-b").fits
    state.hold(claim, "gpu-b")
    assert uid_of(bound) not in state.assumed
    assert list(state.claims_on("gpu-b")) == []


async def test_filter_refuses_a_two_replica_pod_where_its_replicas_would_crowd_a_gpu(
    harness: Harness,
) -> None:
    # As above, through the filter verb: gpu-a refused with the reason, gpu-b (empty)
    # passes; choosing one node, the extender works out only as many accounts as it
    # takes, best score first, and still never picks gpu-a.
    state = harness.state
    for name in ("gpu-a", "gpu-b"):
        state.on_node("ADDED", gpu_node(name, gpus=3, memory_mib=16384))
        state.on_report("ADDED", gpu_report(name, {0: {}, 1: {}, 2: {}}, total_mib=16384))
    for name, declared in (("a", "10Gi"), ("b", "6Gi")):
        state.on_pod("ADDED", gpu_pod(name, node="gpu-a", declared=declared))
    args = {"Pod": gpu_pod("m", declared="5Gi", shared=2), "NodeNames": ["gpu-a", "gpu-b"]}
    _, result = await post(harness, "filter", args)
    assert result["NodeNames"] == ["gpu-b"]
    assert "2 replicas of 5.0 GiB" in result["FailedNodes"]["gpu-a"]
    harness.extender.choose = True
    _, result = await post(harness, "filter", args)
    assert result["NodeNames"] == ["gpu-b"]


def test_a_departure_ageing_out_of_a_new_pods_bound_frees_its_room() -> None:
    # Tenant storm with deletions (tests/e2e/test_tenant_storm.py): a pod deleted
    # before its agent located it is a departure from any GPU. While it counts, a new
    # pod may have gone to the GPU holding two pods although another holds one. Once
    # no pod is unlocated, it counts for the next pod only within the clock-skew
    # tolerance of now; the account, kept until an event touched the node, kept it
    # counting, and the pods waiting were never told of the room: 10 GiB refused
    # for good on a settled node.
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=1e9, clock=clock)
    rooms: list[str] = []
    state.on_room = rooms.append
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    a, b, c = (gpu_pod(name, node="gpu-a", declared="10Gi", phase="Running") for name in "abc")
    gone = gpu_pod("gone", node="gpu-a", declared="5Gi", phase="Running")
    for pod in (a, b, c, gone):
        state.on_pod("ADDED", pod)
    placed = {0: {uid_of(a): 10 * GIB, uid_of(b): 10 * GIB}, 1: {uid_of(c): 10 * GIB}}
    state.on_report("ADDED", gpu_report("gpu-a", placed, at=datetime.fromtimestamp(clock.now, UTC)))
    state.on_pod("DELETED", stopped(gone))  # kubelet stopped it: no linger
    # GPU 0 may get the next pod beside both its pods: the departure may have been GPU 1's.
    assert headroom(state) == 40 * GIB - MARGIN - 20 * GIB
    clock.now += accounting.FUTURE_TOLERANCE_SECONDS + 5
    rooms.clear()
    assert headroom(state) == 40 * GIB - MARGIN - 10 * GIB, "the departure still counts"
    assert rooms == ["gpu-a"], "the pods waiting for that room were not told of it"
