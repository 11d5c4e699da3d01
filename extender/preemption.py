"""The ``preempt`` verb: make kube-scheduler's victims right per GPU.

kube-scheduler runs preemption itself (DefaultPreemption, PostFilter): for each
node where removing lower-priority pods would let the preemptor pass its own
filter plugins, it picks victims, then hands every such candidate node and its
victims to each extender with a ``preemptVerb`` (``callExtenders`` in
pkg/scheduler/framework/preemption/preemption.go). The extender answers the
nodes it keeps, each with the victims it wants; kube-scheduler then picks one
node by its usual rules (fewest PodDisruptionBudget violations, lowest
priorities, fewest victims), deletes those victims gracefully with a
``Preempted`` Event on each, and nominates the preemptor to the node.

kube-scheduler's victims free enough of the node-level ``headroom.dev/gpu-memory``
(and ``nvidia.com/gpu.shared`` slots) but know nothing of GPUs: on a node with
several GPUs they may be spread so no single GPU has room, and they ignore
memory the node agent measured above declarations. Here, per node:

- kube-scheduler's victims are kept (they are what makes the node-level
  resources fit, and more victims never undo that);
- the set must make room by the filter's own rule on the node's account worked
  out without the victims (:meth:`ClusterState.fit` with ``gone``): their
  departures recorded as the watch will record them, their memory gone from
  the report, the departure history as it will stand after their grace
  (:data:`HORIZON_SECONDS`), the preemptor's own holds left out;
- where kube-scheduler's victims do not, pods are added: those
  :func:`headroom.preemption.victims_on_node` picks so that every shared GPU
  frees the preemptor's memory by the charges, then one at a time the lowest
  of the rest (PodDisruptionBudgets last); each added pod is then reprieved,
  the most valuable first, where the rest suffice. A node that cannot be freed
  is dropped (an empty victim list is an error to kube-scheduler and would stop
  its preemption for every node);
- ``NumPDBViolations`` is recounted over the final set as kube-scheduler does.

A MIG preemptor keeps kube-scheduler's answer: MIG slices are whole extended
resources kube-scheduler counts exactly; one that also asks a shared slot is
checked as a shared one. A preemptor the filter refuses everywhere (legacy, or
with a problem) gets no node. Victims are answered most important first, as
kube-scheduler reads them.
"""

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from extender.state import ClusterState
from extender.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims
from headroom.accounting import NodeAccount
from headroom.claims import PodClaim, parse_claim
from headroom.disruption import Budget, Evictee, parse_budget, protected, violations
from headroom.podspec import PodError
from headroom.preemption import BUDGET_SECONDS, GPURoom, Resident, victims_on_node
from kube.rest import Rest

log = logging.getLogger(__name__)

HORIZON_SECONDS = 60.0
"""How far ahead the victims' freeing must hold: their grace period (30 s by
default), kubelet confirming, and the agent's report showing the memory gone."""


class Budgets(dict[str, Budget]):
    """PodDisruptionBudgets by ``namespace/name``, fed by the extender's PDB watch."""

    def on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata")
        if not isinstance(metadata, Mapping):
            return
        key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
        if kind == "DELETED":
            self.pop(key, None)
            return
        try:
            self[key] = parse_budget(obj)
        except PodError as err:
            # Unreadable: counts as protecting nothing here, as kube-scheduler
            # skips a PDB whose selector it cannot parse.
            log.warning("PodDisruptionBudget %s ignored: %s", key, err)
            self.pop(key, None)


class PreemptionError(ValueError):
    """The request cannot be used; the message names the field."""


Recorder = Callable[[PodClaim, str, str], Awaitable[None]]
"""``(pod, reason, message)``: record a Normal Event on the pod; may raise."""
EVENT_REASON = "GPUMemoryPreemption"
COMPONENT = "headroom-extender"
OFFERS_KEPT = 1000


class Offers:
    """The victims offered per preemptor and node, until kube-scheduler nominates one.

    kube-scheduler's ``Preempted`` Event names the preemptor on each victim, but
    the preemptor itself gets only its ``FailedScheduling`` fit error. Once the
    pod watch shows ``status.nominatedNodeName`` on a node the verb offered,
    this records an Event on the preemptor naming the victims and why.
    """

    def __init__(self, recorder: Recorder | None = None, limit: int = OFFERS_KEPT) -> None:
        self.recorder = recorder
        self.limit = limit
        self._offers: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.recorded = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def offer(self, preemptor: PodClaim, node: str, message: str) -> None:
        self._offers.setdefault(preemptor.uid, {})[node] = message
        self._offers.move_to_end(preemptor.uid)
        while len(self._offers) > self.limit:
            self._offers.popitem(last=False)

    def on_nominated(self, claim: PodClaim) -> None:
        """Called on the event loop for a pod the watch shows nominated and unbound."""
        message = self._offers.get(claim.uid, {}).get(claim.nominated)
        if message is None:
            return
        del self._offers[claim.uid]
        if self.recorder is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._record(claim, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, claim: PodClaim, message: str) -> None:
        assert self.recorder is not None
        try:
            await self.recorder(claim, EVENT_REASON, message)
        except Exception as err:  # an Event is information; losing one harms nothing
            log.info("Event on %s not recorded: %s: %s", claim.key, type(err).__name__, err)
            return
        self.recorded += 1


def api_recorder(rest: Rest, *, timeout: float = 5.0) -> Recorder:
    async def record(pod: PodClaim, reason: str, message: str) -> None:
        now = datetime.now(UTC).isoformat()
        body: Any = {
            "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        namespace = quote(pod.namespace, safe="")
        answer = await rest.request(
            "POST", f"/api/v1/namespaces/{namespace}/events", body, time_limit=timeout
        )
        answer.check()

    return record


async def preempt(
    args: ExtenderPreemptionArgs,
    state: ClusterState,
    budgets: Mapping[str, Budget],
    *,
    budget: float = BUDGET_SECONDS,
    timer: Callable[[], float] = time.monotonic,
) -> ExtenderPreemptionResult:
    """The candidate nodes kept, each with its victims.

    Checked in two passes, the event loop free between nodes (filter, bind and the
    watches go on meanwhile; each node is worked out from the cache as it is then):
    first every node where kube-scheduler's own victims make room (one trial each),
    then the nodes that need more, while ``budget`` seconds last. A node not checked
    by then is left out, never answered unchecked, and the log says how many.
    The answer is only offered (:func:`offer`) once the caller knows it stands.
    """
    if args.Pod is None:
        raise PreemptionError("Pod: missing (null)")
    try:
        preemptor = parse_claim(args.Pod)
    except PodError as err:
        raise PreemptionError(f"Pod.{err}") from err
    proposed, counted = _proposed(args)
    kept: dict[str, MetaVictims] = {}
    pdbs = list(budgets.values())
    started, visits, checked = timer(), 0, 0
    deferred: list[tuple[str, list[str]]] = []

    async def turn() -> bool:  # False: out of time
        nonlocal visits
        visits += 1
        if visits > 1:
            await asyncio.sleep(0)
            state.prepare(state.clock())  # may work out every node after a re-list
            if timer() - started > budget:
                return False
        return True

    for quick in (True, False):
        for node, uids in proposed.items() if quick else deferred:
            if not await turn():
                break
            victims = _victims(preemptor, node, uids, state, pdbs, quick=quick)
            if victims is None:
                deferred.append((node, uids))
                continue
            checked += 1
            if victims:
                kept[node] = _keep(node, victims, counted, state, pdbs)
            else:
                log.info(
                    "preemption of %s: node %s dropped, no victims free a GPU",
                    preemptor.key,
                    node,
                )
    if checked < len(proposed):
        log.warning(
            "preemption of %s: %d of %d candidate nodes left unchecked after %.1f s "
            "(the verb's budget, below kube-scheduler's httpTimeout); %d offered",
            preemptor.key,
            len(proposed) - checked,
            len(proposed),
            timer() - started,
            len(kept),
        )
    return ExtenderPreemptionResult(NodeNameToMetaVictims=kept)


def offer(
    args: ExtenderPreemptionArgs,
    result: ExtenderPreemptionResult,
    state: ClusterState,
    offers: Offers,
) -> None:
    """Remember the victims of each node the answer keeps, for the preemptor's Event
    once kube-scheduler nominates it to one of them."""
    if args.Pod is None or not result.NodeNameToMetaVictims:
        return
    preemptor = parse_claim(args.Pod)
    for node, meta in result.NodeNameToMetaVictims.items():
        victims = [pod.UID for pod in meta.Pods]
        offers.offer(preemptor, node, _explain(preemptor, node, victims, state))


def _keep(
    node: str,
    victims: list[str],
    counted: Mapping[str, int],
    state: ClusterState,
    pdbs: list[Budget],
) -> MetaVictims:
    evictees = [_evictee(state, uid) for uid in victims]
    return MetaVictims(
        Pods=[MetaPod(UID=uid) for uid in victims],
        # A superset of kube-scheduler's victims violates at least what they did;
        # its count also covers victims this cache does not hold.
        NumPDBViolations=max(violations(evictees, pdbs), counted.get(node, 0)),
    )


def _victims(
    preemptor: PodClaim,
    node: str,
    given: list[str],
    state: ClusterState,
    pdbs: list[Budget],
    *,
    quick: bool = False,
) -> list[str] | None:
    """The victims on ``node`` (kube-scheduler's first), or [] to drop the node;
    ``quick``: None where kube-scheduler's victims do not suffice alone."""
    if preemptor.legacy or preemptor.problem:
        # The filter refuses it on every node, victims or not (a legacy pod, one asking
        # gpu.shared without headroom.dev/gpu-memory, is a resolvable refusal, so
        # kube-scheduler does preempt for it): evicting any would be for nothing.
        return []
    if not preemptor.shared:
        # MIG only: slices are whole resources kube-scheduler counts exactly. A pod
        # asking a shared slot besides its slices is checked below (the filter's rule
        # covers both).
        return given
    account = state.account(node)
    if account is None:
        return []
    chosen = set(given)

    def frees(gone: set[str]) -> bool:
        # The filter's own rule on the account worked out without them, their
        # departures recorded as the watch will record them and the history as it
        # will stand when the preemptor is retried: summing the charges they free
        # overstates it where one is not located yet, since the spread bound then
        # charges the others more. This pod's own holds are not held against it.
        return state.fit(
            preemptor, node, without=preemptor.uid, gone=gone, horizon=HORIZON_SECONDS
        ).fits

    if frees(chosen):
        return given
    if quick:
        return None
    picked, rest = _candidates(preemptor, node, account, chosen, state, pdbs)
    order = picked + rest
    if picked and frees(chosen | set(picked)):
        taken = len(picked)
    elif not frees(chosen | set(order)):
        return []  # never evict for nothing
    else:
        # The shortest run of ``order`` that frees it, by bisection: each try works a
        # whole account out, and a node may hold dozens of pods. The run found is
        # checked (``taken`` only ever ends on one that frees it).
        low, taken = len(picked) + 1, len(order)
        while low < taken:
            middle = (low + taken) // 2
            if frees(chosen | set(order[:middle])):
                taken = middle
            else:
                low = middle + 1
    added = order[:taken]
    chosen.update(added)
    # kube-scheduler's reprieve: of the pods added, the most valuable (protected by a
    # PodDisruptionBudget, then the highest priority) stay wherever the rest suffice.
    for uid in sorted(added, key=lambda uid: _worth(state, uid, pdbs), reverse=True):
        chosen.discard(uid)
        if not frees(chosen):
            chosen.add(uid)
    return _ordered(state, given, [uid for uid in added if uid in chosen])


def _ordered(state: ClusterState, given: list[str], added: list[str]) -> list[str]:
    """kube-scheduler's victims and the pods added, most important first.

    kube-scheduler orders a node's victims so (``SelectVictimsOnNode``), and
    ``pickOneNodeForPreemption`` reads the first as the node's highest-priority
    victim: an added pod of higher priority left after them would make the node look
    cheaper than it is. Its own victims keep their order (they are sorted already);
    one this cache does not hold (no GPU pod) is taken to rank as the one before it,
    the most it can, so no added pod goes ahead of it on a guess.
    """
    if not added:
        return given
    ranked: list[tuple[float, str]] = []
    bound = float("inf")
    for uid in given:
        claim = state.pods.get(uid)
        if claim is not None:
            bound = min(bound, claim.priority)
        ranked.append((bound, uid))
    for uid in added:
        claim = state.pods.get(uid)
        ranked.append((claim.priority if claim is not None else float("-inf"), uid))
    # Stable: kube-scheduler's victims stay ahead of added pods of equal priority.
    return [uid for _, uid in sorted(ranked, key=lambda item: -item[0])]


def _worth(state: ClusterState, uid: str, pdbs: list[Budget]) -> tuple[bool, int]:
    claim = state.pods.get(uid)
    return protected(_evictee(state, uid), pdbs), claim.priority if claim else 0


def _candidates(
    preemptor: PodClaim,
    node: str,
    account: NodeAccount,
    gone: set[str],
    state: ClusterState,
    pdbs: list[Budget],
) -> tuple[list[str], list[str]]:
    """Pods of ``node`` below the preemptor's priority that could go besides ``gone``:
    those :func:`victims_on_node` picks to give every GPU room by the charges they
    free, and the rest, PodDisruptionBudgets last, lowest priority and largest charge
    first."""
    rooms = []
    for gpu in account.gpus:
        if not gpu.shared:
            continue
        freed = sum(c.charged for c in gpu.pods if c.uid in gone)
        # Only pods the cache shows bound here can be victims: kube-scheduler turns
        # each victim's UID back into a pod on the node (convertPodUIDToPod in
        # pkg/scheduler/extender.go) and fails the whole preemption if it cannot, and
        # it has forgotten a pod whose bind timed out. A held pod still takes its room.
        residents = tuple(
            Resident(c.uid, claim.priority, c.charged, protected(_evictee(state, c.uid), pdbs))
            for c in gpu.pods
            if c.known
            and c.uid not in gone
            and (claim := state.pods.get(c.uid)) is not None
            and claim.node == node
        )
        rooms.append(GPURoom(str(gpu.index), gpu.headroom + freed, residents))
    first = victims_on_node(preemptor.need, preemptor.priority, rooms) if rooms else None
    picked = [] if first is None else [pod.uid for pod in first.pods if pod.uid not in gone]
    rest: dict[str, tuple[bool, int, int, str]] = {}
    for gpu in account.gpus:
        for c in gpu.pods:
            claim = state.pods.get(c.uid)
            if c.uid in gone or claim is None or claim.node != node:
                continue
            if claim.priority >= preemptor.priority:
                continue
            shield = protected(_evictee(state, c.uid), pdbs)
            _, _, memory, _ = rest.get(c.uid, (shield, claim.priority, 0, c.uid))
            rest[c.uid] = (shield, claim.priority, min(memory, -c.charged), c.uid)
    return picked, [uid for *_, uid in sorted(rest.values()) if uid not in picked]


def _explain(preemptor: PodClaim, node: str, victims: list[str], state: ClusterState) -> str:
    named = []
    for uid in victims:
        claim = state.pods.get(uid)
        named.append(f"{claim.key} (priority {claim.priority})" if claim else uid)
    return (
        f"preempting on node {node} so that every shared GPU there has {preemptor.need_text} "
        f"free for this pod (priority {preemptor.priority}): {', '.join(named)}"
    )


def _proposed(args: ExtenderPreemptionArgs) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Node -> victim UIDs and node -> PDB violations, as kube-scheduler proposed them."""
    if args.NodeNameToMetaVictims is not None:
        meta = {node: v for node, v in args.NodeNameToMetaVictims.items() if v is not None}
        return (
            {node: [pod.UID for pod in v.Pods] for node, v in meta.items()},
            {node: v.NumPDBViolations for node, v in meta.items()},
        )
    if args.NodeNameToVictims is not None:
        proposed, counted = {}, {}
        for node, whole in args.NodeNameToVictims.items():
            if whole is None:
                continue
            counted[node] = whole.NumPDBViolations
            uids = []
            for i, pod in enumerate(whole.Pods):
                metadata = pod.get("metadata")
                uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
                if not isinstance(uid, str) or not uid:
                    raise PreemptionError(
                        f"NodeNameToVictims.{node}.Pods.{i}.metadata.uid: missing"
                    )
                uids.append(uid)
            proposed[node] = uids
        return proposed, counted
    raise PreemptionError("NodeNameToMetaVictims and NodeNameToVictims are both null")


def _evictee(state: ClusterState, uid: str) -> Evictee:
    claim = state.pods.get(uid)
    if claim is None:
        return Evictee(uid, "", "")
    return Evictee(uid, claim.namespace, claim.name, claim.labels)
