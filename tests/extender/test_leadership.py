"""After a restart or a leader change, filter and bind wait for the binds they cannot see.

The scenario: headroom-scheduler runs two replicas, each with an extender
sidecar. Replica A's extender has a binding POST in flight when A loses the
lease; B takes over. B's extender holds nothing for that pod, and until the
binding shows on its pod watch it counts the node short: a filter in between
could fit a second pod into the same GPU memory.
"""

from dataclasses import dataclass
from typing import Any

from extender.leadership import WATCH_ALLOWANCE_SECONDS, Leadership
from tests.extender.conftest import Harness
from tests.extender.test_server import fixture, post, seed_cluster

VERIFY_AFTER = 10.0
SETTLE = VERIFY_AFTER + WATCH_ALLOWANCE_SECONDS
LEASE = "headroom-system/headroom-scheduler"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(holder: str | None) -> dict[str, Any]:
    spec = {} if holder is None else {"holderIdentity": holder, "leaseDurationSeconds": 15}
    return {
        "metadata": {"name": "headroom-scheduler", "namespace": "headroom-system"},
        "spec": spec,
    }


def test_a_restarted_extender_waits_out_the_binds_sent_before_it_started() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, identity="scheduler-a", clock=clock)
    waiting = leadership.waiting()
    assert waiting is not None
    assert "started 0s ago" in waiting
    assert "answering in 15s" in waiting
    clock.now += SETTLE - 0.5
    assert leadership.waiting() is not None
    clock.now += 0.5
    assert leadership.waiting() is None  # no lease named: the restart is all it waits for


def test_a_new_leader_waits_out_the_previous_leaders_binds() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    clock.now += SETTLE
    waiting = leadership.waiting()
    assert waiting is not None
    assert "last seen held by nobody" in waiting
    # A leads; B is the standby (its kube-scheduler sends nothing, but if it did...).
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e"))
    waiting = leadership.waiting()
    assert waiting is not None
    assert "held by scheduler-a_0f8e" in waiting
    clock.now += 600
    # A loses the lease with a bind in flight; B's kube-scheduler takes it over.
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21"))
    waiting = leadership.waiting()
    assert waiting is not None
    assert "took the lease" in waiting
    assert "previous leader's binds" in waiting
    clock.now += SETTLE - 1
    assert leadership.waiting() is not None
    clock.now += 1
    assert leadership.waiting() is None
    # Renewals change nothing.
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21"))
    assert leadership.waiting() is None


def test_a_lease_released_by_another_waits_when_this_scheduler_takes_it() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e"))
    clock.now += SETTLE
    leadership.on_lease("MODIFIED", lease(None))  # A released it on its way out
    assert "held by scheduler-a_0f8e" in (leadership.waiting() or "")
    leadership.on_lease("MODIFIED", lease("scheduler-b_7c21"))
    assert leadership.waiting() is not None


def test_this_pods_scheduler_restarting_waits_for_nothing() -> None:
    # kube-scheduler exits when it loses the lease (or crashes); its container
    # restarts with a new identity -- same hostname, new UUID -- and takes the lease
    # back. Every bind of the old one went through this extender, which holds it.
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    leadership.on_lease("ADDED", lease("scheduler-b_7c21"))
    clock.now += SETTLE
    assert leadership.waiting() is None
    leadership.on_lease("MODIFIED", lease(None))
    assert leadership.waiting() is None
    leadership.on_lease("MODIFIED", lease("scheduler-b_99d0"))
    assert leadership.waiting() is None


def test_a_lease_re_list_may_have_hidden_another_leader() -> None:
    # The lease watch broke: another replica may have led, and bound, in the gap.
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    leadership.on_lease("ADDED", lease("scheduler-b_7c21"))
    clock.now += SETTLE
    leadership.on_lease("MODIFIED", lease("scheduler-b_99d0"))
    leadership.on_resync()
    assert "took the lease" in (leadership.waiting() or "")
    clock.now += SETTLE
    assert leadership.waiting() is None


def test_a_lease_deleted_or_held_by_a_lookalike_is_not_ours() -> None:
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    leadership.on_lease("ADDED", lease("scheduler-b_7c21"))
    clock.now += SETTLE
    leadership.on_lease("DELETED", {"metadata": {"name": "headroom-scheduler"}})
    assert leadership.waiting() is None  # nobody took it from this one
    # A hostname that merely starts like ours is not ours.
    leadership.on_lease("ADDED", lease("scheduler-bb_7c21"))
    assert "held by scheduler-bb_7c21" in (leadership.waiting() or "")


async def test_filter_and_bind_wait_with_the_reason_and_bind_nothing(harness: Harness) -> None:
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
    harness.extender.waiting = lambda: None
    _, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert result["Error"] == ""
    assert result["NodeNames"]


async def test_readyz_waits_out_a_restart_but_not_a_standby(harness: Harness) -> None:
    # /readyz gates the Deployment's rollout and the dev cluster's start: it says
    # "not yet" while binds from before the restart may land. It does not follow the
    # lease: a standby replica's sidecar is ready to take over.
    clock = Clock()
    leadership = Leadership(VERIFY_AFTER, lease=LEASE, identity="scheduler-b", clock=clock)
    harness.extender.starting = leadership.starting
    harness.extender.waiting = leadership.waiting
    response = await harness.client.get("/readyz")
    assert response.status == 503
    assert "binds sent before then may still land" in await response.text()
    clock.now += SETTLE
    leadership.on_lease("ADDED", lease("scheduler-a_0f8e"))
    assert (await harness.client.get("/readyz")).status == 200
    _, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert "held by scheduler-a_0f8e" in result["Error"]
