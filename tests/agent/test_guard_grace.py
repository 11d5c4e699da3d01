"""The tenant's terminationGracePeriodSeconds does not switch ``guard: evict`` off.

The tenant sets ``terminationGracePeriodSeconds`` at create time (no upper bound
in the API). An eviction that sends no ``gracePeriodSeconds`` gives the pod its
own: a process that ignores SIGTERM keeps its GPU memory that long. And a tenant
who deletes their own pod with a year's grace (``kubectl delete --wait=false``)
keeps it running over its declaration unless the guard acts on terminating pods.
"""

from typing import Any

from agent.client import PodActions
from agent.guard import EVICTION_GRACE_SECONDS, Guard
from headroom.quantity import GIB
from tests.agent.test_guard import NAMESPACES, POLICIES, guarded, report

YEAR = 365 * 24 * 3600


def long_grace(uid: str, *, terminating: bool) -> dict[str, Any]:
    hog = guarded(uid, "strict", declared="10Gi")  # namespace policy: guard: evict
    hog["spec"]["terminationGracePeriodSeconds"] = YEAR
    if terminating:
        hog["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        hog["metadata"]["deletionGracePeriodSeconds"] = YEAR
    return hog


def test_a_pod_terminating_for_a_year_over_its_declaration_is_still_acted_on() -> None:
    guard = Guard(grace=2)
    pods = {"hog": long_grace("hog", terminating=True)}
    kinds = []
    for _ in range(10):
        kinds += [
            v.kind for v in guard.observe(report({"hog": 30 * GIB}), pods, POLICIES, NAMESPACES)
        ]
    assert "evict" in kinds, f"guard: evict did nothing but {kinds} to a pod 20Gi over for a year"


class _Core:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def create_namespaced_pod_eviction(
        self, name: str, namespace: str, body: Any, **_: Any
    ) -> None:
        self.sent.append(body)


def test_the_guards_eviction_does_not_leave_the_grace_period_to_the_tenant() -> None:
    actions = PodActions.__new__(PodActions)
    core = _Core()
    actions._core = core  # type: ignore[assignment]
    actions._node, actions._timeout = "gpu-node-1", 10.0
    assert actions.evict("ns-strict", "hog", "hog")
    options = core.sent[0].delete_options
    grace = None if options is None else options.grace_period_seconds
    assert grace is not None, (
        f"eviction sends gracePeriodSeconds={grace}: the pod's own "
        f"terminationGracePeriodSeconds ({YEAR} here) decides how long it keeps the memory"
    )
    assert grace <= EVICTION_GRACE_SECONDS


def test_the_eviction_keeps_a_shorter_grace_period_and_ends_once_it_applies() -> None:
    guard = Guard(grace=1)
    quick = guarded("quick", "strict", declared="10Gi")
    quick["spec"]["terminationGracePeriodSeconds"] = 5
    verdicts = guard.observe(report({"quick": 30 * GIB}), {"quick": quick}, POLICIES, NAMESPACES)
    assert [(v.kind, v.grace) for v in verdicts if v.kind == "evict"] == [("evict", 5)]
    # Terminating within the guard's bound: left to stop, no second eviction.
    stopping = long_grace("hog", terminating=True)
    stopping["metadata"]["deletionGracePeriodSeconds"] = EVICTION_GRACE_SECONDS
    kinds = []
    for _ in range(3):
        observed = guard.observe(report({"hog": 30 * GIB}), {"hog": stopping}, POLICIES, NAMESPACES)
        kinds += [v.kind for v in observed]
    assert "evict" not in kinds
