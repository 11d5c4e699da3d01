"""After a restart or a leader change, filter and bind wait for the binds they cannot see.

The scenario: headroom-scheduler runs two replicas, each with an extender
sidecar. Replica A's extender has a binding POST in flight when A loses the
lease; B takes over. B's extender holds nothing for that pod, and until the
binding shows on its pod watch it counts the node short: a filter in between
could fit a second pod into the same GPU memory.
"""

import asyncio
import copy
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from extender import verbs
from extender.leadership import WATCH_ALLOWANCE_SECONDS, Leadership
from extender.service import relist_for_leadership
from extender.state import ClusterState
from extender.verbs import Extender
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from kube.informer import Informer, identity
from tests.extender.conftest import MARGIN, Harness, PodReader, RecordingBinder
from tests.extender.objects import gpu_node, gpu_pod, uid_of
from tests.extender.test_server import fixture, post, seed_cluster
from tests.kube.test_informer import Clock as DrivenClock
from tests.kube.test_informer import controlled, spin
from tests.kube.test_informer import pod as listed_pod

VERIFY_AFTER = 10.0
SETTLE = VERIFY_AFTER + WATCH_ALLOWANCE_SECONDS
LEASE = "headroom-system/headroom-scheduler"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(holder: str | None, transitions: int = 0, renewed: float | None = None) -> dict[str, Any]:
    """The Lease as kube-scheduler's client-go writes it; ``renewed``: the holder's clock's
    second, as its ``renewTime`` (None: none written). Extenders here are given the test's
    clock as their node's (``wall``): the holder's own extender ages its renewals by it."""
    spec: dict[str, Any] = {"leaseDurationSeconds": 15, "leaseTransitions": transitions}
    if holder is not None:
        spec["holderIdentity"] = holder
        if renewed is not None:
            moment = datetime.fromtimestamp(renewed, UTC)
            spec["renewTime"] = moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return {
        "metadata": {"name": "headroom-scheduler", "namespace": "headroom-system"},
        "spec": spec,
    }


def renew(leadership: Leadership, clock: Clock, seconds: float, holder: str, n: int) -> None:
    """``seconds`` pass while ``holder`` renews every 2 s (kube-scheduler's retryPeriod)."""
    end = clock.now + seconds
    while clock.now + 2 <= end:
        clock.now += 2
        leadership.on_lease("MODIFIED", lease(holder, n, renewed=clock.now))
    clock.now = end


def test_a_restarted_extender_waits_out_the_binds_sent_before_it_started() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, identity="scheduler-a", clock=clock, wall=clock)
    waiting = leadership.waiting()
    assert waiting is not None
    assert "just started" in waiting
    clock.now += SETTLE - 0.5
    assert leadership.waiting() == waiting  # constant: pod conditions are not rewritten
    clock.now += 0.5
    assert leadership.waiting() is None  # no lease named: the restart is all it waits for


def test_a_new_leader_waits_out_the_previous_leaders_binds() -> None:
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    clock.now += SETTLE
    assert "last seen held by nobody" in (leadership.waiting() or "")
    # A leads; B is the standby (its kube-scheduler sends nothing, but if it did...).
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e", 3))
    renew(leadership, clock, 600, "scheduler-a_0f8e", 3)
    assert "held by scheduler-a_0f8e" in (leadership.waiting() or "")
    # A loses the lease with a bind in flight; B's kube-scheduler takes it over.
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21", 4))
    waiting = leadership.waiting()
    assert waiting is not None
    assert "took the lease" in waiting
    assert "previous leader's binds" in waiting
    renew(leadership, clock, SETTLE - 1, "scheduler-b_7c21", 4)
    assert leadership.waiting() is not None
    renew(leadership, clock, 1, "scheduler-b_7c21", 4)
    assert leadership.waiting() is None
    renew(leadership, clock, 600, "scheduler-b_7c21", 4)  # renewals change nothing
    assert leadership.waiting() is None


def test_a_lease_released_by_another_waits_when_this_scheduler_takes_it() -> None:
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e", 1))
    renew(leadership, clock, SETTLE, "scheduler-a_0f8e", 1)
    leadership.on_lease("MODIFIED", lease(None, 1))  # A released it on its way out
    assert "held by scheduler-a_0f8e" in (leadership.waiting() or "")
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21", 2))
    assert "took the lease" in (leadership.waiting() or "")


def test_this_pods_scheduler_restarting_waits_for_nothing() -> None:
    # kube-scheduler exits when it loses the lease (or crashes) and releases it; its
    # container restarts with a new identity -- same hostname, new UUID -- and takes
    # the lease back. Every bind of the old one went through this extender.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-b_7c21", 5))
    renew(leadership, clock, SETTLE, "scheduler-b_7c21", 5)
    assert leadership.waiting() is None
    leadership.on_lease("MODIFIED", lease(None, 5))
    leadership.on_lease("MODIFIED", lease("scheduler-b_99d0", 6))
    assert leadership.waiting() is None


def test_a_leader_the_lease_watch_never_showed_is_counted() -> None:
    # The watch broke and re-listed: between this scheduler's two containers another
    # replica led, and bound, unseen. leaseTransitions went up by two, not one.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-b_7c21", 5))
    renew(leadership, clock, SETTLE, "scheduler-b_7c21", 5)
    leadership.on_lease("MODIFIED", lease("scheduler-b_99d0", 7))
    assert "took the lease" in (leadership.waiting() or "")
    renew(leadership, clock, SETTLE, "scheduler-b_99d0", 7)
    assert leadership.waiting() is None
    # The same holder, but the lease changed hands twice meanwhile.
    leadership.on_lease("MODIFIED", lease("scheduler-b_99d0", 9))
    assert "took the lease" in (leadership.waiting() or "")
    # A lease deleted and re-created starts its count again: nothing can be told.
    renew(leadership, clock, SETTLE, "scheduler-b_99d0", 9)
    leadership.on_lease("DELETED", {"metadata": {"name": "headroom-scheduler"}})
    leadership.on_lease("ADDED", lease("scheduler-b_1e55", 0))
    assert "took the lease" in (leadership.waiting() or "")


def test_a_view_of_the_lease_too_old_to_rule_out_a_new_leader_waits() -> None:
    # A stuck lease watch (or this pod frozen and thawed) still shows this scheduler
    # leading; by now another may have taken the lease. kube-scheduler renews every
    # 2 s and gives up after 10: no renewal seen for 10 s, no answer.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-b_7c21", 1))
    renew(leadership, clock, SETTLE, "scheduler-b_7c21", 1)
    assert leadership.waiting() is None
    clock.now += 10.5
    assert "no renewal" in (leadership.waiting() or "")
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21", 1, renewed=clock.now))
    assert leadership.waiting() is None


def test_a_relisted_lease_is_not_a_renewal() -> None:
    # This scheduler renewed last at 1014 and froze. At 1023 the lease watch breaks and
    # re-lists: the lease still names it, with the same renewTime. That is no sign of
    # life; by 1029 another may lead, and the answers stop at 1024 as without the re-list.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-a", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 1, renewed=clock.now))
    renew(leadership, clock, SETTLE, "scheduler-a_7c21", 1)
    assert leadership.waiting() is None
    last = clock.now - 1
    clock.now = 1023.0
    leadership.on_lease("MODIFIED", lease("scheduler-a_7c21", 1, renewed=last))
    clock.now = 1025.0
    assert "no renewal" in (leadership.waiting() or "")


def test_a_renewal_seen_late_is_aged_from_when_it_was_made() -> None:
    # This extender stalled (or its lease watch lagged) with its kube-scheduler's renewal
    # of 1031 unread, and reads it at 1043: seen just now, made 12 s ago. Another replica
    # counts the lease from when it saw it change, and may lead from 1046. The kube-scheduler
    # and its sidecar share the node, and so the clock renewTime is written by.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-a", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 1, renewed=clock.now))
    renew(leadership, clock, 30, "scheduler-a_7c21", 1)
    assert leadership.waiting() is None
    clock.now += 1
    made = clock.now  # a renewal on its way to this extender
    clock.now += 12
    leadership.on_lease("MODIFIED", lease("scheduler-a_7c21", 1, renewed=made))
    assert "no renewal" in (leadership.waiting() or "")
    leadership.on_lease("MODIFIED", lease("scheduler-a_7c21", 1, renewed=clock.now - 1))
    assert leadership.waiting() is None  # a renewal made 1 s ago, seen now


async def test_a_thawed_old_leader_does_not_bind_beside_the_new_one() -> None:
    """The frozen leader. Replica A's kube-scheduler renews last at 1100 and is frozen
    (SIGSTOP, a stalled node) in the middle of placing p; A's extender sees the Lease
    24 s late (its lease watch lags; or it stalled, the events unread). B's scheduler
    takes the lease at 1116, 15 s after it last saw it change; B's extender, its wait
    over, binds q at 1132 -- when A's kube-scheduler thaws and binds p before it
    notices the lease lost (nothing fences a thawed client-go leader). A's extender saw
    A renew at 1124: 8 s ago, made 32 s ago. Each charges only what its own watch shows
    and its own holds: p and q, 20 GiB each, would both land on the one 40 GB GPU."""
    clock = Clock()  # both nodes' clocks (skew aside): each extender's and its scheduler's
    apiserver = RecordingBinder()
    p, q = gpu_pod("p", declared="20Gi"), gpu_pod("q", declared="20Gi")

    def sidecar(host: str) -> tuple[Leadership, Extender]:
        state = ClusterState(
            margin=MARGIN, stale_after=90.0, verify_after=VERIFY_AFTER, clock=clock
        )
        state.on_node("ADDED", gpu_node("gpu-a"))  # one A100 40 GB
        state.on_pod("ADDED", p)
        state.on_pod("ADDED", q)
        leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity=host, clock=clock, wall=clock)
        extender = Extender(
            state, apiserver, reader=PodReader(apiserver), waiting=leadership.waiting
        )
        return leadership, extender

    lead_a, extender_a = sidecar("scheduler-a")
    lead_b, extender_b = sidecar("scheduler-b")
    writes = [(t, lease("scheduler-a_0f8e", 1, renewed=t)) for t in range(1000, 1101, 2)]
    writes += [(t, lease("scheduler-b_7c21", 2, renewed=t)) for t in range(1116, 1133, 2)]
    deliveries = sorted(
        [(t, 0, lead_b, obj) for t, obj in writes]
        + [(t + 24, 1, lead_a, obj) for t, obj in writes],
        key=lambda d: (d[0], d[1]),
    )

    def until(moment: float) -> None:
        while deliveries and deliveries[0][0] <= moment:
            when, _, leadership, obj = deliveries.pop(0)
            clock.now = when
            leadership.on_lease("MODIFIED", obj)
        clock.now = moment

    until(1132)
    placed = extender_b.filter(ExtenderArgs(Pod=q, NodeNames=["gpu-a"]))
    assert placed.NodeNames == ["gpu-a"], placed
    bound = await extender_b.bind(
        ExtenderBindingArgs(PodName="q", PodNamespace="research", PodUID=uid_of(q), Node="gpu-a")
    )
    assert bound.Error == ""
    late = await extender_a.bind(
        ExtenderBindingArgs(PodName="p", PodNamespace="research", PodUID=uid_of(p), Node="gpu-a")
    )
    assert apiserver.bound == {("research", "q"): "gpu-a"}, "p and q on one 40 GB GPU"
    assert "no renewal" in late.Error


def test_a_leader_seen_only_by_its_release_is_counted() -> None:
    # The lease watch is blind while B acquires (count 6), binds and releases on
    # SIGTERM (client-go keeps the count, clears the holder). The re-list shows only the
    # release; then this pod's restarted scheduler acquires (7). B's binds may land.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-a", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 5, renewed=clock.now))
    renew(leadership, clock, SETTLE, "scheduler-a_7c21", 5)
    leadership.on_lease("MODIFIED", lease(None, 6))
    leadership.on_lease("MODIFIED", lease("scheduler-a_99d0", 7, renewed=clock.now))
    assert "took the lease" in (leadership.waiting() or "")


def test_a_recreated_lease_another_held_in_between_is_counted() -> None:
    # The lease is deleted by hand; B creates it (count 0) and releases it; this
    # scheduler, still inside its renew deadline, acquires it under the same identity
    # (count 1). A count above 0 on a re-created lease is an acquisition not seen.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-a", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 9, renewed=clock.now))
    renew(leadership, clock, SETTLE, "scheduler-a_7c21", 9)
    leadership.on_lease("DELETED", {"metadata": {"name": "headroom-scheduler"}})
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 1, renewed=clock.now))
    assert "took the lease" in (leadership.waiting() or "")


def test_a_lease_this_scheduler_re_creates_waits_for_nothing() -> None:
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-a", clock=clock, wall=clock
    )
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 9, renewed=clock.now))
    renew(leadership, clock, SETTLE, "scheduler-a_7c21", 9)
    leadership.on_lease("DELETED", {"metadata": {"name": "headroom-scheduler"}})
    leadership.on_lease("ADDED", lease("scheduler-a_7c21", 0, renewed=clock.now))
    assert leadership.waiting() is None


def test_a_standby_says_so_and_a_lease_nobody_holds_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two replicas: the standby's extender refuses while the other leads, and once a
    # minute it says why. That is the normal state of a standby, not a warning; a
    # lease nobody is seen holding (a --leader-lease that names another) is.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    clock.now += SETTLE
    with caplog.at_level("INFO", logger="extender.leadership"):
        assert leadership.waiting() is not None
        leadership.on_lease("ADDED", lease("scheduler-a_0f8e", 3, renewed=clock.now))
        clock.now += 61
        assert leadership.waiting() is not None
    levels = [(r.levelname, "standby" in r.getMessage()) for r in caplog.records]
    assert ("WARNING", False) in levels  # held by nobody: is the lease the right one?
    assert levels[-1] == ("INFO", True)
    assert [lvl for lvl, _ in levels].count("WARNING") == 1


def test_a_lease_held_by_a_lookalike_is_not_ours() -> None:
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    clock.now += SETTLE
    leadership.on_lease("ADDED", lease("scheduler-bb_7c21"))
    assert "held by scheduler-bb_7c21" in (leadership.waiting() or "")


async def test_filter_bind_and_preempt_wait_and_bind_nothing(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_cluster(harness)
    reason = "headroom extender: this kube-scheduler took the lease 3s ago; retry"
    harness.extender.waiting = lambda: reason
    status, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert (status, result["NodeNames"], result["Error"]) == (200, [], reason)
    harness.state.on_pod("ADDED", fixture("filter-node-names.json")["Pod"])
    status, result = await post(harness, "bind", fixture("bind.json"))
    assert (status, result) == (200, {"Error": reason})
    assert harness.binder.calls == []
    assert harness.state.assumed == {}
    chosen: list[object] = []
    monkeypatch.setattr(verbs, "preempt", lambda *args: chosen.append(args))
    status, result = await post(harness, "preempt", fixture("preempt-meta-victims.json"))
    assert status == 200
    assert chosen == []  # no victims chosen on a view that may miss binds
    assert not result.get("NodeNameToMetaVictims")
    harness.extender.waiting = lambda: None
    _, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert result["Error"] == ""
    assert result["NodeNames"]


async def test_readyz_waits_out_a_restart_but_not_a_standby(harness: Harness) -> None:
    # /readyz gates the Deployment's rollout and the dev cluster's start: it says
    # "not yet" while binds from before the restart may land. It does not follow the
    # lease: a standby replica's sidecar is ready to take over.
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    harness.extender.starting = leadership.starting
    harness.extender.waiting = leadership.waiting
    response = await harness.client.get("/readyz")
    assert response.status == 503
    assert "binds sent before it started may still land" in await response.text()
    clock.now += SETTLE
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e"))
    assert (await harness.client.get("/readyz")).status == 200
    _, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert "held by scheduler-a_0f8e" in result["Error"]


class PagedPods:
    """The apiserver's paged pod list: every page from the snapshot taken when the first
    page was served (continue tokens keep it), each ``per_page`` seconds slow."""

    def __init__(self, clock: Clock, pods: list[dict[str, Any]], per_page: float) -> None:
        self.clock, self.pods, self.per_page = clock, pods, per_page
        self.snapshot: list[dict[str, Any]] = []

    async def list(self, *, limit: int, token: str | None) -> bytes:
        if token is None:
            self.snapshot = copy.deepcopy(self.pods)
        self.clock.now += self.per_page
        start = int(token or 0)
        more = start + 1 < len(self.snapshot)
        metadata = {"continue": str(start + 1)} if more else {"resourceVersion": "100"}
        return json.dumps(
            {"metadata": metadata, "items": self.snapshot[start : start + 1]}
        ).encode()

    def watch(self, *, version: str) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError  # these tests list only


async def test_a_restart_waits_for_a_pod_list_that_shows_the_old_binds() -> None:
    """A review's case. The old extender's POST of p is stored 2 s after the new one
    starts (inside verify_after). The new one's first list is paged and slow: its
    snapshot, taken at 0.5 s, shows p unbound; the list completes at 20.5 s, after the
    15 s wait had ended on the clock, and the watch from it has not shown p's binding
    yet. q's filter then fitted q into the room p had taken."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, verify_after=VERIFY_AFTER, clock=clock)
    state.on_node("ADDED", gpu_node("gpu-a"))  # one A100 40 GB
    p, q = gpu_pod("p", declared="20Gi"), gpu_pod("q", declared="20Gi")
    leadership = Leadership(VERIFY_AFTER, identity="scheduler-a", clock=clock, wall=clock)
    source = PagedPods(clock, [p, q, *(gpu_pod(f"c{i}", shared=0) for i in range(3))], 4.0)
    pods = Informer(source, name="pods", handler=state.on_pod, keep=identity, clock=clock)
    leadership.view = lambda: pods.listed_from
    binder = RecordingBinder()
    reader = PodReader(binder)
    reader.put(q)
    extender = Extender(
        state, binder, reader=reader, ready=pods.synced.is_set, waiting=leadership.waiting
    )
    clock.now += 0.5
    listing = asyncio.ensure_future(pods._relist())
    await asyncio.sleep(0)  # the first page is asked for: the snapshot shows p unbound
    source.pods[0] = {**p, "spec": {**p["spec"], "nodeName": "gpu-a"}}  # stored at 2 s
    await listing
    assert clock.now > leadership.started + SETTLE  # the old wait was over
    waiting = leadership.waiting()
    assert waiting is not None
    assert "once it has listed the pods 10s after its start" in waiting
    assert "just started" in extender.filter(ExtenderArgs(Pod=q, NodeNames=["gpu-a"])).Error
    await pods._relist()  # begun after start + verify_after: p is bound in it
    assert leadership.waiting() is None
    refused = extender.filter(ExtenderArgs(Pod=q, NodeNames=["gpu-a"]))
    assert refused.NodeNames == [], refused
    assert "headroom < 20.0 GiB declared" in refused.FailedNodes["gpu-a"]


def test_a_new_leader_waits_for_a_pod_list_begun_after_the_old_leaders_binds() -> None:
    clock = Clock()
    leadership = Leadership(
        VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock, wall=clock
    )
    listed = [clock.now]  # the pod cache's list, long before the change
    leadership.view = lambda: listed[0]
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e", 3))
    renew(leadership, clock, 600, "scheduler-a_0f8e", 3)
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21", 4))
    changed = clock.now
    assert leadership.list_from() == changed + VERIFY_AFTER
    renew(leadership, clock, SETTLE + 30, "scheduler-b_7c21", 4)  # a lagging watch
    assert "once it has listed the pods" in (leadership.waiting() or "")
    listed[0] = changed + VERIFY_AFTER - 0.1  # begun too early: may miss a late bind
    assert leadership.waiting() is not None
    listed[0] = changed + VERIFY_AFTER
    assert leadership.waiting() is None


class Relisted:
    """An informer as relist_for_leadership sees it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.listed_from: float | None = clock.now
        self.relists: list[float] = []

    def relist(self) -> None:
        self.relists.append(self.clock.now)


async def test_the_pods_are_listed_again_once_and_only_when_due() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, identity="scheduler-a", clock=clock, wall=clock)
    pods = Relisted(clock)
    task = asyncio.create_task(relist_for_leadership(pods, leadership, every=0.001))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.02)
        assert pods.relists == []  # before start + verify_after, a list would be too early
        clock.now += VERIFY_AFTER
        await asyncio.sleep(0.02)
        assert pods.relists == [clock.now]  # once, however long the list takes
        pods.listed_from = clock.now
        clock.now += 600
        await asyncio.sleep(0.02)
        assert pods.relists == [clock.now - 600]  # listed late enough: nothing more
    finally:
        task.cancel()


async def test_relister_asks_again_when_since_moves_and_a_failed_list_is_retried() -> None:
    clock = DrivenClock()
    inf, src, _ = controlled(clock)
    src.pods = [listed_pod("a", "ua")]
    lead = Leadership(10.0, lease="ns/l", identity="me", clock=clock)
    lead.view = lambda: inf.listed_from
    inf.start()
    await spin()
    task = asyncio.create_task(relist_for_leadership(inf, lead, every=0.001))
    try:
        clock.now = 1010.0
        await asyncio.sleep(0.02)
        assert inf.listed_from == 1010.0
        assert lead.starting() is not None
        clock.now = 1015.0
        assert lead.starting() is None
        # our scheduler takes the lease; the next list fails once (backoff ~1 s)
        lead.on_lease(
            "ADDED", {"spec": {"holderIdentity": "me_1", "leaseTransitions": 1, "renewTime": "x"}}
        )
        assert lead.since == 1015.0
        src.fail = [RuntimeError("boom")]
        clock.now = 1025.0
        await asyncio.sleep(0.02)
        # since moves later while that point's list is still failing
        lead.on_lease(
            "MODIFIED",
            {"spec": {"holderIdentity": "other", "leaseTransitions": 2, "renewTime": "y"}},
        )
        lead.on_lease(
            "MODIFIED",
            {"spec": {"holderIdentity": "me_2", "leaseTransitions": 3, "renewTime": "z"}},
        )
        assert lead.since == 1025.0
        clock.now = 1035.0
        for _ in range(300):
            await asyncio.sleep(0.01)
            if inf.listed_from == 1035.0:
                break
        assert inf.listed_from == 1035.0
        assert lead._listed_from(lead.since + 10.0)
    finally:
        task.cancel()
        inf.stop()
        await spin()
