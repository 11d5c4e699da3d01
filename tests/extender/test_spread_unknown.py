"""Replicas a report shows allocated to pods the pod cache does not know.

The spread bound (headroom.spread) reasons from how many replicas each GPU holds:
a GPU whose neighbours hold more is where the device plugin puts newcomers. A
replica held by a pod the cache does not know (the watch lags the report, or a
pod deleted from the API longer ago than the departures are kept still runs)
is held all the same: leaving it out makes its GPU look emptier, and so the
others look as if they got fewer newcomers than they can have.
"""

from datetime import UTC, datetime

from extender.state import ClusterState
from headroom.claims import parse_claim
from headroom.reports import GPUUsage, PodUsage, ReportStatus, report_object
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import A100_MIB, gpu_node, gpu_pod

MIB = 2**20


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def report(node: str, now: float, allocated: dict[int, list[str]]) -> dict[str, object]:
    total = A100_MIB * MIB
    gpus = [
        GPUUsage(
            index=g,
            uuid=f"GPU-{node}-{g}",
            total_bytes=total,
            used_bytes=0,
            free_bytes=total,
            pods=[PodUsage(uid=uid, used_bytes=0, allocated=True) for uid in allocated.get(g, [])],
        )
        for g in range(2)
    ]
    status = ReportStatus(
        node_name=node, backend="simulated", observed_at=datetime.fromtimestamp(now, UTC), gpus=gpus
    )
    return report_object(status)


def q_fits_beside_p(allocated: dict[int, list[str]], *, stale: bool = False) -> bool:
    """A 2-GPU node whose report shows ``allocated`` (GPU -> UIDs the cache does not
    know), then p (24 GiB) bound there: whether q (24 GiB) fits too."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", gpu_node("n", gpus=2))
    clock.now += 1
    state.on_report("ADDED", report("n", clock.now, allocated))
    if stale:
        clock.now += 120
    p = gpu_pod("p", node="n", declared="24Gi", uid="p", phase="Running")
    p["metadata"]["creationTimestamp"] = iso(clock.now)
    state.on_pod("ADDED", p)
    clock.now += 1
    account = state.account("n")
    assert account is not None
    assert (account.source == "report") != stale
    return state.fit(parse_claim(gpu_pod("q", declared="24Gi", uid="q")), "n").fits


def test_a_replica_held_by_a_pod_the_cache_does_not_know_still_bounds_the_others() -> None:
    # GPU 1 holds a replica of a pod the cache does not know. p (24 GiB) came next:
    # the device plugin gave it GPU 0, the one with fewer. Then q: 1 against 1, a tie
    # the plugin may settle on GPU 0, beside p: 48 GiB on a 40 GiB GPU.
    assert not q_fits_beside_p({1: ["ghost"]})


def test_without_that_replica_the_bound_still_spreads_them() -> None:
    # The same, with GPU 1 empty: p and q go one to each GPU, and q fits.
    assert q_fits_beside_p({})


def test_so_it_does_when_the_report_has_turned_stale() -> None:
    # The agent stopped reporting: every pod is unlocated, charged where the device
    # plugin can have put it; the stale report's replicas still count where it saw them.
    assert not q_fits_beside_p({1: ["ghost"]}, stale=True)
