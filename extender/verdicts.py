"""Per-node answers for shared-GPU pods, kept until the node's account changes.

kube-scheduler asks about the same candidates pod after pod, and the pods of
one Deployment or Job declare the same memory. So, per declaration, the set of
nodes a pod fits, the refusals, and each node's prioritize entry (JSON text)
are worked out once and reused until an event touches the node:
:class:`extender.state.ClusterState` calls :meth:`Verdicts.drop` wherever it
invalidates an account.

The last answer per declaration is kept too, with the candidate list it was
for. A request whose candidates equal the last one's (one C-speed list
comparison) is answered from it, patched for the few nodes whose accounts
changed since. That skips hashing and looking up thousands of freshly parsed
names, the bulk of a request's work at 5,000 nodes. Answers handed out are
shared with later requests: callers must not modify them.

Only the tables of the last few declarations are kept, and only nodes the
cache holds are remembered, so a request naming unknown nodes cannot grow them.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import filterfalse
from typing import Generic, TypeVar

from extender.wire import SCORE_ENDS, host_priority_item, host_priority_start
from headroom.accounting import NO_GPU_HEADROOM, NodeAccount
from headroom.claims import PodClaim
from headroom.placement import fit, shared_scores

UNKNOWN_NODE = "node is not in the extender's cache (unknown node, or the cache is behind)"
UNKNOWN_HEADROOM = NO_GPU_HEADROOM - 1
"""Below any node's headroom: a node missing from the index fails every pod."""
KEEP = 8
"""Declarations (and placements) whose tables are kept."""

T = TypeVar("T")


class _Recent(Generic[T]):
    """Up to ``keep`` values by key, least recently used dropped first."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self.values: OrderedDict[Hashable, T] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], T]) -> tuple[T, bool]:
        """The value for ``key`` (made if missing), and whether it was made now."""
        value = self.values.get(key)
        if value is not None:
            self.values.move_to_end(key)
            return value, False
        value = self.values[key] = make()
        if len(self.values) > self._keep:
            self.values.popitem(last=False)
        return value, True


class _Filter:
    """For one declaration: the cached nodes it fits, refusals, and the last answer.

    ``passing`` is built from the whole headroom index once, then kept up to
    date node by node: a node whose account changed is checked again at the
    next filter (``changed``).
    """

    __slots__ = ("changed", "last", "need", "passing", "reasons")

    def __init__(self, need: int, headroom: Mapping[str, int]) -> None:
        self.need = need
        self.passing = {name for name, room in headroom.items() if room >= need}
        self.reasons: dict[str, str] = {}
        self.changed: set[str] = set()
        self.last: tuple[list[str], list[str], dict[str, str]] | None = None
        """Candidates, names passed, refusals: the last answer."""

    def drop(self, node: str) -> None:
        self.reasons.pop(node, None)
        self.changed.add(node)

    def check(self, headroom: Mapping[str, int]) -> tuple[set[str], bool]:
        """Check the changed nodes again: them, and whether any now passes or fails anew."""
        changed, self.changed = self.changed, set()
        flipped = False
        need, room, passing = self.need, headroom.get, self.passing
        for name in changed:
            fits = room(name, UNKNOWN_HEADROOM) >= need
            if fits != (name in passing):
                flipped = True
                if fits:
                    passing.add(name)
                else:
                    passing.discard(name)
        return changed, flipped


class _Scores:
    """For one declaration and placement: each cached node's HostPriority, the last answer."""

    __slots__ = ("changed", "items", "last", "positions")

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.changed: set[str] = set()
        self.last: tuple[list[str], list[str]] | None = None
        self.positions: dict[str, int] | None = None
        """Name -> index in the last answer's candidates, made when first patched."""

    def drop(self, node: str) -> None:
        self.items.pop(node, None)
        self.changed.add(node)


class Verdicts:
    """Filter and prioritize for a pod that asks only for shared GPUs (the common case)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._filters: _Recent[_Filter] = _Recent(keep)
        """Declared bytes -> its answers."""
        self._scores: _Recent[_Scores] = _Recent(keep)
        """(bytes needed, spread) -> its answers."""
        self._hosts: dict[str, str] = {}
        """Node -> the start of its HostPriority, ``{"Host":"n1","Score":``."""

    def drop(self, node: str) -> None:
        """Forget what was worked out for ``node``: its account changed."""
        for answers in self._filters.values.values():
            answers.drop(node)
        for scores in self._scores.values.values():
            scores.drop(node)
        self._hosts.pop(node, None)

    def clear(self) -> None:
        self._filters.values.clear()
        self._scores.values.clear()
        self._hosts.clear()

    def filter(
        self,
        names: list[str],
        claim: PodClaim,
        headroom: Mapping[str, int],
        accounts: Mapping[str, NodeAccount],
    ) -> tuple[list[str], dict[str, str]]:
        """Names that pass and the reasons of those that fail, in the order given.

        ``headroom`` and ``accounts`` must be up to date for every cached node
        (:meth:`ClusterState.prepare`); a name missing from them is an unknown node.
        """
        if claim.legacy:
            # Declaring nothing is not declaring 0: fit() refuses a legacy pod on
            # every node, and so must the filter, or the bind refuses it in a loop.
            # Rare (pods admitted by Headroom 0.1): not kept.
            return [], {name: _refusal({}, name, claim, accounts) for name in names}
        answers, new = self._filters.get(claim.declared, lambda: _Filter(claim.need, headroom))
        changed, flipped = (set(), False) if new else answers.check(headroom)
        reasons = answers.reasons
        last = answers.last
        if last is not None and last[0] == names:
            names, passed, failed = last  # the same candidates as last time
            if not flipped:
                if changed.intersection(failed):
                    failed = dict(failed)  # handed out already: patch a copy
                    for name in changed.intersection(failed):
                        failed[name] = _refusal(reasons, name, claim, accounts)
                    answers.last = (names, passed, failed)
                return passed, failed
        fits = answers.passing.__contains__
        passed = list(filter(fits, names))
        known = reasons.get
        failed = {
            name: known(name) or _refusal(reasons, name, claim, accounts)
            for name in filterfalse(fits, names)
        }
        answers.last = (names, passed, failed)
        return passed, failed

    def scores(
        self, names: list[str], claim: PodClaim, room: Mapping[str, tuple[int, int]]
    ) -> list[str]:
        """One HostPriority (JSON text) per name; ``room`` as ClusterState.shared_room."""
        need, spread = claim.need, claim.placement == "spread"
        table, _ = self._scores.get((need, spread), _Scores)
        items = table.items
        changed, table.changed = table.changed, set()
        last = table.last
        if last is not None and last[0] == names:
            names, answer = last
            if not changed:
                return answer
            if table.positions is None:
                table.positions = {name: i for i, name in enumerate(names)}
            at = table.positions.get
            missing = sorted(i for i in map(at, changed) if i is not None)
            answer = list(answer)  # handed out already: patch a copy
        else:
            table.positions = None
            if items:
                answer = list(map(items.get, names))  # type: ignore[arg-type]  # None filled below
                missing = _positions_of_none(answer) if None in answer else []
            else:  # a new declaration or placement: every entry is worked out
                answer = [""] * len(names)
                missing = list(range(len(names)))
        figures_of = room.get
        values = shared_scores([figures_of(names[i]) for i in missing], need, spread)
        for i, value in zip(missing, values, strict=True):
            name = names[i]
            if name in room:  # a node the cache holds; others are answered, not kept
                item = items[name] = self._host(name) + SCORE_ENDS[value]
            else:  # shared_scores gives 0 to a node the cache does not hold
                item = host_priority_item(name, 0)
            answer[i] = item
        table.last = (names, answer)
        return answer

    def _host(self, name: str) -> str:
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = host_priority_start(name)
        return host


def _positions_of_none(items: Sequence[str | None]) -> list[int]:
    """Indices of the None entries, found by C-speed ``list.index`` scans."""
    found: list[int] = []
    at = -1
    try:
        while True:
            at = items.index(None, at + 1)
            found.append(at)
    except ValueError:
        return found


def _refusal(
    reasons: dict[str, str], name: str, claim: PodClaim, accounts: Mapping[str, NodeAccount]
) -> str:
    account = accounts.get(name)
    if account is None:
        return UNKNOWN_NODE
    # Never "": a failing node's entry must read as a refusal.
    reason = reasons[name] = fit(account, claim).reason or "does not fit"
    return reason
