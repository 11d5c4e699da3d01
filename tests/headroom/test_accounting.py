"""GPU memory accounting: max(declared, observed), unattributed, margin, stale reports,
multi-GPU nodes and MIG slices."""

import random
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from headroom import accounting
from headroom.accounting import (
    NO_GPU_HEADROOM,
    History,
    NodeAccount,
    PodCharge,
    _spread,
    account_key,
    account_node,
)
from headroom.claims import PodClaim
from headroom.nodes import MigSlices, NodeGPUs
from headroom.placement import fit
from headroom.reports import Condition, GPUUsage, PodUsage, ReportStatus
from headroom.spread import most_with_gone

GIB = 2**30
MARGIN = GIB // 2
STALE_AFTER = 90.0
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp()


def a100(count: int = 1, **kw: object) -> NodeGPUs:
    return NodeGPUs(
        name="gpu-a",
        product="NVIDIA-A100-PCIE-40GB",
        count=count,
        memory_bytes=40 * GIB,
        replicas=4,
        shared_capacity=4 * count,
        **kw,  # type: ignore[arg-type]
    )


def pod(name: str, declared: float | None, *, shared: int = 1, **kw: Any) -> PodClaim:
    memory = None if declared is None else int(declared * GIB)
    claim = PodClaim(
        uid=name, namespace="ns", name=name, node="gpu-a", shared=shared, declared=memory
    )
    return replace(claim, **kw)


def report(
    usage: dict[int, dict[str, float]],
    *,
    age: float = 1.0,
    unattributed: dict[int, float] | None = None,
    total: float = 40,
    mig_enabled: frozenset[int] = frozenset(),
    conditions: list[Condition] | None = None,
    allocated: dict[int, set[str]] | None = None,
) -> ReportStatus:
    """``usage``: GPU -> pod -> GiB held; ``allocated``: GPU -> pods kubelet gave it."""
    gpus = [
        GPUUsage(
            index=index,
            uuid=f"GPU-{index}",
            product="NVIDIA A100-PCIE-40GB",
            total_bytes=int(total * GIB),
            used_bytes=0,
            free_bytes=0,
            mig_enabled=index in mig_enabled,
            pods=[
                PodUsage(
                    uid=uid,
                    used_bytes=int(used * GIB),
                    allocated=uid in (allocated or {}).get(index, set()),
                )
                for uid, used in pods.items()
            ],
            unattributed_bytes=int((unattributed or {}).get(index, 0) * GIB),
        )
        for index, pods in usage.items()
    ]
    return ReportStatus(
        node_name="gpu-a",
        backend="simulated",
        observed_at=datetime.fromtimestamp(NOW - age, UTC),
        gpus=gpus,
        conditions=conditions or [],
    )


def account(
    node: NodeGPUs, claims: list[PodClaim], status: ReportStatus | None, margin: int = MARGIN
) -> NodeAccount:
    return account_node(node, claims, status, now=NOW, margin=margin, stale_after=STALE_AFTER)


def test_fresh_report_charges_the_larger_of_declared_and_observed() -> None:
    claims = [pod("sim", 10), pod("inf", 10), pod("nb", 6)]
    status = report({0: {"sim": 9, "inf": 2, "nb": 15, "stranger": 1}}, unattributed={0: 0.5})
    result = account(a100(), claims, status)
    (gpu,) = result.gpus
    assert result.source == "report"
    assert result.note == ""
    # sim 10 (declared) + inf 10 (declared) + nb 15 (observed leak) + stranger 1 + 0.5 unattributed
    assert gpu.accounted == int(36.5 * GIB)
    assert gpu.headroom == 40 * GIB - int(36.5 * GIB) - MARGIN
    assert gpu.declared == 26 * GIB
    assert gpu.observed == 27 * GIB
    stranger = next(p for p in gpu.pods if p.uid == "stranger")
    assert not stranger.known
    assert result.stale_at == NOW - 1.0 + STALE_AFTER


def test_no_report_falls_back_to_declarations_and_the_label() -> None:
    result = account(a100(), [pod("sim", 10), pod("raw", None)], None)
    (gpu,) = result.gpus
    assert result.source == "declarations"
    assert "no GPUNodeReport" in result.note
    assert gpu.total == 40 * GIB
    # A shared pod with no declared resource is legacy (0.1): charged the whole GPU.
    assert gpu.accounted == 50 * GIB
    assert gpu.headroom < 0
    assert result.stale_at is None


def test_a_legacy_pod_is_charged_the_whole_gpu_whatever_its_annotation_says() -> None:
    node = a100(count=2)
    located = report({0: {"old": 1}, 1: {}})
    result = account(node, [pod("old", None)], located)
    assert [gpu.accounted for gpu in result.gpus] == [40 * GIB, 0]
    result = account(node, [pod("old", None)], None)
    assert [gpu.accounted for gpu in result.gpus] == [40 * GIB, 40 * GIB]


def test_stale_report_keeps_observed_leaks_but_drops_location() -> None:
    node = a100(count=2)
    status = report({0: {"nb": 15}, 1: {}}, age=STALE_AFTER + 30)
    result = account(node, [pod("nb", 6)], status)
    assert result.source == "stale-report"
    assert "120s old" in result.note
    # Charged to both GPUs (location no longer trusted) at the most it was seen holding.
    assert [g.accounted for g in result.gpus] == [15 * GIB, 15 * GIB]


def test_a_report_from_the_future_is_not_trusted() -> None:
    # An agent whose clock runs ahead must not stay fresh after it dies.
    status = report({0: {"sim": 2}}, age=-120)
    result = account(a100(), [pod("sim", 10)], status)
    assert result.source == "stale-report"
    assert "in the future" in result.note
    slightly_ahead = account(a100(), [pod("sim", 10)], report({0: {"sim": 2}}, age=-5))
    assert slightly_ahead.source == "report"


def test_nvml_unavailable_report_is_no_report() -> None:
    down = Condition(type="NVMLAvailable", status="False", message="libnvidia-ml.so.1 not found")
    result = account(a100(), [pod("sim", 10)], report({}, conditions=[down]))
    assert result.source == "declarations"
    assert "libnvidia-ml.so.1 not found" in result.note


def test_multi_gpu_located_pods_charge_one_gpu_unlocated_charge_all() -> None:
    node = a100(count=2)
    claims = [pod("seen", 10), pod("starting", 8), pod("pair", 4, shared=2)]
    result = account(node, claims, report({0: {"seen": 12, "pair": 1}, 1: {}}))
    gpu0, gpu1 = result.gpus
    assert {p.uid for p in gpu0.pods} == {"seen", "starting", "pair"}
    assert {p.uid for p in gpu1.pods} == {"starting", "pair"}
    assert gpu0.accounted == (12 + 8 + 4) * GIB
    assert gpu1.accounted == (8 + 4) * GIB
    assert result.tightest is gpu0
    assert result.shared_headroom == gpu0.headroom


def test_a_pod_kubelet_allocated_is_located_before_it_holds_memory() -> None:
    node = a100(count=2)
    claims = [pod("fresh", 10), pod("starting", 8)]
    status = report({0: {}, 1: {"fresh": 0}}, allocated={1: {"fresh"}})
    gpu0, gpu1 = account(node, claims, status).gpus
    assert {p.uid for p in gpu0.pods} == {"starting"}
    assert {p.uid: p.located for p in gpu1.pods} == {"fresh": True, "starting": False}
    assert (gpu0.accounted, gpu1.accounted) == (8 * GIB, 18 * GIB)
    # Listed at 0 bytes without kubelet's word, it is where it may be: everywhere.
    gpu0, gpu1 = account(node, claims, report({0: {}, 1: {"fresh": 0}})).gpus
    assert (gpu0.accounted, gpu1.accounted) == (18 * GIB, 18 * GIB)


def test_a_one_replica_pod_allocated_on_two_gpus_is_not_located() -> None:
    # Not what kubelet says of a one-replica pod; if a report does, it locates nothing.
    status = report({0: {"odd": 0}, 1: {"odd": 0}}, allocated={0: {"odd"}, 1: {"odd"}})
    result = account(a100(count=3), [pod("odd", 10)], status)
    assert [g.accounted for g in result.gpus] == [10 * GIB] * 3
    assert not any(p.located for g in result.gpus for p in g.pods)


def test_a_gpu_missing_from_a_fresh_report_is_read_as_failed() -> None:
    # An agent (or NVML enumerating 1 of 2) that leaves GPU 1 out has not measured it
    # empty: its last reading (34 GiB of a foreign process) keeps counting.
    node = a100(count=2)
    last_good = report({0: {"a": 1}, 1: {}}, unattributed={1: 34})
    result = account_node(
        node,
        [pod("a", 2)],
        report({0: {"a": 1}}),
        now=NOW,
        margin=MARGIN,
        stale_after=STALE_AFTER,
        last_good=last_good,
    )
    gpu0, gpu1 = result.gpus
    assert gpu0.headroom == 40 * GIB - 2 * GIB - MARGIN  # still measured
    assert gpu1.headroom <= 40 * GIB - 34 * GIB - MARGIN
    assert "GPU 1 missing from the GPUNodeReport" in result.note
    assert not fit(result, pod("new", 20)).fits


def test_tightest_gpu_decides_fit_on_a_multi_gpu_node() -> None:
    node = a100(count=2)
    result = account(node, [pod("big", 30)], report({0: {"big": 30}, 1: {}}))
    assert result.gpus[1].headroom > 20 * GIB
    verdict = fit(result, pod("new", 20))
    assert not verdict.fits
    assert verdict.reason.startswith("gpu 0 NVIDIA-A100-PCIE-40GB: 9.5 GiB headroom < 20.0 GiB")


def test_mig_mode_gpu_takes_no_shared_pods() -> None:
    result = account(a100(count=2), [], report({0: {}, 1: {}}, mig_enabled=frozenset({0})))
    assert [g.shared for g in result.gpus] == [False, True]
    assert result.tightest is not None
    assert result.tightest.index == 1


def test_node_without_gpus_has_no_headroom() -> None:
    result = account(NodeGPUs(name="cpu"), [], None)
    assert result.gpus == ()
    assert result.tightest is None
    assert result.shared_headroom == NO_GPU_HEADROOM


def test_terminated_pods_are_not_charged() -> None:
    result = account(a100(), [pod("done", 30, terminated=True)], None)
    assert result.gpus[0].accounted == 0


def test_mig_slices_counted_against_capacity() -> None:
    node = a100(mig={"1g.5gb": MigSlices("1g.5gb", 7, 4864 * 2**20)})
    claims = [pod("m1", 4, shared=0, mig={"1g.5gb": 1}), pod("m2", 4, shared=0, mig={"1g.5gb": 2})]
    result = account(node, claims, None)
    assert result.mig["1g.5gb"].used == 3
    assert result.mig["1g.5gb"].free == 4
    # MIG pods take no whole-GPU memory.
    assert result.gpus[0].accounted == 0


# --- properties ---------------------------------------------------------------

declared_gib = st.one_of(st.none(), st.integers(min_value=0, max_value=24))


@st.composite
def node_with_report(draw: st.DrawFn) -> tuple[NodeGPUs, list[PodClaim], ReportStatus]:
    count = draw(st.integers(min_value=1, max_value=4))
    node = a100(count=count)
    claims = [
        pod(f"p{i}", draw(declared_gib), shared=draw(st.sampled_from([1, 1, 2])))
        for i in range(draw(st.integers(min_value=0, max_value=8)))
    ]
    uids = [c.uid for c in claims] + ["stranger"]
    usage: dict[int, dict[str, float]] = {}
    for index in range(count):
        seen = draw(st.lists(st.sampled_from(uids), unique=True, max_size=len(uids)))
        usage[index] = {uid: draw(st.integers(min_value=0, max_value=30)) for uid in seen}
    status = report(
        usage,
        age=draw(st.floats(min_value=STALE_AFTER + 0.001, max_value=1e6)),
        unattributed={i: draw(st.integers(min_value=0, max_value=8)) for i in range(count)},
        total=draw(st.sampled_from([20, 40, 80])),
    )
    return node, claims, status


@given(node_with_report())
@settings(max_examples=300, deadline=None)
def test_stale_reports_never_raise_headroom_above_declarations(
    case: tuple[NodeGPUs, list[PodClaim], ReportStatus],
) -> None:
    node, claims, status = case
    stale = account(node, claims, status)
    declared = account(node, claims, None)
    assert stale.source == "stale-report"
    assert [g.index for g in stale.gpus] == [g.index for g in declared.gpus]
    for with_report, without in zip(stale.gpus, declared.gpus, strict=True):
        assert with_report.headroom <= without.headroom
    assert stale.shared_headroom <= declared.shared_headroom


Event = tuple[str, int, int]
# GiB declared, and where the device plugin puts the pod's replicas: 0..3 one replica on
# GPU b (modulo the node's count), 4..7 two replicas on GPUs b and b + 1.
binds = st.tuples(st.just("bind"), st.sampled_from([0, 1, 2, 3, 4, 6, 8]), st.integers(0, 7))
events = st.lists(
    st.one_of(
        binds,
        binds,
        binds,
        st.tuples(st.just("delete"), st.integers(0, 50), st.just(0)),
        # which pods the agent sees (bit i: the i-th bound pod), and unattributed quarter-GiB
        st.tuples(st.just("report"), st.sampled_from([0, 1, 3, 5, 2**16 - 1]), st.integers(0, 6)),
        st.tuples(st.just("stale"), st.just(0), st.just(0)),
    ),
    min_size=10,
    max_size=30,
)


def _placed(b: int, gpus: int) -> tuple[int, ...]:
    """The GPUs the device plugin gives a pod's replicas (see ``binds``)."""
    return (b % gpus,) if b < 4 else (b % gpus, (b + 1) % gpus)


@given(st.integers(min_value=1, max_value=4), events)
@example(2, [("bind", 6, 1), ("report", 1, 0), ("bind", 6, 1), ("bind", 4, 1)])
# A two-replica pod the agent sees on one GPU only must still be charged to the other.
@example(2, [("bind", 8, 4), ("report", 1, 0), ("bind", 6, 1), ("report", 3, 0), ("bind", 4, 1)])
@settings(max_examples=500, deadline=None)
def test_declared_memory_on_a_gpu_never_exceeds_its_total(gpus: int, history: list[Event]) -> None:
    """Whatever GPUs the device plugin picks, and whatever the agent has seen so far."""
    node = replace(a100(count=gpus), memory_bytes=16 * GIB)  # small, so that GPUs fill up
    bound: dict[str, tuple[PodClaim, tuple[int, ...]]] = {}  # uid -> (claim, its real GPUs)
    seen: dict[str, int] = {}  # what the latest report shows: uid -> bytes (on its first GPU)
    allocated: set[str] = set()  # pods the latest report lists as kubelet allocated them
    unattributed = 0
    report_age = 1.0
    for number, (kind, a, b) in enumerate(history):
        if kind == "bind":
            where = _placed(b, gpus)
            claim = pod(f"p{number}", a, shared=len(where))
            status = _report_of(gpus, bound, seen, allocated, unattributed, report_age)
            if fit(account(node, [c for c, _ in bound.values()], status), claim).fits:
                bound[claim.uid] = (claim, where)
        elif kind == "delete" and bound:
            uid = sorted(bound)[a % len(bound)]
            del bound[uid]
            seen.pop(uid, None)
            allocated.discard(uid)
        elif kind == "report":
            # The agent sees some pods, holding anything, each on the first GPU it really
            # uses (a second replica that holds nothing yet is invisible to NVML); with
            # kubelet's word (PodResources), on every GPU it has, held or not.
            picked = [
                (uid, claim, (a >> i) % 3)
                for i, (uid, (claim, _)) in enumerate(sorted(bound.items()))
                if (a >> i) & 1
            ]
            seen = {uid: 0 if k == 0 else k * claim.need // 2 + 1 for uid, claim, k in picked}
            allocated = {uid for uid, _, k in picked if k != 1}
            unattributed = b * GIB // 4
            report_age = 1.0
        elif kind == "stale":
            report_age = STALE_AFTER * 2
        for index in range(gpus):
            on_gpu = sum(c.need for c, where in bound.values() if index in where)
            assert on_gpu <= node.memory_bytes - MARGIN


def _report_of(
    gpus: int,
    bound: dict[str, tuple[PodClaim, tuple[int, ...]]],
    seen: dict[str, int],
    allocated: set[str],
    unattributed: int,
    age: float,
) -> ReportStatus:
    usage: dict[int, dict[str, float]] = {i: {} for i in range(gpus)}
    given: dict[int, set[str]] = {i: set() for i in range(gpus)}
    for uid, used in seen.items():
        usage[bound[uid][1][0]][uid] = used / GIB
    for uid in allocated:
        for index in bound[uid][1]:
            usage[index].setdefault(uid, 0)
            given[index].add(uid)
    unattributed_gib = dict.fromkeys(range(gpus), unattributed / GIB)
    return report(usage, age=age, unattributed=unattributed_gib, total=16, allocated=given)


def test_memory_pods_hold_in_mig_devices_counts_on_a_gpu_shared_by_slices() -> None:
    # A review's case: MIG strategy single with time-slicing. The device plugin offers
    # each 1g.5gb slice as a "GPU" (GFD: nvidia.com/gpu.count 7, gpu.memory 4864,
    # replicas 2; nvidia.com/gpu.shared 14), so shared pods run on MIG devices, and the
    # agent reports them, and what they hold, under the GPU's mig_devices. The
    # accounting read only a GPU's own pods: a pod declaring 1 GiB and holding 4 GiB
    # of its slice was charged 1 GiB, and a 3 GiB pod fit beside it.
    from headroom.nodes import parse_node
    from headroom.reports import MigDeviceUsage

    node = parse_node(
        {
            "metadata": {
                "name": "gpu-a",
                "labels": {
                    "nvidia.com/mig.strategy": "single",
                    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
                    "nvidia.com/gpu.count": "7",
                    "nvidia.com/gpu.replicas": "2",
                    "nvidia.com/gpu.memory": "4864",
                    "nvidia.com/gpu.sharing-strategy": "time-slicing",
                },
            },
            "status": {"capacity": {"nvidia.com/gpu.shared": "14"}},
        }
    )
    slices = [
        MigDeviceUsage(
            uuid=f"MIG-{i}",
            profile="1g.5gb",
            total_bytes=4864 * 2**20,
            used_bytes=4 * GIB if i == 0 else 0,
            pods=[PodUsage(uid="leaky", used_bytes=4 * GIB, allocated=True)] if i == 0 else [],
        )
        for i in range(7)
    ]
    gpu = GPUUsage(
        index=0,
        uuid="GPU-0",
        product="NVIDIA A100-SXM4-40GB",
        total_bytes=40 * GIB,
        used_bytes=4 * GIB,
        free_bytes=36 * GIB,
        mig_enabled=True,
        mig_devices=slices,
    )
    status = ReportStatus(
        node_name="gpu-a",
        backend="nvml",
        observed_at=datetime.fromtimestamp(NOW - 1, UTC),
        gpus=[gpu],
    )
    claims = [pod("leaky", 1)]
    result = account(node, claims, status)
    verdict = fit(result, pod("new", 3))
    assert not verdict.fits, result
    # A stale report, and the last good one, keep what it was seen to hold too.
    stale = replace(status, observed_at=datetime.fromtimestamp(NOW - 1000, UTC))
    assert not fit(account(node, claims, stale), pod("new", 3)).fits


@settings(max_examples=300, deadline=None)
@given(
    located=st.lists(st.integers(0, 4), min_size=2, max_size=8),
    numa=st.one_of(st.none(), st.lists(st.integers(0, 2), min_size=8, max_size=8)),
    unlocated=st.integers(0, 12),
    left=st.lists(st.one_of(st.none(), st.integers(0, 7)), max_size=6),
    per_gpu=st.one_of(st.none(), st.integers(1, 8)),
)
def test_gpus_alike_share_their_bound_as_each_would_work_it_out(
    located: list[int],
    numa: list[int] | None,
    unlocated: int,
    left: list[int | None],
    per_gpu: int | None,
) -> None:
    # _spread works a GPU's bound out once for the GPUs alike in what it reads (their
    # group, their own count, their located pods): each is what the GPU's own gives.
    indices = list(range(len(located)))
    on = {g: [f"{g}-{k}" for k in range(count)] for g, count in enumerate(located)}
    groups = None if numa is None else {g: numa[g] for g in indices}
    departures = tuple((NOW, g if g is None or g < len(indices) else None) for g in left)
    claims = [pod(f"u{k}", 4, created=NOW - 10) for k in range(unlocated)]
    limits = _spread(
        claims, indices, on, History(NOW - 100, departures), NOW, len(indices), groups, per_gpu
    )
    assert limits is not None
    bounds = {h: located[h] + sum(1 for _, at in departures if at == h) for h in indices}
    anywhere = sum(1 for _, at in departures if at is None)
    for g in indices:
        peers = {h: c for h, c in bounds.items() if groups is None or groups[h] == groups[g]}
        most = most_with_gone(g, unlocated, peers, anywhere, located[g])
        more = most_with_gone(g, unlocated + 1, peers, anywhere, located[g], least=most)
        if per_gpu is not None:
            most = tuple(min(x, max(0, per_gpu - located[g] + j)) for j, x in enumerate(most))
            more = tuple(min(x, max(0, per_gpu - located[g] + j)) for j, x in enumerate(more))
        assert (limits.now[g], limits.next[g]) == (most, more)


def _random_report(
    rng: random.Random,
    count: int,
    claims: list[PodClaim],
    age: float,
    seen: float,
) -> ReportStatus:
    """A report of ``count`` GPUs (one more now and then) that shows each pod on each GPU
    with chance ``seen`` (kubelet's allocation or not, memory held or not, replicas
    counted or not), some pods located: one-replica pods on one GPU, pods of several
    replicas with every replica counted over one GPU or more (now and then one replica
    short, or a GPU uncounted), a stranger with a count, unequal totals."""
    totals = rng.random() < 0.3
    located = rng.random() < 0.5
    pods: dict[int, list[PodUsage]] = {index: [] for index in range(count + (rng.random() < 0.05))}
    for claim in [*claims, PodClaim(uid="stranger", namespace="ns", name="x", shared=2)]:
        for index in pods:
            if rng.random() < seen:
                pods[index].append(
                    PodUsage(
                        uid=claim.uid,
                        used_bytes=rng.choice([0, 1, 5, 9, 20]) * GIB,
                        allocated=rng.random() < 0.7,
                        replicas=rng.choice([None, 1, 2]),
                    )
                )
        if not located or claim.shared < 1 or rng.random() < 0.4:
            continue
        where: dict[int, int] = {}
        for _ in range(claim.shared - (rng.random() < 0.05)):
            index = rng.randrange(count)
            where[index] = where.get(index, 0) + 1
        for index, replicas in where.items():
            counted = claim.shared == 1 or rng.random() > 0.05
            pods[index].append(
                PodUsage(
                    uid=claim.uid,
                    used_bytes=rng.choice([0, 1, 5]) * GIB,
                    allocated=True,
                    replicas=replicas if counted else None,
                )
            )
    gpus = [
        GPUUsage(
            index=index,
            uuid=f"GPU-{index}",
            total_bytes=(rng.choice([20, 40, 48]) if totals else 40) * GIB,
            used_bytes=0,
            free_bytes=0,
            pods=usages,
            unattributed_bytes=rng.choice([0, 0, GIB]),
            error="NVML_ERROR_UNKNOWN" if rng.random() < 0.05 else "",
        )
        for index, usages in pods.items()
    ]
    return ReportStatus(
        node_name="gpu-a",
        backend="simulated",
        observed_at=datetime.fromtimestamp(NOW - age, UTC),
        gpus=gpus,
    )


def _cap_every_gpu(
    unlocated: list[PodClaim], spread: accounting.Spread | None
) -> Callable[[list[PodCharge], int, Iterable[tuple[int, int]]], accounting.Capped]:
    """accounting._capper without sharing: each GPU capped on its own."""

    def cap(
        lines: list[PodCharge], index: int, leavers: Iterable[tuple[int, int]]
    ) -> accounting.Capped:
        capped, growth = accounting._cap(lines, unlocated, spread, index, tuple(leavers))
        return tuple(capped), growth, accounting._declared(capped), sum(p.charged for p in capped)

    return cap


def _random_home(rng: random.Random, count: int) -> tuple[int, ...] | None:
    """Where a deleted pod's replicas were last placed: unknown, its GPUs, or (now and
    then) a GPU the node does not have."""
    if rng.random() < 0.3:
        return None
    gpus = rng.sample(range(count), rng.randint(1, min(3, count)))
    if rng.random() < 0.05:
        gpus.append(count)
    return tuple(sorted(gpus))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_gpus_capped_together_are_capped_as_each_on_its_own(seed: int) -> None:
    # An account caps once the GPUs whose lines are the same objects under the same
    # bound and leavers (accounting._capper), a pod no report shows having one line for
    # every GPU (accounting._plain_lines): on random nodes (8 GPUs mostly; legacy,
    # multi-replica, deleted and ended pods; multi-replica pods located by counted
    # reports, their leavers (charge, replicas) pairs; reports fresh, stale or absent,
    # unequal totals, pods seen where kubelet did not put them), the same account as
    # capping each GPU alone.
    rng = random.Random(seed)
    count = rng.choice([2, 4, 8, 8, 8])
    node = a100(count, confirmed=rng.choice([count, count, count, count - 1]))
    node = replace(
        node,
        memory_bytes=rng.choice([40 * GIB, 0]),
        replicas_per_gpu=rng.choice([None, 2, 4, 8]),
    )
    legacy = rng.choice([0.0, 0.0, 0.0, 0.05])
    deleted = rng.choice([0.0, 0.0, 0.05, 0.2])
    claims = []
    for k in range(rng.randint(0, 34)):
        gone = rng.random() < deleted
        claims.append(
            pod(
                f"p{k}",
                None if rng.random() < legacy else rng.choice([4, 8, 10, 16]),
                shared=rng.choice([1] * 8 + [2, 2, 3, 0]),
                created=NOW - rng.choice([5, 50, 50, 50, 200]),
                terminated=rng.random() < 0.03,
                deleted=gone,
                home=_random_home(rng, count) if gone else None,
            )
        )
    seen = rng.choice([0.0, 0.0, 0.05, 0.15])
    age = rng.choice([1, 1, 200])
    status = None if rng.random() < 0.2 else _random_report(rng, count, claims, age, seen)
    last_good = None if rng.random() < 0.5 else _random_report(rng, count, claims, 300, seen)
    gpus = [None, 0, 0, 1, rng.randrange(count)]  # a few GPUs left more than the others
    departures = tuple(
        sorted(
            ((NOW - rng.choice([1, 20, 40]), rng.choice(gpus)) for _ in range(rng.randint(0, 8))),
            key=lambda departure: departure[0],
        )
    )
    arguments: dict[str, Any] = {
        "now": NOW,
        "margin": MARGIN,
        "stale_after": STALE_AFTER,
        "last_good": last_good,
        "history": History(NOW - 100, departures),
        "numa_seen": None if rng.random() < 0.7 else {g: g % 2 for g in range(count)},
    }
    together = account_node(node, claims, status, **arguments)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accounting, "_capper", _cap_every_gpu)
        patch.setattr(accounting, "_plain_lines", lambda unlocated, seen: {})
        alone = account_node(node, claims, status, **arguments)
    assert together == alone


@pytest.mark.parametrize("unlocated", [3, 7, 8])
def test_gpus_whose_leavers_free_alike_charges_by_unlike_replicas_are_capped_apart(
    unlocated: int,
) -> None:
    # GPU 0 holds a located pair (10 GiB, 2 replicas) and a single (4 GiB); GPU 1 a
    # single (10 GiB) and a pair (4 GiB): the same charges, the same located count and
    # bound, but two replicas gone free 10 GiB on GPU 0 and 4 GiB on GPU 1. The unlocated
    # pods' lines are the same objects on both (no report shows them): capped together
    # only if the key keeps each leaver's replicas. With 7 or 8 of them, the GPUs'
    # accounts differ (60 and 66 GiB; 64 and 66): with 3, not.
    node = replace(a100(2), replicas_per_gpu=8)
    located = [
        pod("a", 10, shared=2, created=NOW - 50),
        pod("b", 4, created=NOW - 50),
        pod("c", 10, created=NOW - 50),
        pod("d", 4, shared=2, created=NOW - 50),
    ]
    free = [pod(f"u{k}", 8, created=NOW - 50) for k in range(unlocated)]
    counts = {0: {"a": 2, "b": 1}, 1: {"c": 1, "d": 2}}
    status = ReportStatus(
        node_name="gpu-a",
        backend="simulated",
        observed_at=datetime.fromtimestamp(NOW - 1, UTC),
        gpus=[
            GPUUsage(
                index=index,
                uuid=f"GPU-{index}",
                total_bytes=40 * GIB,
                used_bytes=0,
                free_bytes=0,
                pods=[
                    PodUsage(uid=uid, used_bytes=GIB, allocated=True, replicas=n)
                    for uid, n in on.items()
                ],
            )
            for index, on in counts.items()
        ],
    )
    arguments: dict[str, Any] = {
        "now": NOW,
        "margin": MARGIN,
        "stale_after": STALE_AFTER,
        "history": History(NOW - 100),
    }
    together = account_node(node, located + free, status, **arguments)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accounting, "_capper", _cap_every_gpu)
        alone = account_node(node, located + free, status, **arguments)
    assert together == alone


def _two_gpus(**changes: Any) -> dict[str, Any]:
    """account_node's arguments: pod ``a`` located on GPU 0, ``b`` (created 50 s ago) not
    located, and a pod that left GPU 1 10 s ago."""
    arguments: dict[str, Any] = {
        "node": a100(2, confirmed=2),
        "claims": [pod("a", 8), pod("b", 8, created=NOW - 50)],
        "report": report({0: {"a": 1}, 1: {}}, allocated={0: {"a"}}),
        "now": NOW,
        "margin": MARGIN,
        "stale_after": STALE_AFTER,
        "history": History(NOW - 100, ((NOW - 10, 1),)),
    }
    return {**arguments, **changes}


def _pair_counted(replicas: int) -> ReportStatus:
    """A fresh report of two GPUs: pod ``a`` allocated GPU 0, ``replicas`` of it counted."""
    counted = report({0: {}, 1: {}})
    usage = PodUsage(uid="a", used_bytes=GIB, allocated=True, replicas=replicas)
    return replace(counted, gpus=[replace(counted.gpus[0], pods=[usage]), counted.gpus[1]])


_PAIR = pod("a", 8, shared=2)
_GONE = pod("b", 8, created=NOW - 50, deleted=True)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # On a node with no unlocated pod, a departure counts for a newcomer while it is
        # FUTURE_TOLERANCE_SECONDS old: then the newcomer may land on GPU 0.
        ({"claims": [pod("a", 8)]}, {"claims": [pod("a", 8)], "now": NOW + 25}),
        # A stale report's note says its age.
        ({"now": NOW + 100}, {"now": NOW + 120}),
        # The history no longer covers b: charged on both GPUs.
        ({}, {"history": History(NOW - 40, ((NOW - 10, 1),))}),
        ({}, {"numa_seen": {0: 0, 1: 1}}),  # GPU 1 on another NUMA node bounds nothing
        ({}, {"margin": 2 * MARGIN}),
        ({}, {"stale_after": 0.5}),
        (
            {"report": None},
            {"report": None, "last_good": report({1: {"b": 20}})},
        ),
        # b force-deleted: charged in full on every GPU, outside the bound.
        ({}, {"claims": [pod("a", 8), _GONE]}),
        # Where it was last placed: charged in full there, not on the other GPU.
        (
            {"claims": [pod("a", 8), replace(_GONE, home=(0,))]},
            {"claims": [pod("a", 8), replace(_GONE, home=(1,))]},
        ),
        # The pair's two replicas counted on GPU 0: located there; one of two: not.
        (
            {"claims": [_PAIR, pod("b", 8, created=NOW - 50)], "report": _pair_counted(2)},
            {"claims": [_PAIR, pod("b", 8, created=NOW - 50)], "report": _pair_counted(1)},
        ),
    ],
    ids=[
        *("departure-window", "stale-age", "history-start", "numa", "margin", "stale"),
        *("last-good", "deleted", "home", "replicas"),
    ],
)
def test_what_changes_an_account_changes_its_key(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    # The extender hands back a node's last account while account_key stays the same
    # (extender.state): whatever changes the account must change the key.
    one, other = _two_gpus(**first), _two_gpus(**second)
    assert account_node(**one) != account_node(**other)
    assert account_key(**one) != account_key(**other)
    assert account_key(**one) == account_key(**_two_gpus(**first))
