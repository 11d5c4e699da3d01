"""The three scheduler verbs over the cluster state: filter, prioritize, bind.

No HTTP here: wire models in, wire models out, so the server stays a thin shell
and the tests drive the logic directly. Filter is optimistic (it reads the
cached accounts); bind is authoritative (it re-checks against every pod bound
or being bound, and holds the pod on the node before it awaits the apiserver).
"""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from extender.state import ClusterState
from extender.verdicts import UNKNOWN_NODE
from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    host_priority_item,
    json_array,
)
from headroom.claims import PodClaim, parse_claim
from headroom.placement import Fit, fit, score
from headroom.podspec import PodError

log = logging.getLogger(__name__)

Binder = Callable[[str, str, str, str], Awaitable[None]]
"""``(namespace, name, uid, node)``: create the pod's ``pods/binding``; raises BindError."""

NOT_READY = "headroom extender: caches not synced yet (nodes, pods, GPUNodeReports); retry"


class BindError(RuntimeError):
    """The apiserver refused or failed the binding; the message says why.

    ``uncertain``: no definite answer came back (a read timeout, a dropped
    connection, a 5xx), so the binding may exist all the same. The pod then
    stays assumed on the node until the pod watch shows where it went or the
    assumption times out: releasing it now could let another pod take the
    memory of a pod that is in fact bound there.
    """

    def __init__(self, message: str, *, uncertain: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain


@dataclass(frozen=True)
class Candidates:
    names: list[str]
    objects: dict[str, dict[str, Any]] | None = None
    """NodeList mode: name -> node object as received, to echo back."""


class CandidateError(ValueError):
    pass


class Extender:
    def __init__(
        self, state: ClusterState, binder: Binder, ready: Callable[[], bool] = lambda: True
    ) -> None:
        self.state = state
        self.binder = binder
        self.ready = ready

    # --- filter -------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            claim = _claim(args)
            candidates = _candidates(args)
        except CandidateError as err:
            return ExtenderFilterResult(NodeNames=[], Error=str(err))
        self.state.remember(claim)
        if not claim.wants_gpu:
            return _result(args, candidates, candidates.names, {}, {})
        if not self.ready():
            return ExtenderFilterResult(NodeNames=[], Error=NOT_READY)
        if claim.problem:
            unresolvable = dict.fromkeys(candidates.names, claim.problem)
            return _result(args, candidates, [], {}, unresolvable)

        state = self.state
        now = state.clock()
        state.prepare(now)
        accounts = state.accounts()
        if not claim.mig:  # shared only: the common case, over the flat index
            passed, failed = state.verdicts.filter(
                candidates.names, claim, state.shared_headroom, accounts
            )
            return _result(args, candidates, passed, failed, {})
        passed, failed = [], {}
        for name in candidates.names:
            account = accounts.get(name)
            verdict = Fit(False, UNKNOWN_NODE) if account is None else fit(account, claim)
            if verdict.fits:
                passed.append(name)
            else:
                failed[name] = verdict.reason
        return _result(args, candidates, passed, failed, {})

    # --- prioritize ---------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> bytes:
        """The HostPriorityList (JSON) for every candidate; raises CandidateError if malformed."""
        claim = _claim(args)
        names = _candidates(args).names
        if not claim.wants_gpu or claim.problem or not self.ready():
            return json_array(host_priority_item(name, 0) for name in names)
        state = self.state
        state.prepare(state.clock())
        if not claim.mig:  # shared only: the common case, over the flat index
            return json_array(state.verdicts.scores(names, claim, state.shared_room))
        accounts = state.accounts()
        return json_array(
            host_priority_item(name, 0 if (a := accounts.get(name)) is None else score(a, claim))
            for name in names
        )

    # --- bind ---------------------------------------------------------------

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        namespace, name, uid, node = args.PodNamespace, args.PodName, args.PodUID, args.Node
        key = f"{namespace}/{name}"
        if not self.ready():
            return ExtenderBindingResult(Error=NOT_READY)
        claim = self.state.lookup(uid, namespace, name)
        if claim is None:
            return ExtenderBindingResult(
                Error=f"pod {key} (uid {uid or '?'}) is not in the extender's cache yet; retry"
            )
        if (claim.namespace, claim.name) != (namespace, name):
            return ExtenderBindingResult(
                Error=f"uid {uid} belongs to pod {claim.key}, not {key}; not binding"
            )
        assumed_here = False
        if claim.wants_gpu:
            fresh = claim.uid not in self.state.assumed
            # Check and hold in one step, with no await between: this is the race guard.
            verdict = self.state.assume(claim, node)
            if not verdict.fits:
                log.info("bind of %s to %s refused: %s", key, node, verdict.reason)
                return ExtenderBindingResult(Error=f"not binding {key} to {node}: {verdict.reason}")
            assumed_here = fresh and claim.uid in self.state.assumed
        try:
            await self.binder(namespace, name, uid, node)
        except BindError as err:
            if assumed_here and not err.uncertain:
                self.state.forget(claim.uid)
            return ExtenderBindingResult(Error=f"binding {key} to {node} failed: {err}")
        log.info("bound %s to %s", key, node)
        return ExtenderBindingResult()


def _claim(args: ExtenderArgs) -> PodClaim:
    if args.Pod is None:
        raise CandidateError("Pod: missing (null)")
    try:
        return parse_claim(args.Pod)
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
