"""GPU memory accounting for one node: what is spoken for, and what is left.

Per GPU ``g`` (DESIGN.md §8)::

    accounted(g) = sum over pods charged to g of max(declared, observed) + unattributed(g)
    headroom(g)  = total(g) - accounted(g) - margin

*Observed* is what the node agent's latest GPUNodeReport says the pod holds on
``g``; *unattributed* is memory NVML sees that belongs to no pod; pods the
report shows that Headroom does not know are charged what they hold.

Multi-GPU nodes. The NVIDIA device plugin, not the scheduler, picks which GPU
backs a shared replica, and Headroom cannot steer it. So the rule is:

* a pod the fresh report shows on a GPU (kubelet's allocation, every replica it
  asked for counted: :func:`placed`) is charged to that GPU only; a pod of several
  replicas so located, its whole declaration on each GPU it holds a replica of
  (the declaration is what it may hold on one GPU, headroom.claims), its
  replicas each counted located there in the bound below;
* a pod asking for more than one replica that no report so locates is charged to
  **every** GPU of its node;
* the other shared pods -- bound, not yet located -- are charged where the
  device plugin can have put them: each GPU ``g`` the largest ``x_g`` of them,
  where ``x_g`` is the most its ``distributed`` allocation policy can have put
  on ``g`` (:mod:`headroom.spread`); on a node whose departures since the oldest
  of them was created are not known (``history``), on every GPU. The located
  pods of ``g`` hold ``x_g`` down, but kubelet may already have freed some of
  them (the report shows a pod's end later) or they may leave before kubelet
  admits the next pod: so ``g`` is charged the worst over ``j`` of them gone,
  their ``j`` smallest charges off and the larger ``x_g`` their absence allows on;
* a pod deleted (or ended) before kubelet reported it stopped runs on for its
  grace period, but kubelet's device manager no longer counts its replicas: it
  is charged in full on each GPU a report last placed a replica of it on (all
  its replicas counted), else on every GPU, and is no replica of that bound,
  located or not (:attr:`PodClaim.deleted`);
* a new pod fits only if its declared memory fits the **tightest** GPU
  (:attr:`NodeAccount.tightest`), whichever GPU it gets.

So the memory declared by the pods that can be on a GPU never exceeds that
GPU's total minus the margin, wherever the device plugin puts them.

Missing or stale reports (older than ``stale_after``, or NVML unavailable): the
totals come from the ``nvidia.com/gpu.memory`` label (never above what a stale
report said), every pod is charged to every GPU, by its declaration or by the
most a stale report, the last good one or the figures an agent carries for a
GPU it cannot read saw it hold, whichever is more; nothing a stale report says
can raise headroom above the declarations-only figure.

Shared pods without a declared ``headroom.dev/gpu-memory`` resource (admitted by
Headroom 0.1, which declared by annotation) are *legacy* and charged the whole
of each GPU they may be on; annotations never count, a tenant may patch them.
Other pods without a declaration (MIG, whole-GPU) count by observation only.

MIG pods are counted against slices, not GPU memory: a profile's free slices
are its node capacity minus the slices bound and assumed pods ask for.
"""

from collections.abc import Callable, Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from headroom.claims import PodClaim
from headroom.nodes import NodeGPUs
from headroom.quantity import human_bytes
from headroom.reports import (
    CONDITION_NVML_AVAILABLE,
    MAX_REPLICAS,
    SCHEMA_VERSION,
    GPUUsage,
    PodUsage,
    ReportStatus,
)
from headroom.spread import most_with_gone

Source = Literal["report", "stale-report", "declarations"]
NO_GPU_HEADROOM = -(2**62)
"""Headroom of a node with no usable GPU: less than any pod can need."""
CANNOT_LAND = 2**62
"""Room on a GPU the device plugin cannot give a new pod: it constrains nothing."""
Variant = tuple[int, tuple[int, int] | None]
"""For one ``j`` (:class:`Spread`): how far its charge of the GPU stays below the
charge taken (``slack``), and what a new single-replica pod grows it by there
(``beside``, ``overflow``; None: the device plugin cannot give it this GPU)."""
UNCHANGED: tuple[Variant, ...] = ((0, (0, 0)),)
"""A GPU whose new pod adds exactly its own declaration."""


@dataclass(frozen=True)
class History:
    """What left a node, for the bound on unlocated pods (:mod:`headroom.spread`)."""

    since: float
    """Epoch seconds from which every departure is listed."""
    departures: tuple[tuple[float, int | None], ...] = ()
    """(when, GPU index) of each shared replica that left the node; None where
    it was not located then (it may have left any GPU)."""


@dataclass(frozen=True, slots=True)
class PodCharge:
    """One pod's line on one GPU."""

    uid: str
    key: str
    """``namespace/name``; for a pod only the report knows, ``namespace/name`` as reported."""
    declared: int | None
    observed: int | None
    """None when no (fresh) report shows the pod on this GPU."""
    charged: int
    located: bool
    """True when the report places the pod on this GPU; False when charged everywhere."""
    known: bool = True
    """False for a pod the report shows that the extender's pod cache does not hold."""
    spread: bool = False
    """True when charged here less than it declared, or nothing: the device plugin's
    spreading cannot have put it here together with all the larger unlocated pods
    charged here (headroom.spread)."""


@dataclass(frozen=True, slots=True)
class GPUAccount:
    index: int
    product: str
    total: int
    declared: int
    observed: int
    unattributed: int
    accounted: int
    headroom: int
    pods: tuple[PodCharge, ...] = ()
    shared: bool = True
    """False for a GPU in MIG mode: its memory is sliced, shared pods cannot land on it."""
    room: int | None = None
    """The most a new single-replica shared pod may declare to fit here, counting the
    unlocated pods that could then be here with it (headroom.spread); None: the
    headroom. :data:`CANNOT_LAND` where the device plugin cannot give it this GPU."""

    @property
    def room_for_one(self) -> int:
        return self.headroom if self.room is None else self.room


@dataclass(frozen=True, slots=True)
class MigAccount:
    profile: str
    capacity: int
    used: int
    memory_bytes: int

    @property
    def free(self) -> int:
        return max(self.capacity - self.used, 0)


@dataclass(frozen=True)
class NodeAccount:
    node: str
    source: Source
    note: str
    """Why the figures are less than measured ("" with a fresh report), for reasons."""
    margin: int
    gpus: tuple[GPUAccount, ...] = ()
    mig: Mapping[str, MigAccount] = field(default_factory=dict)
    shared_capacity: int = 0
    stale_at: float | None = None
    """Epoch seconds at which the report behind these figures turns stale."""

    @cached_property
    def tightest(self) -> GPUAccount | None:
        """The shared GPU with the least room for a new pod (lowest index on a tie)."""
        shared = [gpu for gpu in self.gpus if gpu.shared]
        return min(shared, key=lambda gpu: gpu.room_for_one) if shared else None

    # Cached: the filter reads these for every candidate node on every request.

    @cached_property
    def shared_headroom(self) -> int:
        """Headroom a new shared pod can count on, whichever GPU it gets."""
        tightest = self.tightest
        return NO_GPU_HEADROOM if tightest is None else tightest.room_for_one

    @cached_property
    def everywhere_headroom(self) -> int:
        """Headroom on the fullest shared GPU: what a pod charged on every GPU (more
        than one replica) must fit."""
        shared = [gpu.headroom for gpu in self.gpus if gpu.shared]
        return min(shared, default=NO_GPU_HEADROOM)

    @cached_property
    def capped(self) -> bool:
        """Whether the spread bound charges some unlocated pod less than in full here:
        only then can more replicas on the node raise what a GPU is charged."""
        return any(p.spread for gpu in self.gpus for p in gpu.pods)

    @cached_property
    def shared_total(self) -> int:
        """Total memory of the tightest GPU (0 without one), the scale for scores."""
        tightest = self.tightest
        return 0 if tightest is None else tightest.total

    @cached_property
    def tightest_label(self) -> str:
        """``gpu 0 NVIDIA-A100-PCIE-40GB``, and its headroom for people: ``6.0 GiB``."""
        tightest = self.tightest
        if tightest is None:
            return ""
        return f"gpu {tightest.index} {tightest.product}".rstrip()

    @cached_property
    def shared_headroom_text(self) -> str:
        return human_bytes(self.shared_headroom)


def account_node(
    node: NodeGPUs,
    claims: Iterable[PodClaim],
    report: ReportStatus | None,
    *,
    now: float,
    margin: int,
    stale_after: float,
    last_good: ReportStatus | None = None,
    history: History | None = None,
    numa_seen: Mapping[int, Hashable] | None = None,
) -> NodeAccount:
    """Account ``node``'s GPUs for the pods bound or assumed there (``claims``).

    ``now`` is epoch seconds; a report older than ``stale_after`` seconds is stale.
    ``last_good`` is the node's last report that was fresh, readable and measured
    (NVML available) when it came: when ``report`` is not usable, what it observed
    keeps counting -- per pod the most it held, per GPU its unattributed memory --
    until a fresh measured report replaces it. So do the figures ``report`` itself
    carries for GPUs NVML could not read (the agent's last good ones, marked with
    the error), which survive an extender restart. A fault never raises headroom.
    ``numa_seen``: the NUMA grouping of the node's earlier reports (:func:`refine_groups`),
    which the account's own reports may only split further.
    """
    live = [c for c in claims if not c.terminated]
    source, note, stale_at = _freshness(report, now=now, stale_after=stale_after)
    # Only a bound over several GPUs reads the groups (_spread): not worked out per
    # account of a one-GPU node, most of a storm's.
    groups = (
        refine_groups(
            numa_groups(node.count, (r for r in (report, last_good) if r is not None)),
            numa_seen,
        )
        if node.count > 1
        else None
    )
    if node.problems:
        note = "; ".join(filter(None, (note, *node.problems)))
    if report is not None and source == "report":
        report, forged = _believable(node, report)
        note = "; ".join(filter(None, (note, *forged)))
        readable, failed = _readable(node, report)
        gpus = _measured(node, live, readable, margin, history, now, groups)
        if failed:
            # A GPU NVML could not read, or that the report leaves out, is accounted
            # as a stale one, with the figures the agent carries for it (the last it
            # read) as evidence beside the extender's own; the others stay measured.
            evidence = [r for r in (last_good, report) if r is not None]
            declared = _declared_only(node, live, evidence, margin, history, now, groups)
            fallback = {g.index: g for g in declared}
            gpus = [fallback.get(g.index, g) if g.index in failed else g for g in gpus]
            note = "; ".join(filter(None, (note, *(failed[i] for i in sorted(failed)))))
    else:
        evidence = [r for r in (last_good, report) if r is not None]
        gpus = _declared_only(node, live, evidence, margin, history, now, groups)
    mig = {
        profile: MigAccount(
            profile,
            slices.capacity,
            sum(c.mig.get(profile, 0) for c in live),
            slices.memory_bytes,
        )
        for profile, slices in node.mig.items()
    }
    return NodeAccount(
        node=node.name,
        source=source,
        note=note,
        margin=margin,
        gpus=tuple(gpus),
        mig=mig,
        shared_capacity=node.shared_capacity,
        stale_at=stale_at,
    )


def account_key(
    node: NodeGPUs,
    claims: Iterable[PodClaim],
    report: ReportStatus | None,
    *,
    now: float,
    margin: int,
    stale_after: float,
    last_good: ReportStatus | None = None,
    history: History | None = None,
    numa_seen: Mapping[int, Hashable] | None = None,
) -> tuple[object, ...]:
    """What :func:`account_node` answers from, with ``now`` only by what it decides:
    two calls with equal keys return equal accounts, so one worked out for either
    stands for both (extender.state keeps each node's last).

    ``now`` decides three things: the report's freshness (the note says its age),
    which pods the history covers (``created`` before ``since``, or unknown: charged
    on every GPU, :func:`_spread`), and on a node with no unlocated pod, which
    departures count (those of the last FUTURE_TOLERANCE_SECONDS). The last two are
    kept as counts: of two such sets for the same claims or departures, one holds
    the other, so equal counts are equal sets.
    """
    claims = tuple(claims)
    spread: tuple[object, ...] | None = None
    if history is not None:
        since, recent = history.since, now - FUTURE_TOLERANCE_SECONDS
        spread = (
            history.departures,
            sum(1 for c in claims if c.created is None or c.created < since),
            sum(1 for at, _ in history.departures if at >= recent),
        )
    freshness = _freshness(report, now=now, stale_after=stale_after)
    return (node, claims, report, last_good, numa_seen, margin, stale_after, freshness, spread)


DEFAULT_MARGIN_BYTES = 512 * 2**20
"""GPU memory kept free on every GPU unless the extender is told otherwise."""
DEFAULT_STALE_AFTER_SECONDS = 90.0
"""Three agent heartbeats (30 s each): older reports fall back to declarations."""

FUTURE_TOLERANCE_SECONDS = 30.0
"""How far ahead of the extender's clock an agent's observedAt may be and still count."""


def measured(report: ReportStatus, *, now: float, stale_after: float) -> bool:
    """Whether ``report`` is a fresh, readable measurement: one to remember as last good."""
    return _freshness(report, now=now, stale_after=stale_after)[0] == "report"


ReportFault = Literal["missing", "unknown-schema", "nvml-unavailable", "stale", "gpu-unread"]
REPORT_FAULTS: tuple[ReportFault, ...] = (
    "missing",
    "unknown-schema",
    "nvml-unavailable",
    "stale",
    "gpu-unread",
)
"""Why a GPU node is charged by declaration rather than measured (:func:`report_fault`)."""


def report_fault(
    node: NodeGPUs, report: ReportStatus | None, *, now: float, stale_after: float
) -> ReportFault | None:
    """Why :func:`account_node` would not count ``node``'s GPUs as measured, in one word
    (a metric's label), or None when every GPU is: no report, a schema it cannot read,
    NVML unavailable, stale (old or dated in the future), or a fresh report that leaves
    a GPU unread (an NVML error on it, missing, listed twice). Each is charged
    conservatively: pods there may wait, never over-commit."""
    if report is None:
        return "missing"
    source, _, _ = _freshness(report, now=now, stale_after=stale_after)
    if source == "stale-report":
        return "stale"
    if source == "declarations":
        return "unknown-schema" if report.schema_version != SCHEMA_VERSION else "nvml-unavailable"
    return "gpu-unread" if _readable(node, report)[1] else None


def _freshness(
    report: ReportStatus | None, *, now: float, stale_after: float
) -> tuple[Source, str, float | None]:
    fallback = "declarations and labels only"
    if report is None:
        return "declarations", f"no GPUNodeReport from the node agent: {fallback}", None
    if report.schema_version != SCHEMA_VERSION:
        version = report.schema_version
        return "declarations", f"GPUNodeReport schemaVersion {version} unknown: {fallback}", None
    nvml = report.condition(CONDITION_NVML_AVAILABLE)
    if nvml is not None and nvml.status == "False":
        why = nvml.message or nvml.reason or "no reason given"
        return "declarations", f"node agent reports NVML unavailable ({why}): {fallback}", None
    observed = report.observed_at.timestamp()
    age = now - observed
    if age < -FUTURE_TOLERANCE_SECONDS:
        # An agent whose clock runs ahead would otherwise stay "fresh" for the
        # skew plus stale_after after it died.
        note = f"GPUNodeReport is dated {-age:.0f}s in the future (clock skew?): {fallback}"
        return "stale-report", note, None
    if age > stale_after:
        note = f"GPUNodeReport is {age:.0f}s old (stale after {stale_after:.0f}s): {fallback}"
        return "stale-report", note, None
    return "report", "", observed + stale_after


def _measured(
    node: NodeGPUs,
    claims: list[PodClaim],
    report: ReportStatus,
    margin: int,
    history: History | None,
    now: float,
    groups: Mapping[int, Hashable] | None,
) -> list[GPUAccount]:
    reported = {gpu.index: gpu for gpu in report.gpus}
    indices = sorted(set(range(node.count)) | reported.keys())
    known = {c.uid: c for c in claims}
    seen: dict[str, dict[int, int]] = {}
    for gpu in report.gpus:
        for usage in _holders(gpu):
            where = seen.setdefault(usage.uid, {})
            where[gpu.index] = where.get(gpu.index, 0) + usage.used_bytes
    shared_indices = [i for i in indices if not (i in reported and reported[i].mig_enabled)]
    # The device plugin hands no replica of a GPU in MIG mode: a pod the report places
    # on one (its flag or the placement is wrong) is not located, and so is charged on
    # the shared GPUs, not kept off every GPU a newcomer is checked against.
    sharing = set(shared_indices)
    # Located where kubelet's allocations hold every replica the pod asks for: a pod
    # of several replicas only where the report counts them all (:func:`placed`).
    home = {
        uid: where
        for uid, where in placed(report).items()
        if uid in known
        and not known[uid].deleted
        and known[uid].shared == sum(where.values())
        and all(index in sharing for index in where)
    }
    located = set(home)

    def total(index: int) -> int:
        usage = reported.get(index)
        return usage.total_bytes if usage is not None and usage.total_bytes else node.memory_bytes

    located_on: dict[int, list[str]] = {}  # a pod once per replica it holds there
    for uid, where in home.items():
        for index, count in where.items():
            located_on.setdefault(index, []).extend([uid] * count)
    unlocated = [c for c in claims if c.shared and c.uid not in located and not c.deleted]
    limits = _spread(
        unlocated, shared_indices, located_on, history, now, node.confirmed, groups,
        node.replicas_per_gpu,
        foreign_replicas([report], known) if len(shared_indices) > 1 else None,
    )  # fmt: skip
    growth: dict[int, list[Variant]] = {}
    charges: dict[int, list[PodCharge]] = {i: [] for i in indices}
    leavers: dict[int, list[tuple[int, int]]] = {}
    for claim in claims:
        where = seen.get(claim.uid, {})
        if claim.deleted and claim.shared:
            for index, line in _deleted_charges(claim, node, shared_indices, where, total):
                charges.setdefault(index, []).append(line)
        elif claim.uid in located:
            given = home[claim.uid]
            for index, used in where.items():
                if index in given:
                    # All it declares, on each GPU it holds a replica of: the declaration
                    # is what the pod may hold on one GPU (headroom.claims).
                    charge = max(_need(claim, node, total(index)), used)
                    leavers.setdefault(index, []).append((charge, given[index]))
                else:  # memory it holds on a GPU kubelet did not give it: what it holds
                    charge = used
                charges.setdefault(index, []).append(_charge(claim, used, charge, True))
        elif not claim.shared:
            # A MIG or whole-GPU pod seen on the GPU's own memory: charge what it holds.
            for index, used in where.items():
                charges.setdefault(index, []).append(_charge(claim, used, used, True))
    nothing: dict[int, int] = {}
    cap = _capper(unlocated, limits)
    plain = _plain_lines(unlocated, seen) if limits is not None else {}
    for index in shared_indices:
        lines: list[PodCharge] = []
        held: list[PodCharge] = []
        gpu_total = total(index)
        for claim in unlocated:  # the hot loop of an 8-GPU node's account
            made = plain.get(claim.uid)
            if made is not None:
                lines.append(made)
                continue
            on = seen.get(claim.uid, nothing)
            used = on.get(index, 0)
            if claim.shared == 1 and used:
                # Not located, yet holding memory here (on no GPU kubelet listed for
                # it): the memory counts here whatever the bound says about the pod.
                held.append(_charge(claim, used, used, True))
                used = 0
            charge = max(_need(claim, node, gpu_total), used)
            observed = used if index in on else None
            lines.append(PodCharge(claim.uid, claim.key, claim.declared, observed, charge, False))
        capped, growth[index], _, _ = cap(lines, index, leavers.get(index, ()))
        charges[index].extend(capped)
        charges[index].extend(held)
    for gpu in report.gpus:
        for usage in _holders(gpu):
            if usage.uid not in known:
                key = f"{usage.namespace}/{usage.name}" if usage.name else usage.uid
                used = usage.used_bytes
                charges[gpu.index].append(PodCharge(usage.uid, key, None, used, used, True, False))
    return [
        _gpu(
            index,
            reported.get(index),
            node,
            charges.get(index, []),
            margin,
            shared=index in shared_indices,
            growth=growth.get(index, UNCHANGED),
        )
        for index in sorted(charges)
    ]


def _deleted_charges(
    claim: PodClaim,
    node: NodeGPUs,
    shared_indices: Iterable[int],
    held: Mapping[int, int],
    total: Callable[[int], int],
    most: int = 0,
) -> list[tuple[int, PodCharge]]:
    """A shared pod deleted before kubelet reported it stopped (:attr:`PodClaim.deleted`),
    per GPU: in full -- its declaration, or more where a report saw it hold more (``held``
    per GPU, ``most`` anywhere) -- on each GPU a report last placed a replica of it on
    (:attr:`PodClaim.home`: every replica counted, :func:`placed`), else on every shared
    GPU; what it holds on another GPU, as held. A pod of several replicas may hold all
    it declares on each GPU it holds one of, as a located one is charged.

    Its containers may run out its grace period, free to use all it declared, while
    kubelet's device manager no longer counts its replicas (kubelet's active pods leave
    out force-deleted ones, kubernetes#104824): the device plugin may give its GPU to
    newcomers as if it were empty. So it is no replica of the bound on where the
    allocator put the other pods (its departure is one, recorded as it left), and is
    charged where it may run, not where that bound says it can be."""
    indices = set(shared_indices)
    # Only where every GPU it was placed on is still a shared one: else anywhere.
    home = set(claim.home or ())
    full = home if home and home <= indices else indices
    lines = []
    for index in sorted(full | held.keys()):
        used = held.get(index, 0)
        if index in full:
            charge = max(_need(claim, node, total(index)), most, used)
            lines.append((index, _charge(claim, used or None, charge, index in home)))
        elif used:
            lines.append((index, _charge(claim, used, used, True)))
    return lines


def _plain_lines(unlocated: list[PodClaim], seen: Container[str]) -> dict[str, PodCharge]:
    """UID -> the line on every GPU of an unlocated pod the report shows on none (not
    ``seen``), not legacy: its need, observed nowhere (what :func:`_measured` would make
    for each GPU). Made once, so that the GPUs whose lines are all such share their
    capping (:func:`_capper`)."""
    return {
        c.uid: PodCharge(c.uid, c.key, c.declared, None, c.need, False)
        for c in unlocated
        if not c.legacy and c.uid not in seen
    }


def _holders(gpu: GPUUsage) -> list[PodUsage]:
    """The pods a report shows holding memory on ``gpu``: its own, and those of its MIG
    devices. Their memory is the GPU's, and the agent does not count it unattributed.
    A GPU read as shared despite its MIG flag (:func:`_believable`), or the slices the
    device plugin shares under MIG strategy ``single`` (GFD counts each slice as a
    GPU), would otherwise charge them nothing for it. Where pods are placed stays the
    GPU's own pods' (:func:`_placements`)."""
    if not gpu.mig_devices:
        return gpu.pods
    return [*gpu.pods, *(usage for device in gpu.mig_devices for usage in device.pods)]


def foreign_replicas(reports: Iterable[ReportStatus], known: Container[str]) -> dict[int, int]:
    """GPU index -> the replicas of pods not in ``known`` that a report shows held there
    (the most any of ``reports`` shows): a pod's count where the report gives one, else
    one per GPU it is placed on as :func:`homes` places pods; at most
    :data:`~headroom.reports.MAX_REPLICAS` a GPU, so a forged count costs no memory.

    A pod the watch has not delivered yet, or one deleted from the API longer ago
    than the departures are kept that kubelet still runs, holds its replicas all the
    same (:func:`_spread`).
    """
    most: dict[int, int] = {}
    for report in reports:
        count: dict[int, int] = {}
        for uid, where in _placements(report).items():
            if uid not in known:
                for index, replicas in where.items():
                    count[index] = count.get(index, 0) + (replicas or 1)
        for index, n in count.items():
            most[index] = min(max(most.get(index, 0), n), MAX_REPLICAS)
    return most


def homes(report: ReportStatus) -> dict[str, int]:
    """Pod UID -> the one GPU the report places it on, for pods it places.

    Where the report lists kubelet's allocations (the agent reads PodResources), a
    pod is placed by its allocation alone, and only if that is one GPU: memory it
    holds elsewhere (a pod reaching other GPUs through ``NVIDIA_VISIBLE_DEVICES``)
    says nothing about where the device plugin counted its replica. A report that
    lists no allocation at all (an agent without PodResources, or older than
    ``allocated``) places a pod where it holds memory, if on one GPU only.
    """
    return {uid: min(where) for uid, where in _placements(report).items() if len(where) == 1}


def placed(report: ReportStatus) -> dict[str, dict[int, int]]:
    """Pod UID -> GPU index -> how many of its replicas kubelet allocated it there, for
    the pods the report places with every replica counted: where each GPU the report
    lists it allocated counts its replicas (``PodUsage.replicas``), those counts; where
    none does (an agent older than the counts) or the report lists no allocation at
    all, a pod :func:`homes` places, one replica there (a one-replica pod, as before).
    A pod counted on some of its GPUs and not others is left out.

    The accounting locates a pod whose counts add up to the replicas it asks for: the
    agent counts the replicas of its app containers and sidecars, which kubelet
    lists, and any replica of a plain init container they do not reuse is one more
    than they add up to (agent.allocations.replicas_by_gpu), so the pod stays
    unlocated, charged where the device plugin can have put it.
    """
    found: dict[str, dict[int, int]] = {}
    for uid, where in _placements(report).items():
        counts = list(where.values())
        if all(count is not None for count in counts):
            found[uid] = {index: count for index, count in where.items() if count is not None}
        elif len(where) == 1 and counts == [None]:
            found[uid] = {min(where): 1}
    return found


def placed_as_read(node: NodeGPUs, report: ReportStatus) -> dict[str, dict[int, int]]:
    """:func:`placed`, reading ``report`` as the accounting does (:func:`account_node`):
    not on a GPU the node's labels rule out (:func:`_believable`), NVML could not read
    or the report lists twice (:func:`_readable`: which GPU each reading is, is not
    known, and two GPUs' counts listed under one index add up to a pod's replicas
    there), nor on a GPU in MIG mode; a pod with a replica on such a GPU is left out.
    Where a pod leaves from (extender.state), and where a deleted one may run on.

    Placed from the whole report, then left out, not placed from what is left: with
    the GPUs kubelet allocated pods on unread, what is left may list no allocation,
    and :func:`placed` would fall back to where pods hold memory (:func:`homes`),
    placing a pod on a GPU it was not given and off the one it runs on."""
    believed, _ = _believable(node, report)
    readable, _ = _readable(node, believed)
    shared = {gpu.index for gpu in readable.gpus if not gpu.mig_enabled}
    return {uid: where for uid, where in placed(believed).items() if where.keys() <= shared}


def _placements(report: ReportStatus) -> dict[str, dict[int, int | None]]:
    """Pod UID -> the GPUs kubelet allocated it, with its replicas counted on each (None:
    not counted), where the report lists allocations; else the GPUs it holds memory on,
    uncounted (:func:`homes`). A pod listed twice on one GPU (an agent fault) has the
    counts added: they then add up to more than it asked for, not fewer."""
    allocated: dict[str, dict[int, int | None]] = {}
    held: dict[str, dict[int, int | None]] = {}
    for gpu in report.gpus:
        for usage in gpu.pods:
            if usage.allocated:
                where = allocated.setdefault(usage.uid, {})
                if gpu.index in where:
                    before = where[gpu.index]
                    where[gpu.index] = (
                        None
                        if before is None or usage.replicas is None
                        else before + usage.replicas
                    )
                else:
                    where[gpu.index] = usage.replicas
            if usage.used_bytes:
                held.setdefault(usage.uid, {})[gpu.index] = None
    return allocated or held


def _readable(node: NodeGPUs, report: ReportStatus) -> tuple[ReportStatus, dict[int, str]]:
    """The report without the GPUs NVML failed to read, and why for each GPU it did
    not measure: an NVML error, or missing from the report.

    A GPU of the node that a fresh report leaves out (an agent bug, NVML listing
    7 of 8, a forgery) was not measured empty: it is read as one NVML failed to
    read, so that what was last seen on it keeps counting.
    """
    failed = {
        gpu.index: f"NVML error on GPU {gpu.index}: {gpu.error}" for gpu in report.gpus if gpu.error
    }
    listed = {gpu.index for gpu in report.gpus}
    for index in range(node.count):
        if index not in listed:
            failed[index] = f"GPU {index} missing from the GPUNodeReport"
    twice = listed_twice(report)
    for index in twice:
        failed[index] = f"GPU {index} listed twice in the GPUNodeReport (its index or UUID)"
    if any(gpu.error or gpu.index in twice for gpu in report.gpus):
        report = replace(
            report, gpus=[g for g in report.gpus if not g.error and g.index not in twice]
        )
    return report, failed


def listed_twice(report: ReportStatus) -> set[int]:
    """The GPU indices a report lists more than once, or under a UUID it also gives
    another index: an agent fault, which of the readings is the GPU's is unknown."""
    first: dict[object, int] = {}
    twice: set[int] = set()
    for gpu in report.gpus:
        for key in (("index", gpu.index), ("uuid", gpu.uuid) if gpu.uuid else None):
            if key is None:
                continue
            if key in first:
                twice.update((first[key], gpu.index))
            else:
                first[key] = gpu.index
    return twice


def _believable(node: NodeGPUs, report: ReportStatus) -> tuple[ReportStatus, list[str]]:
    """The report without what the node's labels and capacity rule out, and why.

    GPU Feature Discovery's labels and the device plugin's capacity are written
    on the node by the node's own operator; a report is written by an agent. A
    GPU index beyond both ``nvidia.com/gpu.count`` and the GPUs the device
    plugin offers would let a forged report "locate" pods on a GPU that does
    not exist (and so off the real ones): such GPUs are dropped; no shared pod
    can be given one anyway. A total above ``nvidia.com/gpu.memory`` is capped
    at the label (``_gpu``). A GPU said to be in MIG mode (no shared GPU: no
    shared pod is checked against it) is not believed on a node whose labels and
    capacity say the device plugin shares every GPU (``replicas_per_gpu``).
    """
    problems = []
    gpus = report.gpus
    if node.count > 0 and any(gpu.index >= node.count for gpu in gpus):
        gpus = [gpu for gpu in gpus if gpu.index < node.count]
        problems.append(
            f"GPUNodeReport lists GPUs beyond the node's {node.count} "
            "(nvidia.com/gpu.count, nvidia.com/gpu.shared capacity)"
        )
    if node.memory_bytes > 0 and any(gpu.total_bytes > node.memory_bytes for gpu in gpus):
        problems.append("GPUNodeReport totals above nvidia.com/gpu.memory are not trusted")
    flagged = sum(1 for gpu in gpus if gpu.mig_enabled)
    if flagged and node.replicas_per_gpu is not None:
        # A GPU in MIG mode is no shared GPU: no newcomer is checked against it. But the
        # labels and capacity say the device plugin shares every GPU of this node (no
        # MIG slice offered, count x replicas shared), so it may give a pod that GPU.
        gpus = [replace(gpu, mig_enabled=False) if gpu.mig_enabled else gpu for gpu in gpus]
        problems.append(
            f"GPUNodeReport puts {flagged} GPU(s) in MIG mode, but the node offers no MIG "
            f"slice and shares all {node.count} in nvidia.com/gpu.shared: accounted as shared"
        )
    if gpus is not report.gpus:
        report = replace(report, gpus=gpus)
    return report, problems


def _declared_only(
    node: NodeGPUs,
    claims: list[PodClaim],
    evidence: list[ReportStatus],
    margin: int,
    history: History | None,
    now: float,
    groups: Mapping[int, Hashable] | None,
) -> list[GPUAccount]:
    """Declarations and the label, plus whatever the reports in ``evidence`` observed.

    Every shared pod is unlocated (where it runs is not known any more) and
    charged, on each GPU it may be on (:func:`_spread`), the larger of its
    declaration and the most any report saw it hold. What a report saw it hold
    on a GPU stays charged there whether or not the pod is, uncapped (a pod may
    hold memory on a GPU kubelet did not give it); its capped line there is the
    rest. Pods the reports show that are not shared pods of the cache (a MIG or
    whole-GPU pod, one the cache does not hold), and each GPU's unattributed
    memory, count where and as much as last observed. Totals never exceed the
    label or any report's.
    """
    most_seen: dict[str, int] = {}
    seen_on: dict[int, dict[str, int]] = {}
    strangers: dict[int, dict[str, tuple[str, int]]] = {}
    unattributed: dict[int, int] = {}
    report_totals: dict[int, int] = {}
    known = {c.uid for c in claims if c.shared}
    for status in evidence:
        for gpu in status.gpus:
            if node.count > 0 and gpu.index >= node.count:
                continue
            if gpu.total_bytes:
                report_totals[gpu.index] = min(
                    report_totals.get(gpu.index, gpu.total_bytes), gpu.total_bytes
                )
            unattributed[gpu.index] = max(unattributed.get(gpu.index, 0), gpu.unattributed_bytes)
            for usage in _holders(gpu):
                most_seen[usage.uid] = max(most_seen.get(usage.uid, 0), usage.used_bytes)
                if usage.uid in known and usage.used_bytes:
                    on_gpu_seen = seen_on.setdefault(gpu.index, {})
                    on_gpu_seen[usage.uid] = max(on_gpu_seen.get(usage.uid, 0), usage.used_bytes)
                if usage.uid not in known:
                    key = f"{usage.namespace}/{usage.name}" if usage.name else usage.uid
                    on_gpu = strangers.setdefault(gpu.index, {})
                    held = max(on_gpu.get(usage.uid, (key, 0))[1], usage.used_bytes)
                    on_gpu[usage.uid] = (key, held)
    shared = [c for c in claims if c.shared and not c.deleted]
    deleted = [c for c in claims if c.shared and c.deleted]
    limits = _spread(
        shared, list(range(node.count)), {}, history, now, node.confirmed, groups,
        node.replicas_per_gpu, foreign_replicas(evidence, known) if node.count > 1 else None,
    )  # fmt: skip
    gpus = []
    # Every GPU's lines are alike but for a legacy pod's (the GPU's total): made once.
    alike = [
        None
        if c.legacy
        else PodCharge(c.uid, c.key, c.declared, None, max(c.need, most_seen.get(c.uid, 0)), False)
        for c in shared
    ]
    cap = _capper(shared, limits)

    def gpu_total(index: int) -> int:
        total = node.memory_bytes
        if index in report_totals:
            total = min(total, report_totals[index]) if total else report_totals[index]
        return total

    stray: dict[int, list[PodCharge]] = {}
    for claim in deleted:
        on_gpus = {i: on[claim.uid] for i, on in seen_on.items() if claim.uid in on}
        most = most_seen.get(claim.uid, 0)
        for i, line in _deleted_charges(claim, node, range(node.count), on_gpus, gpu_total, most):
            stray.setdefault(i, []).append(line)
    for index in range(node.count):
        total = gpu_total(index)
        lines = [
            line
            if line is not None
            else _charge(c, None, max(_need(c, node, total), most_seen.get(c.uid, 0)), False)
            for c, line in zip(shared, alike, strict=True)
        ]
        here = seen_on.get(index, {})
        if here:
            # Seen here: that much stays here, uncapped; the capped line is the rest.
            lines = [
                replace(line, charged=max(0, line.charged - here[line.uid]))
                if line.uid in here
                else line
                for line in lines
            ]
        pods, growth, declared, charged = cap(lines, index, ())
        more = []
        if here:
            more = [_charge(c, here[c.uid], here[c.uid], True) for c in shared if c.uid in here]
        more += stray.get(index, [])
        # Foreign processes and pods the cache does not hold stay where they were seen.
        more += [
            PodCharge(uid, key, None, held, held, True, False)
            for uid, (key, held) in strangers.get(index, {}).items()
        ]
        if more:
            pods += tuple(more)
            declared += _declared(more)
            charged += sum(p.charged for p in more)
        spare = unattributed.get(index, 0)
        accounted = charged + spare
        gpus.append(
            GPUAccount(
                index,
                node.product,
                total,
                declared,
                0,
                spare,
                accounted,
                total - accounted - margin,
                pods,
                room=_room(total - accounted - margin, growth),
            )
        )
    return gpus


def _gpu(
    index: int,
    usage: GPUUsage | None,
    node: NodeGPUs,
    pods: list[PodCharge],
    margin: int,
    *,
    shared: bool,
    growth: Sequence[Variant] = UNCHANGED,
) -> GPUAccount:
    total = usage.total_bytes if usage is not None and usage.total_bytes else node.memory_bytes
    if node.memory_bytes > 0:
        total = min(total, node.memory_bytes)  # a report never makes a GPU larger than its label
    product = node.product or (usage.product if usage is not None else "")
    unattributed = usage.unattributed_bytes if usage is not None else 0
    accounted = sum(p.charged for p in pods) + unattributed
    return GPUAccount(
        index=index,
        product=product,
        total=total,
        declared=_declared(pods),
        observed=sum(p.observed or 0 for p in pods),
        unattributed=unattributed,
        accounted=accounted,
        headroom=total - accounted - margin,
        pods=tuple(pods),
        shared=shared,
        room=_room(total - accounted - margin, growth),
    )


@dataclass(frozen=True)
class Spread:
    """Per shared GPU, the most single-replica unlocated pods it can hold, indexed by
    ``j``, the number of its located pods taken to be gone (``0..own``): ``now`` for
    the pods on the node, ``next`` with one more (a pod the filter asks about)."""

    now: Mapping[int, tuple[int, ...]]
    next: Mapping[int, tuple[int, ...]]


def _spread(
    unlocated: list[PodClaim],
    shared_indices: list[int],
    located: Mapping[int, list[str]],
    history: History | None,
    now: float,
    confirmed: int,
    groups: Mapping[int, Hashable] | None = None,
    per_gpu: int | None = None,
    foreign: Mapping[int, int] | None = None,
) -> Spread | None:
    """:class:`Spread` for the node, or None: every unlocated pod on every GPU.

    ``located`` lists the located pods per GPU, a pod once per replica it holds
    there (each is a located replica: ``o_g``, ``c_h``). The bound needs a history that
    covers every unlocated pod's life on the node (headroom.spread), and no
    more shared GPUs than the node's label and device plugin both show
    (``confirmed``): the device plugin spreads pods over the GPUs it has, and
    counting a phantom one would put fewer on each real one than it can.

    ``per_gpu`` (:attr:`NodeGPUs.replicas_per_gpu`), where known, caps every GPU
    with or without the bound: it holds at most that many replicas at once, its
    located pods still allocated among them. None where neither applies, and
    with no ``history`` at all (``--device-plugin-policy unknown``: everywhere).

    A GPU's own located pods raise the level its newcomers must have reached,
    so they hold ``x_g`` down -- only while kubelet still holds them allocated.
    Kubelet frees a pod's replica when its containers end, before the report
    (or the API) shows it; and a located pod may leave between a new pod's
    bind and kubelet admitting it. So the bound is kept for every ``j`` of
    them gone: ``own - j`` located, with their memory gone too (:func:`_cap`).
    Located pods of the other GPUs only ever raise their bounds: a pod gone
    from one is counted there still, which charges more.

    ``foreign`` (:func:`foreign_replicas`): per GPU, the replicas a report shows
    held by pods the cache does not know. Held all the same, they raise what the
    other GPUs' newcomers are bounded by; on their own GPU they hold nothing down.

    ``groups`` (:func:`numa_groups`): with kubelet's Topology Manager on, kubelet
    offers the device plugin only the GPUs of one NUMA node, so a GPU is bounded
    only by the GPUs of its own NUMA node; None: by every GPU.
    """
    if len(shared_indices) < 2:
        return None
    created = [c.created for c in unlocated]
    bounded = (
        len(shared_indices) <= confirmed
        and history is not None
        and all(at is not None and at >= history.since for at in created)
    )
    if history is None or (not bounded and per_gpu is None):
        return None  # no history kept: the device plugin's policy is unknown
    replicas = sum(c.shared for c in unlocated)
    bounds: dict[int, int] = {}
    anywhere = 0
    if bounded and history is not None:
        window = min((at for at in created if at is not None), default=now)
        left: dict[int | None, int] = {}
        for at, index in history.departures:
            # Departures carry the extender's clock, creations the apiserver's: one a
            # clock skew (the tolerance reports get) before the window still counts;
            # more departures only ever charge more.
            if at >= window - FUTURE_TOLERANCE_SECONDS:
                left[index] = left.get(index, 0) + 1
        foreign = foreign or {}
        bounds = {
            h: len(located.get(h, ())) + left.get(h, 0) + foreign.get(h, 0) for h in shared_indices
        }
        anywhere = left.get(None, 0)

    # A GPU's answers depend on its group's counts but its own, and on its own located
    # pods: GPUs alike in those (most of a node's) share them.
    peers_of: dict[Hashable, dict[int, int]] = {}
    if groups is not None:
        for h, count in bounds.items():
            peers_of.setdefault(groups.get(h, h), {})[h] = count
    answers: dict[tuple[Hashable, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    most: dict[int, tuple[int, ...]] = {}
    more: dict[int, tuple[int, ...]] = {}
    for g in shared_indices:
        own = len(located.get(g, ()))
        group = None if groups is None else groups.get(g, g)
        alike = (group, bounds.get(g, 0), own)
        if alike in answers:
            most[g], more[g] = answers[alike]
            continue
        if bounded:
            peers = bounds if groups is None else peers_of[group]
            most[g] = most_with_gone(g, replicas, peers, anywhere, own)
            more[g] = most_with_gone(g, replicas + 1, peers, anywhere, own, least=most[g])
        else:
            most[g], more[g] = (replicas,) * (own + 1), (replicas + 1,) * (own + 1)
        if per_gpu is not None:
            # No GPU holds more than its replicas at once: with j of its own located
            # pods freed, per_gpu - (own - j) for the unlocated (the new pod included).
            most[g] = tuple(min(x, max(0, per_gpu - own + j)) for j, x in enumerate(most[g]))
            more[g] = tuple(min(x, max(0, per_gpu - own + j)) for j, x in enumerate(more[g]))
        answers[alike] = most[g], more[g]
    return Spread(now=most, next=more)


def numa_groups(count: int, reports: Iterable[ReportStatus]) -> dict[int, Hashable] | None:
    """Which of the node's GPUs kubelet may offer the device plugin together: GPU index
    -> a key equal for GPUs on one NUMA node by every report that says; None where the
    reports give no NUMA node (one group: the Topology Manager cannot filter by it);
    with no report at all (a node its agent has not reported yet), every GPU alone.

    kubelet's Topology Manager (any policy but the default ``none``) asks for one
    NUMA node's devices first (devicemanager ``filterByAffinity``): a one-replica pod
    gets a replica of the lowest NUMA node with one free, spread only over that node's
    GPUs. The NVIDIA device plugin gives each replica its GPU's NUMA node. So a GPU is
    bounded only by its own NUMA node's GPUs; one whose node a report leaves out
    (none, or not read) while others have one is bounded by no other. Grouping
    GPUs apart only loosens the bound, so this holds with the Topology Manager off.
    """
    reports = list(reports)
    if not reports:
        return {index: ("alone", index) for index in range(count)}
    keys: dict[int, tuple[object, ...]] = dict.fromkeys(range(count), ())
    told = False
    for report in reports:
        numa = {gpu.index: gpu.numa_node for gpu in report.gpus}
        if all(node is None for node in numa.values()):
            continue
        told = True
        for index, key in keys.items():
            node = numa.get(index)
            keys[index] = (*key, ("alone", index) if node is None else node)
    return dict(keys) if told else None


def refine_groups(
    groups: Mapping[int, Hashable] | None, other: Mapping[int, Hashable] | None
) -> dict[int, Hashable] | None:
    """GPUs grouped together only where both groupings do (None: one group); a GPU
    one of them leaves out stands alone. Grouping apart only charges more."""
    if groups is None or other is None:
        kept = groups if other is None else other
        return None if kept is None else dict(kept)
    ids: dict[tuple[Hashable, Hashable], int] = {}
    return {
        index: ids.setdefault(
            (groups.get(index, ("alone", index)), other.get(index, ("alone", index))), len(ids)
        )
        for index in sorted(groups.keys() | other.keys())
    }


Capped = tuple[tuple[PodCharge, ...], list[Variant], int, int]
"""What :func:`_capper` gives a GPU: its capped lines, their variants, and what they
declare and are charged in all."""


def _capper(
    unlocated: list[PodClaim], spread: Spread | None
) -> Callable[[list[PodCharge], int, Iterable[tuple[int, int]]], Capped]:
    """:func:`_cap` for the GPUs of one account, worked out once for GPUs whose lines
    are the very same objects, with the same bound and leavers (each located pod's
    charge and replicas there, as a set: :func:`_least_freed` sorts them): it reads
    nothing else of a GPU; a deleted pod's lines are not among them. Made once, a pod's
    line is the same on every GPU where nothing sets it apart (its need; no report
    shows it), so the GPUs of a node no report locates a pod on are capped once, not
    once each (8 times the work on an 8-GPU node)."""
    if spread is None:
        return _uncapped  # every line in full (a node of one GPU): nothing to share
    replicas = {c.uid: c.shared for c in unlocated}
    kept: dict[Hashable, Capped] = {}
    alive: list[list[PodCharge]] = []  # the lines kept: no id in a key is reused

    def cap(lines: list[PodCharge], index: int, leavers: Iterable[tuple[int, int]]) -> Capped:
        bound = (spread.now.get(index), spread.next.get(index))
        gone = tuple(sorted(leavers))  # _least_freed reads them sorted
        key = (tuple(map(id, lines)), bound, gone)
        answer = kept.get(key)
        if answer is None:
            capped, growth = _cap(lines, unlocated, spread, index, gone, replicas=replicas)
            answer = (tuple(capped), growth, _declared(capped), sum(p.charged for p in capped))
            kept[key] = answer
            alive.append(lines)
        return answer

    return cap


def _uncapped(lines: list[PodCharge], index: int, leavers: Iterable[tuple[int, int]]) -> Capped:
    """:func:`_cap` with no bound (``spread`` None): every line in full."""
    return tuple(lines), list(UNCHANGED), _declared(lines), sum(p.charged for p in lines)


def _cap(
    lines: list[PodCharge],
    unlocated: list[PodClaim],
    spread: Spread | None,
    index: int,
    leavers: Iterable[tuple[int, int]] = (),
    *,
    replicas: Mapping[str, int] | None = None,
) -> tuple[list[PodCharge], list[Variant]]:
    """The unlocated pods' lines on GPU ``index``, and per ``j`` (:class:`Spread`)
    the :data:`Variant` a new single-replica pod is checked against.

    ``leavers`` are the located pods ``spread`` counted on the GPU: each one's
    charge here and its replicas here. With ``j`` of their replicas gone -- the
    pods that free the least, :func:`_least_freed` -- the largest
    ``spread.now[index][j]`` single-replica lines can be here. The
    GPU is charged the worst ``j``: the largest lines in full, as many as that
    takes (the last in part), the rest 0 (they cannot all be here);
    multi-replica pods in full. With one more pod, ``m = spread.next[index][j]``
    of them can be here: the new pod fits if, for every ``j``, it fits beside
    the largest ``m - 1`` and the largest ``m`` fit anyway.
    """
    if spread is None:
        return lines, list(UNCHANGED)
    if replicas is None:  # the same for every GPU of the node: callers may make it once
        replicas = {c.uid: c.shared for c in unlocated}
    ranked = sorted(
        (line for line in lines if replicas.get(line.uid) == 1),
        key=lambda line: (-line.charged, line.uid),
    )
    top = [0]
    for line in ranked:
        top.append(top[-1] + line.charged)
    last = len(ranked)  # the bounds count multi-replica pods' replicas too
    nows = [min(now, last) for now in spread.now.get(index, (last,))]
    nexts = [min(more, last + 1) for more in spread.next.get(index, (last + 1,))]
    top.append(top[-1])  # the new pod itself adds its own need, not a line's
    freed = _least_freed(leavers, len(nows) - 1)
    here = [top[now] - freed[j] for j, now in enumerate(nows)]
    worst = max(here)
    budget, charged = worst, {}
    for line in ranked:
        charged[line.uid] = min(line.charged, budget)
        budget -= charged[line.uid]
    capped = [
        line
        if replicas.get(line.uid, 1) != 1 or charged[line.uid] == line.charged
        else PodCharge(  # not dataclasses.replace: a third of an 8-GPU account's time
            line.uid,
            line.key,
            line.declared,
            line.observed,
            charged[line.uid],
            line.located,
            line.known,
            True,
        )
        for line in lines
    ]
    variants: list[Variant] = []
    for j, (now, more) in enumerate(zip(nows, nexts, strict=True)):
        slack = worst - here[j]
        if more == 0:
            variants.append((slack, None))
        else:
            variants.append((slack, (top[more - 1] - top[now], top[more] - top[now])))
    return capped, variants


def _least_freed(leavers: Iterable[tuple[int, int]], most: int) -> list[int]:
    """For ``j`` in ``0..most``: the least charge that located pods holding at least
    ``j`` of the GPU's replicas free by leaving (``leavers``: each one's charge and
    replicas here). A pod's replicas leave together: kubelet frees them when the pod
    stops. Every way of ``j`` replicas leaving frees at least this, so charging the
    bound for ``j`` gone less this charges no less than any of them; a ``j`` no set of
    pods adds up to is charged as the fewer of a larger set, which the worst covers.

    With one replica each, the ``j`` smallest charges; otherwise the smallest total
    over the sets of pods (a knapsack over at most ``most`` replicas)."""
    items = sorted(leavers)
    if all(count == 1 for _, count in items):
        freed = [0]
        for charge, _ in items[:most]:
            freed.append(freed[-1] + charge)
        return freed
    # least[t]: the least charge of pods holding exactly t replicas, t capped at most.
    unreachable = CANNOT_LAND
    least = [0] + [unreachable] * most
    for charge, count in items:
        for t in range(most, -1, -1):
            if least[t] == unreachable:
                continue
            to = min(t + count, most)
            least[to] = min(least[to], least[t] + charge)
    for t in range(most - 1, -1, -1):  # at least t: the least of t and more
        least[t] = min(least[t], least[t + 1])
    return least


def _room(headroom: int, growth: Sequence[Variant]) -> int:
    """Room on a GPU for one more single-replica pod (see :func:`_cap`): the least
    over its variants."""
    return min(_room_one(headroom + slack, more) for slack, more in growth)


def _room_one(headroom: int, growth: tuple[int, int] | None) -> int:
    if growth is None:
        return CANNOT_LAND
    beside, overflow = growth
    if headroom - overflow < 0:
        return headroom - overflow  # the node is over already, with one more here
    return headroom - beside


def _declared(pods: Iterable[PodCharge]) -> int:
    """What the pods charged here declared: a line the spread bound charges in part
    or not at all counts as much as it is charged."""
    return sum(min(p.declared or 0, p.charged) if p.spread else (p.declared or 0) for p in pods)


def _need(claim: PodClaim, node: NodeGPUs, gpu_total: int) -> int:
    """What a pod is charged at least: its declaration, or a legacy pod's whole GPU.

    A legacy pod (shared, admitted by Headroom 0.1 with an annotation only) has
    no immutable declaration; charging it the GPU -- as large as the label or a
    report says, whichever is more, so no report can shrink it -- keeps the
    promise until it is recreated through the webhook.
    """
    return max(node.memory_bytes, gpu_total) if claim.legacy else claim.need


def _charge(claim: PodClaim, observed: int | None, charged: int, located: bool) -> PodCharge:
    return PodCharge(claim.uid, claim.key, claim.declared, observed, charged, located)
