"""What the extender knows: GPU nodes, GPU pods, agent reports, and pods being bound.

Fed by the informers' event handlers (on the event loop) and read by the verbs
on the same loop, so nothing here takes a lock: every method runs to completion
between awaits. Each node's account (:func:`headroom.accounting.account_node`)
is computed when first asked for after an event touched that node, or when the
report behind it turned stale, and then reused: a filter over N nodes reads N
cached figures (extender.verdicts), not N accountings. A report that repeats
the last one's figures (the agent's heartbeat) keeps the account and only
moves the time it turns stale. An event that changed nothing the account reads
(a held pod the watch now shows bound there) gets the last one back: it is
worked out again only where :func:`headroom.accounting.account_key` moved.

A bind *assumes* its pod on the node before it calls the apiserver, so that a
second bind racing it sees the first pod charged. No timer ends an assumption
(issue 7: 100 expired together while the pod watch lagged, and the nodes looked
empty). It ends when the pod cache shows the pod bound (anywhere) or gone, when
the apiserver definitely refused the only binding of the pod to that node that
may be stored, or when an authoritative read (a GET,
:meth:`extender.verbs.Extender.verify_due`, asked for once an assumption and its
latest binding POST are ``verify_after`` seconds old and no bind of it is in
flight) says the pod is unbound, gone, or another pod now. A pod may be held on several
nodes at once -- kube-scheduler retries a bind that timed out, maybe elsewhere
-- and is charged on each until one of those says where it is; the apiserver
lets only one binding land.
"""

import bisect
import heapq
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import ValidationError

from extender.verdicts import UNKNOWN_NODE, Verdicts
from headroom.accounting import (
    FUTURE_TOLERANCE_SECONDS,
    History,
    NodeAccount,
    account_key,
    account_node,
    foreign_replicas,
    listed_twice,
    measured,
    numa_groups,
    placed,
    placed_as_read,
    refine_groups,
)
from headroom.claims import PodClaim, has_headroom_annotations, parse_claim
from headroom.nodes import NodeGPUs, parse_node
from headroom.placement import Fit, fit
from headroom.podspec import PodError
from headroom.quantity import human_bytes
from headroom.reports import ReportStatus, parse_report

log = logging.getLogger(__name__)

Clock = Callable[[], float]
HISTORY_SECONDS = 600.0
"""How long departures are remembered. A pod unlocated for longer is charged on
every GPU of its node again, as are pods created before the pod watch last
(re-)listed: a pod created and deleted before that list went unseen."""
PENDING_MEMORY = 10_000
"""Pods remembered from filter requests, for a bind that outruns the pod watch."""


LINGER_ALLOWANCE_SECONDS = 30.0
"""Beyond a pod's grace period, how long kubelet may take to kill what is left and
release its devices, and its agent to report it (a report's clock tolerance). A
grace period is counted up to :data:`HISTORY_SECONDS`: the tenant sets it, and the
admission policy ``headroom-shared-gpu-pods`` refuses a shared pod asking longer."""

TRIALS_KEPT = 16
"""Multi-replica pod shapes whose trial answers are kept per node."""


class Hold(NamedTuple):
    """A pod charged on a node it may be bound to, before the pod cache shows it there."""

    claim: PodClaim
    """The pod's claim, located on that node."""
    since: float
    """When (:attr:`ClusterState.hold_clock`) it was held there, or when the latest
    binding POST to that node began: a POST that timed out may still be stored, so no
    read may release it too soon."""
    posts: int = 0
    """Binding POSTs begun under this hold. More than one means an earlier one ended
    uncertain (a definite refusal ends the hold), so it may yet be stored."""


class ClusterState:
    def __init__(
        self,
        *,
        margin: int,
        stale_after: float,
        verify_after: float = 10.0,
        clock: Clock = time.time,
        hold_clock: Clock | None = None,
        spread: bool = True,
    ) -> None:
        self.margin = margin
        self.stale_after = stale_after
        self.verify_after = verify_after
        self.clock = clock
        """Wall time: what the apiserver's and the agents' timestamps are compared with."""
        self._latest = clock()
        """The latest :attr:`clock` reading the departure history has used (:meth:`wall`)."""
        self.hold_clock = hold_clock or (time.monotonic if clock is time.time else clock)
        """What a hold's age is counted on (:attr:`Hold.since`, :meth:`due`): the
        monotonic clock, so that a wall-clock step (NTP) cannot make a binding POST
        that timed out a moment ago old enough for the read that would release it. A
        test's fake ``clock`` drives both unless it gives this one too."""
        self.nodes: dict[str, NodeGPUs] = {}
        self.reports: dict[str, ReportStatus] = {}
        self.last_good: dict[str, ReportStatus] = {}
        """Node -> its last report that was fresh and measured when it came: what a stale,
        unavailable or deleted report leaves counting (headroom.accounting)."""
        self.pods: dict[str, PodClaim] = {}
        """Every GPU pod the cache holds, by UID."""
        self.assumed: dict[str, dict[str, Hold]] = {}
        """UID -> node -> its hold there, for binds not yet seen in the cache."""
        self._on_node: dict[str, dict[str, PodClaim]] = {}
        self._assumed_on: dict[str, dict[str, PodClaim]] = {}
        """Node -> UID -> claim held there: ``assumed`` by node, for :meth:`claims_on`."""
        self._accounts: dict[str, NodeAccount] = {}
        self._worked_out: dict[str, tuple[tuple[object, ...], NodeAccount]] = {}
        """Node -> (:func:`account_key`, account) of its last account worked out from the
        cache as it is: an event that changed nothing it reads gets the same back."""
        self._trials: dict[str, dict[Hashable, Fit]] = {}
        """Node -> a pending multi-replica pod's shape -> :meth:`fit`'s trial answer,
        dropped with the node's account."""
        self._replicas_seen: dict[str, int] = {}
        """Node -> the most replicas per GPU it has offered since this extender started
        (:attr:`NodeGPUs.replicas_per_gpu`)."""
        self._offered: dict[str, tuple[int | None, int | None]] = {}
        """Node -> (replicas per GPU by its consistent labels, shared capacity per GPU)
        as last known (:meth:`_note_cut`)."""
        self._replicas_cut: dict[str, float] = {}
        """Node -> when (:attr:`clock`) it was last seen offering fewer replicas per GPU
        than just before: the pods created until then may hold replicas the device
        plugin no longer lists, which its balance counts nowhere (:meth:`_history_after`)."""
        self._numa_seen: dict[str, dict[int, Hashable]] = {}
        """Node -> the NUMA grouping every report since the node appeared allows."""
        self.shared_headroom: dict[str, int] = {}
        """Node -> headroom for a shared pod, for every cached account: the filter's index."""
        self.shared_room: dict[str, tuple[int, int]] = {}
        """Node -> (shared headroom, total of its tightest GPU): prioritize's index."""
        self.verdicts = Verdicts()
        """Reasons and scores worked out per node, dropped with the node's account."""
        self._dirty: set[str] = set()
        """Nodes whose account an event invalidated since the last :meth:`prepare`."""
        self._stale_heap: list[tuple[float, str]] = []
        self._pending: OrderedDict[str, PodClaim] = OrderedDict()
        self.bound_at: dict[str, float] = {}
        """UID -> when our bind of it succeeded, until the pod watch shows it bound."""
        self.observe_watch_lag: Callable[[float], None] = lambda seconds: None
        """Told, per pod, how long the watch took to show a bind we made (a metric)."""
        self.on_room: Callable[[str], None] = lambda node: None
        """Told the node when GPU memory may have freed up there: a pod gone, a charge
        released, usage fallen (extender.requeue tells kube-scheduler to retry its
        waiting pods)."""
        self.spread = spread
        """False: unlocated pods are charged to every GPU (a device plugin whose
        allocation policy is not the NVIDIA plugin's distributed one)."""
        self.watching_since = self._latest
        """Since when (:meth:`wall`) the pod watch has shown every pod that came and
        went: the last complete pod list (:meth:`on_pod_resync`)."""
        self.lingering: dict[str, dict[str, tuple[float, PodClaim]]] = {}
        """Node -> UID -> (until when, claim) of pods deleted before kubelet reported
        them stopped, charged as they were until then (:meth:`_linger_on`)."""
        self._linger_heap: list[tuple[float, str, str]] = []
        self.departures: dict[str, deque[tuple[float, int | None]]] = {}
        """Node -> (when, GPU or None) for each shared replica that left it, kept
        :data:`HISTORY_SECONDS`: what bounds where unlocated pods can be (headroom.spread)."""
        self._aging_heap: list[tuple[float, str]] = []
        """(when, node): a departure stops counting for the pods created after it then
        (a new pod's bound, when none is unlocated: headroom.accounting._spread), so
        the node's account, kept until an event touches it, may have more room."""
        self.on_nominated: Callable[[PodClaim], None] = lambda claim: None
        """Told each unbound pod the watch shows with ``status.nominatedNodeName``."""
        self.nominated: dict[str, dict[str, PodClaim]] = {}
        """Node -> UID -> claim of each unbound GPU pod the watch shows nominated there:
        the room kube-scheduler's preemption made for it (:meth:`ahead`)."""
        self._ahead_accounts: dict[str, tuple[frozenset[str], NodeAccount]] = {}
        """Node -> (the nominated pods counted, the account worked out with them), dropped
        with the node's account."""

    # --- informer events ----------------------------------------------------

    def on_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        node = parse_node(obj)
        if not node.name:
            return
        if kind == "DELETED":
            self.nodes.pop(node.name, None)
        else:
            self._note_cut(node)
            if node.replicas_per_gpu is not None:
                # Fewer replicas configured leave the pods kubelet allocated before on
                # the old ones: a GPU is capped by the most it has been seen to offer.
                most = max(node.replicas_per_gpu, self._replicas_seen.get(node.name, 0))
                self._replicas_seen[node.name] = most
                node = replace(node, replicas_per_gpu=most)
            old, self.nodes[node.name] = self.nodes.get(node.name), node
            if node != old:
                # kube-scheduler retries on the Node event itself, but may have before
                # this watch showed it (and been refused): room. Not the room stamp,
                # or kubelet's status: they change nothing read here.
                self.on_room(node.name)
        self._touch(node.name)

    def _note_cut(self, node: NodeGPUs) -> None:
        """Stamp :attr:`_replicas_cut` when the node offers fewer replicas per GPU than
        it did just before: by its consistent labels and capacity, or by its capacity
        over the GPUs both show. Time-slicing cut from 8 to 4: kubelet keeps the pods it
        gave ``::4..::7``, and the device plugin, balancing by the replicas it lists,
        counts them nowhere. A capacity of 0 (kubelet restarted, the plugin not
        registered again yet) says nothing and is no cut, nor does a capacity read
        over a stand-in GPU count (:attr:`NodeGPUs.counted`: GFD's labels missing as a
        node joins or re-registers, the count moving before the capacity):
        the cut is seen when labels and capacity agree again, against the figure before."""
        per_gpu = node.shared_capacity // node.confirmed if node.confirmed and node.counted else 0
        now = (node.replicas_per_gpu, per_gpu or None)
        before = self._offered.get(node.name, (None, None))
        if any(b is not None and n is not None and n < b for n, b in zip(now, before, strict=True)):
            self._replicas_cut[node.name] = self.wall()
        self._offered[node.name] = (
            now[0] if now[0] is not None else before[0],
            now[1] if now[1] is not None else before[1],
        )

    def on_report(self, kind: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str) or not name:
            return
        if kind == "DELETED":
            self.reports.pop(name, None)
        else:
            try:
                report = parse_report(dict(obj))
            except ValidationError as err:
                # A report we cannot read must not keep vouching for the node.
                log.warning("GPUNodeReport %s unreadable, ignored: %s", name, err)
                self.reports.pop(name, None)
            else:
                old = self.reports.get(name)
                self.reports[name] = report
                told = numa_groups(1 + max((g.index for g in report.gpus), default=-1), [report])
                if told is not None:
                    # GPUs once reported on different NUMA nodes stay apart (one report
                    # saying otherwise may be the fault): grouping apart only charges more.
                    seen = refine_groups(self._numa_seen.get(name), told)
                    if seen is not None:
                        self._numa_seen[name] = seen
                renumbered = _renumbered(old, report) or _renumbered(
                    self.last_good.get(name), report
                )
                if renumbered and (left := self.departures.get(name)):
                    # A GPU fell off the bus, or the driver numbered them anew: the
                    # departures seen were from GPUs by their old numbers, now from
                    # any GPU (headroom.spread: never less charged for it).
                    self.departures[name] = deque((at, None) for at, _ in left)
                if renumbered and (deleted := self.lingering.get(name)):
                    # So were the GPUs a deleted pod's replicas were placed on when it
                    # left: it may run on any of them now (charged in full everywhere).
                    for uid, (until, claim) in deleted.items():
                        deleted[uid] = (until, replace(claim, home=None))
                now = self.clock()
                fresh = measured(report, now=now, stale_after=self.stale_after)
                if fresh:
                    self.last_good[name] = _keep_failed_gpus(report, self.last_good.get(name))
                if old is not None and not renumbered and self._heartbeat(name, old, report):
                    return
                if fresh and (
                    old is None
                    or not measured(old, now=now, stale_after=self.stale_after)
                    or _room_may_appear(old, report)
                ):
                    self.on_room(name)
        self._touch(name)

    def parse(self, obj: Mapping[str, Any]) -> PodClaim:
        """:func:`parse_claim` with the watch's claim of the pod; raises PodError.

        A pod seen for the first time (by the watch or a filter) was created no
        later than now by this extender's clock: its creation time is taken no
        later than that, and kept so. An apiserver clock ahead of this one would
        otherwise start the window of departures that bound where unlocated pods
        can be (headroom.spread) after some that counted.
        """
        claim = parse_claim(obj, self.known(obj))
        if claim.created is None:
            return claim
        seen = self.pods.get(claim.uid) or self._pending.get(claim.uid)
        first = seen.created if seen is not None else None
        limit = self.wall() if first is None else first
        return replace(claim, created=limit) if claim.created > limit else claim

    def on_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        try:
            claim = self.parse(obj)
        except PodError as err:
            log.warning("pod %s ignored: %s", _pod_key(obj), err)
            return
        if not claim.uid:
            return
        if kind == "DELETED" or claim.terminated or not self._interesting(claim, obj):
            # Deleted before kubelet reported it stopped (kubectl delete --force, the
            # pod GC): kubelet keeps its replicas while it stops the containers, up
            # to the grace period, and the allocator counts them; so its departure
            # counts as that much later (headroom.spread: more only charges more).
            # A terminal phase is no proof: the pod GC marks a pod of a lost node
            # Failed while its containers may run on, and only kubelet's statuses
            # say they stopped.
            late = (kind == "DELETED" or claim.terminated) and not _stopped(obj)
            if not late and self.lingering:
                self._unlinger(claim.uid)  # kubelet's word: its containers stopped
            # Only as the pod leaves (the cache held it, or the deletion itself), and
            # once: another event about an ended pod (a label patched) must not start
            # its charge over.
            leaving = claim.uid in self.pods or kind == "DELETED"
            if late and leaving and claim.wants_gpu and not self._lingers(claim.uid):
                linger = self._linger(claim.uid, claim.grace)
            else:
                linger = 0.0
            if not linger:
                self._drop(claim.uid)
            elif isinstance(obj.get("spec"), Mapping):
                # The pod's last object says where it was bound, if anywhere: a pod
                # deleted before any binding was stored never ran.
                if claim.node:
                    self._linger_on(claim.node, self.pods.get(claim.uid) or claim, linger)
                self._drop(claim.uid, linger=linger)
            else:
                self.gone(claim.uid, linger)  # a re-list's replay: name and UID only
            return
        if self.pods.get(claim.uid) == claim:
            # Nothing an account reads has changed (kubelet's status: Running,
            # conditions, IPs): the account stays valid. Most of a storm's events.
            # No hold waits on it either: a pod the cache has bound is never held.
            if claim.nominated and not claim.node:
                self.on_nominated(claim)
            return
        before = self.pods.get(claim.uid)
        self._drop(claim.uid, keep_pending=True)
        self.pods[claim.uid] = claim
        if (
            before is not None
            and before.nominated
            and not before.node
            and before.nominated != (claim.node or claim.nominated)
        ):
            # Its nomination moved or ended, not by its binding there: the room kept
            # for it (:meth:`ahead`) is free again.
            self.on_room(before.nominated)
        if claim.nominated and not claim.node and claim.wants_gpu:
            self.nominated.setdefault(claim.nominated, {})[claim.uid] = claim
            self.on_nominated(claim)
        if claim.node:
            self._on_node.setdefault(claim.node, {})[claim.uid] = claim
            self._touch(claim.node)
            # Seen bound: the cache charges it now, the assumption has done its job.
            bound_at = self.bound_at.pop(claim.uid, None)
            if bound_at is not None:
                self.observe_watch_lag(self.clock() - bound_at)
            self._pending.pop(claim.uid, None)
            self.forget(claim.uid)

    def on_pod_resync(self) -> None:
        """After a pod (re-)list: as :meth:`on_resync`, and the departures seen before
        no longer bound where unlocated pods can be. A re-list follows a gap in the
        watch; a pod created and deleted in it was never seen, and its departure
        would be missing from the bound (headroom.spread): pods created before the
        list are charged on every GPU of their node until located."""
        self.watching_since = self.wall()
        self.on_resync()

    def on_resync(self) -> None:
        """After a re-list every account is recomputed from the new contents."""
        self._accounts.clear()
        self._ahead_accounts.clear()
        self._trials.clear()
        self.shared_headroom.clear()
        self.shared_room.clear()
        self.verdicts.clear()
        self._dirty = set(self.nodes)

    # --- accounting ---------------------------------------------------------

    def account(self, name: str, now: float | None = None) -> NodeAccount | None:
        """The node's account, or None for a node the cache does not hold."""
        account = self._accounts.get(name)
        if account is not None:
            return account
        account = self._work_out(name, now=now)
        if account is None:
            return None
        self._accounts[name] = account
        self.shared_headroom[name] = account.shared_headroom
        self.shared_room[name] = (account.shared_headroom, account.shared_total)
        if account.stale_at is not None:
            heapq.heappush(self._stale_heap, (account.stale_at, name))
        return account

    def _work_out(
        self,
        name: str,
        *,
        skip: Collection[str] = (),
        gone: Collection[str] = (),
        more: Iterable[PodClaim] = (),
        now: float | None = None,
        horizon: float = 0.0,
    ) -> NodeAccount | None:
        """The node's account from the cache, leaving out the pods ``skip``, with the
        pods ``gone`` departed (their memory gone from the reports too) and the pods
        ``more`` added, its departure history as it will be ``horizon`` seconds from
        now; None for a node the cache does not hold."""
        node = self.nodes.get(name)
        if node is None:
            return None
        claims: Iterable[PodClaim] = self.claims_on(name)
        if skip:
            claims = (c for c in claims if c.uid not in skip)
        if more:
            claims = [*claims, *more]
        arguments: dict[str, Any] = {
            "node": node,
            "claims": tuple(claims),
            "report": _without(self.reports.get(name), gone),
            "now": self.clock() if now is None else now,
            "margin": self.margin,
            "stale_after": self.stale_after,
            "last_good": _without(self.last_good.get(name), gone),
            "history": self._history_after(name, gone, horizon),
            "numa_seen": self._numa_seen.get(name),
        }
        if skip or gone or more or horizon:
            return account_node(**arguments)  # a what-if: not kept
        # The node as the cache holds it. Many events that touch it change nothing its
        # account reads -- in a storm, each held pod the watch then shows bound there --
        # and an 8-GPU node's account is the dearest thing a filter or bind works out.
        key = account_key(**arguments)
        kept = self._worked_out.get(name)
        if kept is not None and kept[0] == key:
            return kept[1]
        account = account_node(**arguments)
        self._worked_out[name] = (key, account)
        return account

    def _history_after(
        self, name: str, gone: Collection[str], horizon: float = 0.0
    ) -> History | None:
        """The node's history with the pods ``gone`` departed now, as :meth:`_drop` will
        record them: a pod bound here from where the report placed it, a pod only held
        here (its bind may have landed, kubelet may have allocated it) from any GPU, a
        pod the cache does not hold from where a report shows its replicas.
        With a ``horizon``, the history's start is where it will be by then: a pod
        created before that is then charged on every GPU."""
        if not self.spread or self._predates_cut(name):
            return None
        history = self.history(name)
        now = self.wall()
        since = max(history.since, now + horizon - HISTORY_SECONDS)
        if not gone:
            return history if since == history.since else History(since, history.departures)
        held = self._assumed_on.get(name, {})
        left: list[tuple[float, int | None]] = []
        for uid in gone:
            claim = self.pods.get(uid)
            if claim is not None and claim.node == name:
                if claim.shared:
                    left.extend((now, index) for index in self._departure_gpus(claim))
            elif uid in held and held[uid].shared:
                left.extend([(now, None)] * held[uid].shared)
        # A pod the cache does not hold that a report shows with a replica (the watch
        # lags): gone from the report, its replicas no longer count where it held them
        # (foreign_replicas); the watch will record it leaving once it delivers it, so
        # they count as departures there, as a bound pod's do.
        unknown = {uid for uid in gone if uid not in self.pods and uid not in held}
        reports = [r for r in (self.reports.get(name), self.last_good.get(name)) if r]
        if unknown and reports:
            others = {u.uid for r in reports for gpu in r.gpus for u in gpu.pods} - unknown
            for index, count in foreign_replicas(reports, others).items():
                left.extend([(now, index)] * count)
        return History(since, history.departures + tuple(left))

    def _predates_cut(self, name: str) -> bool:
        """Whether a shared pod on the node may hold a replica its device plugin stopped
        listing when its replicas were cut (:attr:`_replicas_cut`): created before the
        cut was seen (a clock skew's tolerance later). The NVIDIA plugin's distributed
        policy balances by the replicas it lists (``total - available``,
        internal/rm/allocate.go), so a GPU whose pods sit on replicas cut away looks
        empty to it, and neither the bound on unlocated pods nor the cap of replicas
        per GPU (headroom.spread) holds: every unlocated pod is charged everywhere and
        a new pod must fit every GPU, until those pods are gone.

        The node's agent says so too, cut seen here or not (this extender started after
        it): a report with replicas kubelet allocated and the plugin no longer lists
        (``GPUUsage.unlisted_replicas``, stale or not: it is evidence of pods, which
        charges more, never less)."""
        report = self.reports.get(name)
        if report is not None and any(gpu.unlisted_replicas for gpu in report.gpus):
            return True
        cut = self._replicas_cut.get(name)
        if cut is None:
            return False
        limit = cut + FUTURE_TOLERANCE_SECONDS
        return any(
            claim.shared and (claim.created is None or claim.created <= limit)
            for claim in self.claims_on(name)
        )

    def fit(
        self,
        claim: PodClaim,
        name: str,
        *,
        without: str | None = None,
        gone: Collection[str] = (),
        horizon: float = 0.0,
        nominated: bool = True,
    ) -> Fit:
        """Whether ``claim`` fits node ``name`` now (:func:`headroom.placement.fit`),
        as if pod ``without`` were not there, and the pods ``gone`` had left (the
        departure history as it will be ``horizon`` seconds from now), beside the
        pods kube-scheduler's preemption nominated there ahead of it (:meth:`ahead`;
        ``nominated=False``: not them, as bind checks only what may be bound).

        A pod of more than one replica is charged in full on every GPU, but its
        replicas also let more of the unlocated single-replica pods already there
        come together on one GPU (headroom.spread): it fits only if every GPU has
        room in the account worked out with it. That trial account is worked out
        once per node and pod shape until an event touches the node (``_trials``).
        """
        skip = {*gone} | ({without} if without is not None else set())
        ahead = self.ahead(claim, name) if nominated else []
        if skip or horizon:
            account = self._work_out(name, skip=skip, gone=gone, more=ahead, horizon=horizon)
        elif ahead:
            account = self._with_ahead(name, ahead)
        else:
            account = self.account(name)
        if account is None:
            return Fit(False, UNKNOWN_NODE)
        verdict = _kept_for(fit(account, claim), ahead)
        if not verdict.fits or claim.shared <= 1 or not account.capped:
            return verdict
        cached = self.pods.get(claim.uid)
        here = cached is not None and cached.node == name
        if skip or horizon or here or name in self.assumed.get(claim.uid, {}):
            trial = self._work_out(
                name,
                skip={claim.uid, *skip},
                gone=gone,
                more=[*ahead, replace(claim, node=name)],
                horizon=horizon,
            )
            return _kept_for(_trial_fit(claim, verdict, trial), ahead)
        # A pod not on the node: its shape and creation (rounded down, which only
        # counts more departures) are all its trial reads of it, so retries and the
        # pods of one Deployment share each node's answer.
        created = None if claim.created is None else claim.created // 30 * 30
        key = (
            claim.shared,
            claim.need,
            tuple(sorted(claim.mig.items())),
            created,
            tuple(sorted(c.uid for c in ahead)),
        )
        trials = self._trials.setdefault(name, {})
        answer = trials.get(key)
        if answer is None:
            if len(trials) >= TRIALS_KEPT:  # shapes enough to grow without bound: start over
                trials.clear()
            more = [*ahead, replace(claim, node=name, created=created)]
            trial = self._work_out(name, more=more)
            answer = trials[key] = _kept_for(_trial_fit(claim, verdict, trial), ahead)
        return answer

    def ahead(self, claim: PodClaim, name: str) -> list[PodClaim]:
        """The pods kube-scheduler's preemption nominated to node ``name`` whose room it
        keeps from ``claim``, placed there: of a priority no lower than its, not itself
        (``addGENominatedPods``, pkg/scheduler/framework/runtime/framework.go), and not
        held by a bind (kube-scheduler drops the nomination of a pod it assumes, and a
        hold already charges it). Its own plugins count them, but only by node-level
        resources: on a node of several GPUs, another pod could take the GPU room the
        victims freed, and the preemptor would preempt again."""
        on_node = self.nominated.get(name)
        if not on_node:
            return []
        return [
            replace(other, node=name)
            for uid, other in on_node.items()
            if uid != claim.uid and other.priority >= claim.priority and uid not in self.assumed
        ]

    def _with_ahead(self, name: str, ahead: list[PodClaim]) -> NodeAccount | None:
        """The node's account with the nominated pods ``ahead`` in it, kept until an
        event touches the node or the pods counted change."""
        if self.account(name) is None:  # and its turning stale scheduled (:meth:`refresh`)
            return None
        uids = frozenset(c.uid for c in ahead)
        kept = self._ahead_accounts.get(name)
        if kept is not None and kept[0] == uids:
            return kept[1]
        account = self._work_out(name, more=ahead)
        if account is not None:
            self._ahead_accounts[name] = (uids, account)
        return account

    def wall(self) -> float:
        """:attr:`clock`, never back: what departures, pods' creation (clamped to it) and
        the history's start are counted on. A departure must not read as older than a
        pod seen before it left: stamped by a wall clock NTP stepped back, it would fall
        before the creation of pods kubelet allocated while it was still there, and the
        bound on unlocated pods would forget it (headroom.spread: charged less than they
        hold). Stepped back, it stands still until the clock catches up."""
        now = self.clock()
        if now > self._latest:
            self._latest = now
        return self._latest

    def history(self, name: str) -> History:
        """The node's departures the extender has seen, and since when it has seen all."""
        since = max(self.watching_since, self.wall() - HISTORY_SECONDS)
        left = self.departures.get(name)
        while left and left[0][0] < since:
            left.popleft()
        return History(since, tuple(left or ()))

    def accounts(self) -> Mapping[str, NodeAccount]:
        """Cached accounts; call :meth:`refresh` first. Missing ones come from :meth:`account`."""
        return self._accounts

    def prepare(self, now: float) -> None:
        """Refresh, then recompute the accounts events invalidated: O(changed nodes).

        Afterwards ``shared_headroom`` and ``shared_room`` hold every node the
        cache knows; a name missing from them is an unknown node.
        """
        self.refresh(now)
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            if name in self.nodes and name not in self._accounts:
                self.account(name, now)

    def refresh(self, now: float) -> None:
        """Forget accounts whose report turned stale, and deleted pods whose grace period
        is over (assumptions never expire: :meth:`due`)."""
        heap = self._stale_heap
        while heap and heap[0][0] <= now:
            stale_at, name = heapq.heappop(heap)
            account = self._accounts.get(name)
            if account is not None and account.stale_at == stale_at:
                self._touch(name)
        lingering, steady = self._linger_heap, self.hold_clock()
        while lingering and lingering[0][0] <= steady:
            until, name, uid = heapq.heappop(lingering)
            on_node = self.lingering.get(name, {})
            if uid in on_node and on_node[uid][0] == until:
                self._unlinger(uid, name)
        aging, wall = self._aging_heap, max(now, self.wall())
        while aging and aging[0][0] <= wall:
            _, name = heapq.heappop(aging)
            if name in self.departures:
                self._touch(name)
                self.on_room(name)

    def due(self, now: float) -> list[PodClaim]:
        """Pods with an assumption old enough to verify with an authoritative read, oldest
        first: held, or last POSTed to, ``verify_after`` seconds ago or more (``now`` by
        :attr:`hold_clock`)."""
        ready = [
            (hold.since, hold.claim)
            for holds in self.assumed.values()
            for hold in holds.values()
            if hold.since + self.verify_after <= now
        ]
        seen: set[str] = set()
        result = []
        for _, claim in sorted(ready, key=lambda item: item[0]):
            if claim.uid not in seen:
                seen.add(claim.uid)
                result.append(claim)
        return result

    def claims_on(self, node: str) -> Iterator[PodClaim]:
        """Pods bound to ``node`` by the cache, then pods assumed there, then deleted pods
        kubelet may still run there (:meth:`_linger_on`). A pod known deleted is charged
        as deleted there, whatever older news says: a bind's answer, or a read sent
        before the deletion, may hold it again (:meth:`hold`), and a watch lagging a
        read that found it gone may show it bound; as a held or bound pod it would
        count as a replica the allocator no longer counts."""
        bound = self._on_node.get(node, {})
        lingering = self.lingering.get(node, {})
        for uid, claim in bound.items():
            if uid not in lingering:
                yield claim
        assumed = self._assumed_on.get(node, {})
        for uid, held in assumed.items():
            if uid not in bound and uid not in lingering:
                yield held
        for _, deleted in lingering.values():
            yield deleted

    # --- binding ------------------------------------------------------------

    def known(self, pod: Mapping[str, Any]) -> PodClaim | None:
        """The cached claim of the pod with this object's UID, from the pod watch only."""
        metadata = pod.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
        return self.pods.get(uid) if isinstance(uid, str) else None

    def remember(self, claim: PodClaim) -> None:
        """Keep a pod seen in a filter request, in case its bind outruns the pod watch."""
        if not claim.uid:
            return
        self._pending[claim.uid] = claim
        self._pending.move_to_end(claim.uid)
        while len(self._pending) > PENDING_MEMORY:
            self._pending.popitem(last=False)

    def lookup(self, uid: str, namespace: str, name: str) -> PodClaim | None:
        claim = self.pods.get(uid) or self._pending.get(uid)
        if claim is None and not uid:
            claim = next(
                (c for c in self.pods.values() if (c.namespace, c.name) == (namespace, name)),
                None,
            )
        return claim

    def assume(self, claim: PodClaim, node: str, *, also: bool = False) -> Fit:
        """Check ``claim`` against everything bound or assumed on ``node``, then hold it there.

        Synchronous on purpose: check and record happen with no await between,
        so concurrent binds to one node are serialised by the event loop. A pod
        already held on another node is refused unless ``also`` (the caller
        has read that it is not bound): then it is held on both.
        """
        # Authoritative, so never on a cached account whose report has since
        # turned stale: a stale report must not vouch for the room it showed.
        self.refresh(self.clock())
        cached = self.pods.get(claim.uid)
        if cached is not None and cached.node:
            if cached.node == node:
                return Fit(True)
            return Fit(False, f"pod {claim.key} is already bound to {cached.node}")
        holds = self.assumed.get(claim.uid, {})
        if node in holds:
            # Held here by its filter, or by an earlier bind: checked then, but the
            # node may have changed since (a leak reported, a report turned stale, the
            # Node re-created smaller). The account already charges the pod: where it
            # shows room everywhere the pod can be, nothing is over with it; else the
            # check runs again as the filter's did, without the pod's own hold.
            account = self.account(node)
            if account is None:
                return Fit(False, f"node {node} is not in the extender's cache")
            if _room_with(account, claim):
                return Fit(True)
            return self.fit(claim, node, without=claim.uid, nominated=False)
        if holds and not also:
            elsewhere = ", ".join(sorted(holds))
            return Fit(False, f"pod {claim.key} may already be bound to {elsewhere}")
        if self.account(node) is None:
            return Fit(False, f"node {node} is not in the extender's cache")
        verdict = self.fit(claim, node, nominated=False)
        if verdict.fits:
            self._hold(claim, node)
        return verdict

    def hold(self, claim: PodClaim, node: str) -> None:
        """Charge the pod on ``node`` only, where a read found it bound, until the watch says.

        Not when the cache already shows it bound: the cache charges it then.
        """
        cached = self.pods.get(claim.uid)
        if cached is not None and cached.node:
            self.forget(claim.uid)
            return
        for where in list(self.assumed.get(claim.uid, {})):
            if where != node:
                self.forget(claim.uid, where)
        if node not in self.assumed.get(claim.uid, {}):
            self._hold(claim, node)

    def posting(self, uid: str, node: str) -> None:
        """A binding POST of the pod to ``node``, where it is held, begins now: count it
        and restart the hold's clock, so that no read releases it until the POST is
        ``verify_after`` old and can no longer be stored."""
        hold = self.assumed[uid][node]
        self.assumed[uid][node] = hold._replace(since=self.hold_clock(), posts=hold.posts + 1)

    def forget(self, uid: str, node: str | None = None) -> None:
        """End the pod's assumptions: all of them, or only the one on ``node``."""
        holds = self.assumed.get(uid)
        if holds is None:
            return
        cached = self.pods.get(uid)
        for where in [node] if node is not None else list(holds):
            if holds.pop(where, None) is not None:
                on_node = self._assumed_on[where]
                del on_node[uid]
                if not on_node:
                    del self._assumed_on[where]
                self._touch(where)
                if cached is None or cached.node != where:
                    self.on_room(where)
        if not holds:
            del self.assumed[uid]

    # --- internals ----------------------------------------------------------

    def _hold(self, claim: PodClaim, node: str) -> None:
        held = replace(claim, node=node)
        self.assumed.setdefault(claim.uid, {})[node] = Hold(held, self.hold_clock())
        self._assumed_on.setdefault(node, {})[claim.uid] = held
        self._touch(node)

    def gone(self, uid: str, linger: float | None = None) -> None:
        """A read found the pod gone (404, or its name on another UID): as a deletion the
        watch has not delivered. Nothing says kubelet has stopped it, so for its grace
        period (as for a forced deletion, :meth:`on_pod`) it stays charged where it was
        bound, or held (a binding POST of it may have landed there, or a read found it
        there: :meth:`_linger_on`), and its replicas count as departing then: ending its
        holds with no departure would let the bound on unlocated pods (headroom.spread)
        count one replica fewer on the GPU kubelet may still count it on."""
        linger = self._linger(uid) if linger is None else linger
        cached = self.pods.get(uid)
        if cached is not None and cached.node:
            self._linger_on(cached.node, cached, linger)
        for node, hold in self.assumed.get(uid, {}).items():
            if cached is None or cached.node != node:
                # Its binding may have landed there (a POST), or a read found it there.
                self._linger_on(node, hold.claim, linger)
        self._drop(uid, linger=linger)

    def _linger_on(self, node: str, claim: PodClaim, linger: float) -> None:
        """Keep charging the deleted pod on ``node`` as it was, ``linger`` seconds on.

        kubelet runs a pod deleted before it stopped it (``kubectl delete --force``, the
        pod GC) until its grace period ends, and the pod may use all it declared
        meanwhile: charging only what a report last saw it hold would let another pod
        into that room. Only on a node it was, or may have been, bound to: a pod whose
        last object shows no node never ran. :meth:`refresh` lets it go, counting on
        :attr:`hold_clock` (a wall-clock step must not end it early), and so does
        kubelet's word that its containers stopped.

        Not as one of the replicas the device plugin counts: kubelet drops the pod from
        its active pods at once, and its device manager frees the pod's replicas before
        the next allocation (kubernetes#104824), so newcomers may be given its GPUs as if
        they were empty. It is charged in full on each GPU the report placed one of its
        replicas on, or on every GPU where the report did not place them all
        (:attr:`PodClaim.deleted`, headroom.accounting); its departure, recorded as it
        leaves the cache, covers the allocator counting it a while longer.
        """
        until = self.hold_clock() + linger
        there = replace(claim, node=node, terminated=False)
        # Each GPU the report placed one of its replicas on (never fewer GPUs than it
        # held replicas on), or None where it did not place them all: every GPU.
        where = self._departure_gpus(there)
        gpus = sorted({index for index in where if index is not None})
        home = tuple(gpus) if where and None not in where else None
        self.lingering.setdefault(node, {})[claim.uid] = (
            until,
            replace(there, deleted=True, home=home),
        )
        heapq.heappush(self._linger_heap, (until, node, claim.uid))
        self._touch(node)

    def _lingers(self, uid: str) -> bool:
        return any(uid in on_node for on_node in self.lingering.values())

    def _unlinger(self, uid: str, node: str | None = None) -> None:
        """End the pod's lingering charge: on ``node``, or everywhere."""
        for name in [node] if node is not None else list(self.lingering):
            on_node = self.lingering.get(name)
            if on_node is None or on_node.pop(uid, None) is None:
                continue
            if not on_node:
                del self.lingering[name]
            self._touch(name)
            self.on_room(name)

    def _linger(self, uid: str, grace: float = 0.0) -> float:
        """How long after now the pod's replicas may still be held: the longest grace
        period this cache read of it (a re-list replays a missed deletion with the
        pod's name and UID only), up to :data:`HISTORY_SECONDS`, and the allowance."""
        longest = max(
            [grace]
            + [known.grace for known in (self.pods.get(uid), self._pending.get(uid)) if known]
            + [held.grace for held, *_ in self.assumed.get(uid, {}).values()]
        )
        return min(longest, HISTORY_SECONDS) + LINGER_ALLOWANCE_SECONDS

    def _interesting(self, claim: PodClaim, obj: Mapping[str, Any]) -> bool:
        return claim.wants_gpu or has_headroom_annotations(obj)

    def _drop(self, uid: str, *, keep_pending: bool = False, linger: float = 0.0) -> None:
        old = self.pods.pop(uid, None)
        if old is not None and old.nominated and not old.node:
            on_node = self.nominated.get(old.nominated, {})
            on_node.pop(uid, None)
            if not on_node:
                self.nominated.pop(old.nominated, None)
            if not keep_pending:
                self.on_room(old.nominated)  # the room kept for it (:meth:`ahead`)
        if old is not None and old.node:
            if not keep_pending:
                self.on_room(old.node)
                if old.shared:
                    self._departed(old, linger=linger)
            on_node = self._on_node.get(old.node, {})
            on_node.pop(uid, None)
            if not on_node:
                self._on_node.pop(old.node, None)
            self._touch(old.node)
        if not keep_pending:
            self.bound_at.pop(uid, None)
            self._pending.pop(uid, None)
            for node, (held, *_) in self.assumed.get(uid, {}).items():
                # A bind may have landed and kubelet allocated it: it left some GPU.
                if held.shared and (old is None or old.node != node):
                    self._departed(held, located=False, linger=linger)
            self.forget(uid)

    def _departed(self, claim: PodClaim, *, located: bool = True, linger: float = 0.0) -> None:
        """Remember where a shared pod left from: its GPU if the report located it; as
        ``linger`` seconds from now where kubelet may hold its replicas that long."""
        where = self._departure_gpus(claim) if located else [None] * claim.shared
        left = self.departures.setdefault(claim.node, deque())
        at = self.wall() + linger
        # Past the clock-skew tolerance it no longer counts for a pod created then.
        heapq.heappush(self._aging_heap, (at + FUTURE_TOLERANCE_SECONDS + 1.0, claim.node))
        for index in where:
            # In time order, so that history() prunes from the left: one stamped ahead
            # must not keep every later departure from ever being forgotten.
            bisect.insort(left, (at, index), key=lambda departure: departure[0])

    def _departure_gpus(self, claim: PodClaim) -> list[int | None]:
        """The GPU each replica of a shared pod leaving its node leaves: where the report
        placed them, counts that add up to all its replicas (headroom.accounting.placed),
        or None (any GPU) for each."""
        report = self.reports.get(claim.node)
        node = self.nodes.get(claim.node)
        anywhere: list[int | None] = [None] * claim.shared
        if report is None or node is None:
            return anywhere
        # Where the accounting would place it: not on a GPU listed twice (two GPUs'
        # counts under one index), unread, in MIG mode, or beyond the node's GPUs (a
        # bug, a forgery: the accounting drops such GPUs), where it would count nowhere.
        where = placed_as_read(node, report).get(claim.uid)
        if (
            where is None
            or sum(where.values()) != claim.shared
            or any(index >= node.count for index in where)
        ):
            return anywhere
        return [index for index, count in sorted(where.items()) for _ in range(count)]

    def _heartbeat(self, name: str, old: ReportStatus, new: ReportStatus) -> bool:
        """Keep the account when ``new`` repeats ``old``'s figures, only later: True if kept.

        Most writes are the agent's heartbeat. The account's figures depend on
        the report only through what these fields compare, so with both
        reports fresh it stays as it is, and with it the node's answers
        (extender.verdicts); only the time it turns stale moves.
        """
        account = self._accounts.get(name)
        if account is None or account.source != "report":
            return False
        if (new.gpus, new.conditions, new.schema_version) != (
            old.gpus,
            old.conditions,
            old.schema_version,
        ):
            return False
        observed = new.observed_at.timestamp()
        age = self.clock() - observed
        if age > self.stale_after or age < -FUTURE_TOLERANCE_SECONDS:
            return False  # no longer fresh: recomputed, with the note that says why
        stale_at = observed + self.stale_after
        if stale_at != account.stale_at:
            self._accounts[name] = replace(account, stale_at=stale_at)
            heapq.heappush(self._stale_heap, (stale_at, name))
        return True

    def _touch(self, node: str) -> None:
        if not (
            node in self.nodes
            or node in self.reports
            or node in self._on_node
            or node in self._assumed_on
            or node in self.lingering
        ):
            # Kept while the Node is gone but its report or pods remain (kubelet
            # re-registers within pod GC's 40 s): a re-created Node keeps its last
            # good reading and the departures its spread bound counts on.
            self.last_good.pop(node, None)
            self.departures.pop(node, None)
            self._replicas_seen.pop(node, None)
            self._offered.pop(node, None)
            self._replicas_cut.pop(node, None)
            self._numa_seen.pop(node, None)
            self._worked_out.pop(node, None)
        self._dirty.add(node)
        self._accounts.pop(node, None)
        self._ahead_accounts.pop(node, None)
        self._trials.pop(node, None)
        self.shared_headroom.pop(node, None)
        self.shared_room.pop(node, None)
        self.verdicts.drop(node)


def _room_with(account: NodeAccount, claim: PodClaim) -> bool:
    """Whether ``account``, which already charges ``claim``, leaves every shared GPU and
    the pod's MIG profiles within capacity: then the pod's bind over-commits nothing."""
    if claim.problem or claim.legacy:
        return False
    if claim.shared:
        shared = [gpu for gpu in account.gpus if gpu.shared]
        if not shared or any(gpu.headroom < 0 for gpu in shared):
            return False
    for profile in claim.mig:
        slices = account.mig.get(profile)
        if slices is None or slices.used > slices.capacity:
            return False
    return True


def _kept_for(verdict: Fit, ahead: list[PodClaim]) -> Fit:
    """``verdict``, its refusal naming the nominated pods ``ahead`` it counted."""
    if verdict.fits or not ahead:
        return verdict
    named = ", ".join(f"{c.key} (priority {c.priority})" for c in ahead)
    return Fit(
        False,
        f"{verdict.reason}; counting {named}, nominated to this node by kube-scheduler's "
        "preemption, whose room is kept for pods of priority no lower than this one's",
    )


def _trial_fit(claim: PodClaim, verdict: Fit, trial: NodeAccount | None) -> Fit:
    """``verdict`` (the pod fits the node's account), unless a GPU is over in ``trial``,
    the account worked out with the pod in it."""
    if trial is None:
        return Fit(False, UNKNOWN_NODE)
    shared = [gpu for gpu in trial.gpus if gpu.shared]
    fullest = min(shared, key=lambda gpu: gpu.headroom, default=None)
    if fullest is None or fullest.headroom >= 0:
        return verdict
    return Fit(
        False,
        f"{claim.shared} replicas of {claim.need_text}, each GPU charged: beside them "
        f"more of the pods bound here and not located yet can share one GPU, and gpu "
        f"{fullest.index} would be {human_bytes(-fullest.headroom)} over",
    )


def _stopped(obj: Mapping[str, Any]) -> bool:
    """Whether kubelet reported every container of the pod terminated (it then holds
    none of the pod's device replicas), as a graceful deletion's last object shows.

    Sidecars (init containers that keep running) and ephemeral containers count
    too: while one runs, kubelet keeps the pod, and its devices, on the node.
    """
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return False
    statuses = status.get("containerStatuses")
    if not isinstance(statuses, list) or not statuses:
        return False
    for key in ("initContainerStatuses", "ephemeralContainerStatuses"):
        more = status.get(key)
        if more is not None:
            if not isinstance(more, list):
                return False
            statuses = statuses + more
    return all(
        isinstance(s, Mapping)
        and isinstance(s.get("state"), Mapping)
        and "terminated" in s["state"]
        for s in statuses
    )


def _pod_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return "?"
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _room_may_appear(old: ReportStatus, new: ReportStatus) -> bool:
    """Whether ``new`` may show room ``old`` did not: some GPU holds less (a pod freed
    memory or left), or a pod is located (seen holding memory, or its replicas counted)
    for the first time or elsewhere, which frees the other GPUs it was charged to
    (headroom.spread); or a GPU ``old``
    could not be measured by is read again (an NVML error, missing, listed twice: its
    pods were unlocated, charged on every GPU), or fewer replicas are unlisted by the
    device plugin (every unlocated pod was charged everywhere: ``_predates_cut``)."""
    before = {gpu.index: gpu.used_bytes for gpu in old.gpus}
    if any(gpu.used_bytes < before.get(gpu.index, 0) for gpu in new.gpus):
        return True
    unread = {gpu.index for gpu in old.gpus if gpu.error} | listed_twice(old)
    read = {gpu.index for gpu in new.gpus if not gpu.error} - listed_twice(new)
    if read - (before.keys() - unread):
        return True
    unlisted = {gpu.index: gpu.unlisted_replicas for gpu in old.gpus}
    if any(gpu.unlisted_replicas < unlisted.get(gpu.index, 0) for gpu in new.gpus):
        return True
    seen = {u.uid for gpu in old.gpus for u in gpu.pods if u.used_bytes or u.allocated}
    if any(u.uid not in seen for gpu in new.gpus for u in gpu.pods if u.used_bytes or u.allocated):
        return True
    # A pod of several replicas located once its counts add up (headroom.accounting.placed).
    was = placed(old)
    return any(was.get(uid) != where for uid, where in placed(new).items())


def _renumbered(old: ReportStatus | None, new: ReportStatus) -> bool:
    """Whether ``new`` gives an index of ``old`` another GPU (by UUID)."""
    if old is None:
        return False
    before = {gpu.index: gpu.uuid for gpu in old.gpus if gpu.uuid}
    return any(gpu.uuid and before.get(gpu.index, gpu.uuid) != gpu.uuid for gpu in new.gpus)


def _keep_failed_gpus(report: ReportStatus, last: ReportStatus | None) -> ReportStatus:
    """``report`` as the last good one, a GPU NVML failed to read, or that ``report``
    leaves out, keeping its last reading: the one seen here, else the one the agent carries."""
    twice = listed_twice(report)
    read = {gpu.index for gpu in report.gpus if not gpu.error and gpu.index not in twice}
    kept = [g for g in (last.gpus if last is not None else []) if g.index not in read]
    if not kept and len(read) == len(report.gpus):
        return report
    known = read | {g.index for g in kept}
    carried = [g for g in report.gpus if g.index not in known and g.index not in twice]
    return replace(report, gpus=[g for g in report.gpus if g.index in read] + kept + carried)


def _without(report: ReportStatus | None, gone: Collection[str]) -> ReportStatus | None:
    """``report`` without the memory of the pods ``gone`` hold: evicted, they free it."""
    if report is None or not gone:
        return report
    gpus = [
        replace(
            gpu,
            pods=[u for u in gpu.pods if u.uid not in gone],
            mig_devices=[
                replace(d, pods=[u for u in d.pods if u.uid not in gone]) for d in gpu.mig_devices
            ],
        )
        for gpu in report.gpus
    ]
    return replace(report, gpus=gpus)
