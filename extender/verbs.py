"""The three scheduler verbs over the cluster state: filter, prioritize, bind.

No HTTP here: wire models in, wire models out, so the server stays a thin shell
and the tests drive the logic directly. Filter reads the cached accounts and,
when it answers the one node it chose, holds the pod there; bind is
authoritative (it re-checks against every pod bound or being bound, and holds
the pod on the node before it awaits the apiserver).
"""

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.preemption import Offers, offer, preempt
from extender.state import ClusterState
from extender.verdicts import UNKNOWN_NODE
from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    host_priority_item,
    json_array,
)
from headroom.claims import PodClaim
from headroom.disruption import Budget
from headroom.names import HEADROOM_SCHEDULER
from headroom.placement import Fit, fit, score
from headroom.podspec import PodError
from headroom.preemption import BUDGET_SECONDS

log = logging.getLogger(__name__)

Binder = Callable[[str, str, str, str], Awaitable[None]]
"""``(namespace, name, uid, node)``: create the pod's ``pods/binding``; raises BindError."""
Reader = Callable[[str, str], Awaitable[dict[str, Any] | None]]
"""``(namespace, name)``: the pod as the apiserver has it now, None if there is none;
raises ReadError when it cannot tell."""


class ReadError(RuntimeError):
    """The apiserver could not be asked where a pod is; nothing is released."""


UNBOUND = "not bound"
GONE = "gone (deleted or recreated)"
NOT_READY = "headroom extender: caches not synced yet (nodes, pods, GPUNodeReports); retry"


class BindError(RuntimeError):
    """The apiserver refused or failed the binding; the message says why.

    ``uncertain``: no definite answer came back (a read timeout, a dropped
    connection, a 5xx), so the binding may exist all the same. The pod then
    stays assumed on the node until the pod watch shows where it went or a
    read of the pod says it is not bound: releasing it now could let another
    pod take the memory of a pod that is in fact bound there.
    """

    def __init__(self, message: str, *, uncertain: bool = False, conflict: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain
        self.conflict = conflict
        """HTTP 409: the pod is bound already (perhaps by an earlier, timed-out try of ours)."""


@dataclass(frozen=True)
class Candidates:
    names: list[str]
    objects: dict[str, dict[str, Any]] | None = None
    """NodeList mode: name -> node object as received, to echo back."""


class CandidateError(ValueError):
    pass


async def _no_reader(namespace: str, name: str) -> dict[str, Any] | None:
    raise ReadError("no reader configured")


class Extender:
    def __init__(
        self,
        state: ClusterState,
        binder: Binder,
        ready: Callable[[], bool] = lambda: True,
        *,
        reader: Reader = _no_reader,
        scheduler_name: str = HEADROOM_SCHEDULER,
        budgets: Mapping[str, Budget] | None = None,
        offers: Offers | None = None,
        choose: bool = False,
        preempt_budget: float = BUDGET_SECONDS,
        waiting: Callable[[], str | None] = lambda: None,
        starting: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.state = state
        self.waiting = waiting
        """Why filter and bind must wait now (extender.leadership.Leadership.waiting)."""
        self.starting = starting
        """Why, just started, it is not ready yet (Leadership.starting): /readyz says so."""
        self.choose = choose
        self.preempt_budget = preempt_budget
        """Seconds the preempt verb may work (extender.preemption.BUDGET_SECONDS)."""
        """Answer a GPU pod's filter with the one node it scores best on (see :meth:`_chosen`)."""
        self.binder = binder
        self.ready = ready
        self.reader = reader
        self.scheduler_name = scheduler_name
        self.budgets: Mapping[str, Budget] = {} if budgets is None else budgets
        """PodDisruptionBudgets by namespace/name (extender.preemption.Budgets)."""
        self.offers = offers if offers is not None else Offers()
        state.on_nominated = self.offers.on_nominated
        self.in_flight: Counter[str] = Counter()
        """UID -> binds of it awaiting the apiserver: no read releases such a pod."""

    # --- filter -------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            claim = _claim(args, self.state)
            candidates = _candidates(args)
        except CandidateError as err:
            return ExtenderFilterResult(NodeNames=[], Error=str(err))
        self.state.remember(claim)
        if not claim.wants_gpu:
            # kube-scheduler sends a pod that names a managed resource even at a count
            # of 0, and this extender is then its binder: a pass here would end in a
            # bind refused on every retry. Refused here, the pod waits with the reason.
            refusal = dict.fromkeys(candidates.names, self._refusal(claim))
            return _result(args, candidates, [], {}, refusal)
        if not self.ready():
            return ExtenderFilterResult(NodeNames=[], Error=NOT_READY)
        if (wait := self.waiting()) is not None:
            return ExtenderFilterResult(NodeNames=[], Error=wait)
        if claim.problem:
            unresolvable = dict.fromkeys(candidates.names, claim.problem)
            return _result(args, candidates, [], {}, unresolvable)

        state = self.state
        now = state.clock()
        state.prepare(now)
        accounts = state.accounts()
        if not claim.mig and claim.shared <= 1:  # the common case, over the flat index
            passed, failed = state.verdicts.filter(
                candidates.names, claim, state.shared_headroom, accounts
            )
        else:
            passed, failed = [], {}
            for name in candidates.names:
                account = accounts.get(name)
                verdict = Fit(False, UNKNOWN_NODE) if account is None else fit(account, claim)
                if verdict.fits:
                    passed.append(name)
                else:
                    failed[name] = verdict.reason
            if claim.shared > 1:
                passed = self._with_replicas(args, claim, passed, failed)
        if state.nominated:
            passed, failed = self._nominated_room(claim, passed, failed)
        if claim.uid in self.state.assumed:
            # Copies: the verdict cache may hand out its own lists.
            passed, failed = list(passed), dict(failed)
            self._own_holds(claim, passed, failed)
        if self.choose and passed and not _prefers(args.Pod):
            chosen = self._chosen(claim, passed) if len(passed) > 1 else passed[0]
            passed = [chosen]
            # kube-scheduler has no other node for this pod: charge it there now, so
            # the next pod's filter, which may come before this one's bind, sees it.
            # Only ever more than before: the bind verb still re-checks, and the
            # hold ends like a bind's (the watch, or a read while no bind is in
            # flight), never on a timer. A pod held elsewhere keeps those holds.
            self.state.assume(claim, chosen)
        return _result(args, candidates, passed, failed, {})

    def _with_replicas(
        self, args: ExtenderArgs, claim: PodClaim, passed: list[str], failed: dict[str, str]
    ) -> list[str]:
        """Of ``passed``, the nodes a pod of several replicas fits in the account worked
        out with it (:meth:`ClusterState.fit`), the others into ``failed``.

        That is a whole account per node (0.4 ms on an 8-GPU node with two dozen
        pods). Where one node is to be chosen (:meth:`_chosen`), only as many are
        worked out as it takes, best score first.
        """
        state = self.state
        if self.choose and not _prefers(args.Pod) and claim.uid not in state.assumed:
            accounts = state.accounts()
            order = sorted(
                range(len(passed)), key=lambda i: (-score(accounts[passed[i]], claim), i)
            )
            for i in order:
                verdict = state.fit(claim, passed[i])
                if verdict.fits:
                    return [passed[i]]
                failed[passed[i]] = verdict.reason
            return []
        kept = []
        for name in passed:
            verdict = state.fit(claim, name)
            if verdict.fits:
                kept.append(name)
            else:
                failed[name] = verdict.reason
        return kept

    def _nominated_room(
        self, claim: PodClaim, passed: list[str], failed: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """``passed`` less the nodes where the pods kube-scheduler's preemption nominated
        there ahead of this one leave it no room (:meth:`ClusterState.ahead`), refused.

        kube-scheduler keeps a preemptor's room from pods of no higher priority by its
        own plugins only, by node-level resources: on a node of several GPUs another
        pod could take the GPU the victims freed, and the preemptor would preempt again
        (its victims, then the pod that took their room, ...). Copies: the verdict
        cache may hand out its own lists."""
        state = self.state
        refused = {}
        for name in passed:
            if state.ahead(claim, name):
                verdict = state.fit(claim, name)
                if not verdict.fits:
                    refused[name] = verdict.reason
        if not refused:
            return passed, failed
        return [name for name in passed if name not in refused], {**failed, **refused}

    def _chosen(self, claim: PodClaim, passed: list[str]) -> str:
        """The node of ``passed`` the prioritize verb would score highest, exactly.

        Given one feasible node, kube-scheduler neither scores nor calls
        prioritize (schedulePod in pkg/scheduler/schedule_one.go): one round
        trip and its own scoring of every candidate saved per pod, 258-269 ->
        313-338 pods/s in the 300-node storm (README, Benchmarks). The other
        nodes are left out of the answer rather than refused, so nothing about
        them reaches the pod's events. A node this pod already holds (a bind
        that may have landed, or an earlier filter) comes first, so a retry
        does not hold a second node.
        """
        for node in self.state.assumed.get(claim.uid, {}):
            if node in passed:
                return node
        state = self.state
        spread = claim.placement == "spread"
        if not claim.mig and claim.shared <= 1:
            room, need = state.shared_room, claim.need

            def left(name: str) -> float:  # share of its tightest GPU left after the pod
                free, total = room.get(name, (0, 0))
                return (free - need) / total if total > 0 else -1.0  # -1: not in the cache

            if spread:
                return max(passed, key=left)

            def tightest(name: str) -> tuple[bool, float]:  # the least left, nodes that fit first
                share = left(name)
                return share < 0, share

            return min(passed, key=tightest)
        accounts = state.accounts()
        scores = [0 if (a := accounts.get(name)) is None else score(a, claim) for name in passed]
        return passed[scores.index(max(scores))]

    def _own_holds(self, claim: PodClaim, passed: list[str], failed: dict[str, str]) -> None:
        """A node refused only because of this very pod's own unconfirmed bind passes.

        kube-scheduler retries a pod whose bind timed out; the extender still
        charges it where that bind may have landed, and must not hold that
        against the pod itself, or it waits for an unrelated event to be retried.
        """
        for name in self.state.assumed.get(claim.uid, {}):
            if name in failed and self.state.fit(claim, name, without=claim.uid).fits:
                del failed[name]
                passed.append(name)

    # --- prioritize ---------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> bytes:
        """The HostPriorityList (JSON) for every candidate; raises CandidateError if malformed."""
        claim = _claim(args, self.state)
        names = _candidates(args).names
        if not claim.wants_gpu or claim.problem or not self.ready():
            return json_array(host_priority_item(name, 0) for name in names)
        state = self.state
        state.prepare(state.clock())
        if not claim.mig and claim.shared <= 1:  # the common case, over the flat index
            return json_array(state.verdicts.scores(names, claim, state.shared_room))
        accounts = state.accounts()
        return json_array(
            host_priority_item(name, 0 if (a := accounts.get(name)) is None else score(a, claim))
            for name in names
        )

    # --- preempt ------------------------------------------------------------

    async def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        """kube-scheduler's candidate nodes, kept only where victims free a GPU (raises
        PreemptionError for a request it cannot use)."""
        if not self.ready() or self.waiting() is not None:
            # Blind caches, or binds not seen yet, could name too few victims; no node
            # is safer than a wrong one.
            return ExtenderPreemptionResult()
        self.state.prepare(self.state.clock())
        result = await preempt(args, self.state, self.budgets, budget=self.preempt_budget)
        if not self.ready() or self.waiting() is not None:
            return ExtenderPreemptionResult()  # lost meanwhile: the answer is not ours to give
        offer(args, result, self.state, self.offers)
        return result

    # --- bind ---------------------------------------------------------------

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        namespace, name, uid, node = args.PodNamespace, args.PodName, args.PodUID, args.Node
        key = f"{namespace}/{name}"
        if not self.ready():
            return ExtenderBindingResult(Error=NOT_READY)
        if (wait := self.waiting()) is not None:
            return ExtenderBindingResult(Error=wait)
        claim = self.state.lookup(uid, namespace, name)
        if claim is None:
            return ExtenderBindingResult(
                Error=f"pod {key} (uid {uid or '?'}) is not in the extender's cache yet; retry"
            )
        if (claim.namespace, claim.name) != (namespace, name):
            return ExtenderBindingResult(
                Error=f"uid {uid} belongs to pod {claim.key}, not {key}; not binding"
            )
        refusal = self._refusal(claim)
        if refusal:
            log.info("bind of %s to %s refused: %s", key, node, refusal)
            return ExtenderBindingResult(Error=f"not binding {key} to {node}: {refusal}")
        if (answer := self._bound(claim, node)) is not None:
            return answer
        # Check and hold in one step, with no await between: this is the race guard.
        verdict = self.state.assume(claim, node)
        holds = self.state.assumed.get(claim.uid, {})
        if not verdict.fits and holds and node not in holds:
            # Held elsewhere by an earlier bind kube-scheduler gave up on (it timed
            # out): ask the apiserver where the pod is rather than refuse for long.
            where = await self._where(claim)
            if where == node:
                return ExtenderBindingResult()
            if where == GONE:
                return ExtenderBindingResult(Error=f"pod {key} is {GONE}; not binding")
            if where not in (UNBOUND, None):
                return ExtenderBindingResult(Error=f"pod {key} is already bound to {where}")
            if where is None:
                return ExtenderBindingResult(
                    Error=f"not binding {key} to {node}: {verdict.reason}, and the pod could "
                    "not be read to tell; retry"
                )
            if (answer := self._bound(claim, node)) is not None:
                return answer  # the watch showed it bound while the read was out
            if (wait := self.waiting()) is not None:
                return ExtenderBindingResult(Error=wait)  # the lease moved while it was out
            verdict = self.state.assume(claim, node, also=True)
        if not verdict.fits:
            log.info("bind of %s to %s refused: %s", key, node, verdict.reason)
            return ExtenderBindingResult(Error=f"not binding {key} to {node}: {verdict.reason}")
        self.state.posting(claim.uid, node)
        self.in_flight[claim.uid] += 1
        try:
            await self.binder(namespace, name, uid, node)
        except BindError as err:
            if err.conflict:
                # The pod is bound already, maybe by an earlier, timed-out try of ours.
                # Only a read says where (and moves the charge there); until one does,
                # the hold stays: it may be the very binding that was stored.
                if await self._where(claim) == node:
                    return ExtenderBindingResult()
            elif not err.uncertain and self._only_post(claim.uid, node):
                self.state.forget(claim.uid, node)
            return ExtenderBindingResult(Error=f"binding {key} to {node} failed: {err}")
        finally:
            self.in_flight[claim.uid] -= 1
            if not self.in_flight[claim.uid]:
                del self.in_flight[claim.uid]
        # Stored: the pod's nodeName is set, so no earlier try elsewhere can land any
        # more; charged here (again, should anything have let go meanwhile) until the
        # watch shows it.
        self.state.hold(claim, node)
        seen = self.state.pods.get(claim.uid)
        if seen is not None and not seen.node:  # the watch has not shown it yet: time it
            self.state.bound_at[claim.uid] = self.state.clock()
        log.debug("bound %s to %s", key, node)  # kube-scheduler records the Scheduled event
        return ExtenderBindingResult()

    def _bound(self, claim: PodClaim, node: str) -> ExtenderBindingResult | None:
        """The answer when the pod cache shows the pod bound already, else None."""
        cached = self.state.pods.get(claim.uid)
        if cached is None or not cached.node:
            return None
        if cached.node == node:
            return ExtenderBindingResult()  # a retry of a bind that landed
        return ExtenderBindingResult(Error=f"pod {claim.key} is already bound to {cached.node}")

    def _only_post(self, uid: str, node: str) -> bool:
        """Whether the POST now ending is the only one of the pod to ``node`` that may be
        stored: none other in flight, none earlier under the same hold (which ended
        uncertain, or the hold would be gone). Only then may its refusal end the hold."""
        hold = self.state.assumed.get(uid, {}).get(node)
        return self.in_flight[uid] == 1 and (hold is None or hold.posts <= 1)

    def _refusal(self, claim: PodClaim) -> str:
        """Why this extender must not bind the pod at all ("" when it may)."""
        if not claim.wants_gpu:
            return "the headroom extender binds only pods asking for a shared GPU or MIG slice"
        if claim.scheduler != self.scheduler_name:
            return (
                f"spec.schedulerName is {claim.scheduler}, not {self.scheduler_name}, "
                "whose extender this is"
            )
        return ""

    # --- verification -------------------------------------------------------

    async def verify_due(self) -> int:
        """Read the pods whose assumptions are old enough; release those not bound. Count released.

        The only way, besides the pod watch and a definite refusal, that an
        assumption ends: a pod read as unbound, gone, or recreated (another
        UID). An unbound read releases only the holds that were due when it was
        sent and that no binding POST has touched since: a bind that began and
        even succeeded while the read was out is not undone by its stale answer.
        A failed read releases nothing.
        """
        released = 0
        state = self.state
        for claim in state.due(state.hold_clock()):
            if claim.uid in self.in_flight or claim.uid not in state.assumed:
                continue
            cutoff = state.hold_clock() - state.verify_after
            due = {n: h.since for n, h in state.assumed[claim.uid].items() if h.since <= cutoff}
            where = await self._where(claim)
            if where == UNBOUND and claim.uid not in self.in_flight:
                holds = state.assumed.get(claim.uid, {})
                gone = [n for n, since in due.items() if n in holds and holds[n].since == since]
                for node in gone:
                    state.forget(claim.uid, node)
                if gone:
                    log.info(
                        "%s is not bound (read from the apiserver): released from %s",
                        claim.key,
                        ", ".join(sorted(gone)),
                    )
                    released += 1
            elif where == GONE:
                released += 1
        return released

    async def _where(self, claim: PodClaim) -> str | None:
        """Where the apiserver says the pod is: a node, UNBOUND, GONE; None if it cannot say."""
        try:
            pod = await self.reader(claim.namespace, claim.name)
        except ReadError as err:
            log.warning("cannot read pod %s: %s", claim.key, err)
            return None
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        if pod is None or (claim.uid and uid != claim.uid):
            self.state.gone(claim.uid)
            return GONE
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            # Charged there until the watch confirms it (or shows it deleted). A read is
            # never fed to the pod cache: it may be older than a deletion the watch has
            # already delivered, and would bring the pod back for good.
            self.state.hold(claim, str(node))
            return str(node)
        return UNBOUND


def _prefers(pod: dict[str, Any] | None) -> bool:
    """Whether the pod states a soft preference only kube-scheduler's scorers weigh:
    preferred node or pod (anti-)affinity, or a ``ScheduleAnyway`` spread constraint.
    Such a pod's filter answers every node that fits, and the scores decide."""
    spec = (pod or {}).get("spec")
    if not isinstance(spec, dict):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if isinstance(terms, dict) and terms.get(
                "preferredDuringSchedulingIgnoredDuringExecution"
            ):
                return True
    constraints = spec.get("topologySpreadConstraints")
    return isinstance(constraints, list) and any(
        isinstance(c, dict) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in constraints
    )


def _claim(args: ExtenderArgs, state: ClusterState) -> PodClaim:
    if args.Pod is None:
        raise CandidateError("Pod: missing (null)")
    try:
        return state.parse(args.Pod)
    except PodError as err:
        raise CandidateError(f"Pod.{err}") from err


def _candidates(args: ExtenderArgs) -> Candidates:
    if args.NodeNames is not None:
        return Candidates(args.NodeNames)
    if args.Nodes is None:
        raise CandidateError("NodeNames and Nodes are both null: no candidate nodes")
    objects: dict[str, dict[str, Any]] = {}
    for index, node in enumerate(args.Nodes.items):
        metadata = node.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not isinstance(name, str) or not name:
            raise CandidateError(f"Nodes.items.{index}.metadata.name: missing or not a string")
        objects[name] = node
    return Candidates(list(objects), objects)


def _result(
    args: ExtenderArgs,
    candidates: Candidates,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> ExtenderFilterResult:
    nodes = None
    if candidates.objects is not None and args.Nodes is not None:
        kept = [candidates.objects[name] for name in passed]
        nodes = args.Nodes.model_copy(update={"items": kept})
    return ExtenderFilterResult.model_construct(
        Nodes=nodes,
        NodeNames=passed,
        FailedNodes=failed,
        FailedAndUnresolvableNodes=unresolvable,
        Error="",
    )
