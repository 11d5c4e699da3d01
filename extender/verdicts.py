"""Per-node answers for shared-GPU pods, kept until the node's account changes.

kube-scheduler asks about the same candidates pod after pod, and the pods of
one Deployment or Job declare the same memory. So a node's filter reason and
its prioritize entry (JSON text) are worked out once per node and declaration
and reused until an event touches the node: :class:`extender.state.ClusterState`
calls :meth:`Verdicts.drop` wherever it invalidates an account. A request is
then one dictionary lookup per candidate, plus formatting for the nodes whose
account changed since the last pod with that declaration.

Only the tables of the last few declarations are kept, and only nodes the
cache holds are remembered, so a request naming unknown nodes cannot grow them.
"""

from collections import OrderedDict
from collections.abc import Hashable, Mapping

from extender.wire import SCORE_ENDS, host_priority_item, host_priority_start
from headroom.accounting import NO_GPU_HEADROOM, NodeAccount
from headroom.claims import PodClaim
from headroom.placement import fit, shared_scores

UNKNOWN_NODE = "node is not in the extender's cache (unknown node, or the cache is behind)"
UNKNOWN_HEADROOM = NO_GPU_HEADROOM - 1
"""Below any node's headroom: a node missing from the index fails every pod."""
KEEP = 8
"""Declarations (and placements) whose tables are kept."""


class _Tables:
    """A few ``node -> text`` tables, one per key, least recently used dropped first."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._tables: OrderedDict[Hashable, dict[str, str]] = OrderedDict()

    def table(self, key: Hashable) -> dict[str, str]:
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
            if len(self._tables) > self._keep:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
        return table

    def drop(self, node: str) -> None:
        for table in self._tables.values():
            table.pop(node, None)

    def clear(self) -> None:
        self._tables.clear()


class Verdicts:
    """Filter and prioritize for a pod that asks only for shared GPUs (the common case)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._reasons = _Tables(keep)
        self._scores = _Tables(keep)
        self._hosts: dict[str, str] = {}
        """Node -> the start of its HostPriority, ``{"Host":"n1","Score":``."""

    def drop(self, node: str) -> None:
        """Forget what was worked out for ``node``: its account changed."""
        self._reasons.drop(node)
        self._scores.drop(node)
        self._hosts.pop(node, None)

    def clear(self) -> None:
        self._reasons.clear()
        self._scores.clear()
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
        need = claim.need
        reasons = self._reasons.table(claim.declared)
        # One plain loop: measured faster than a comprehension per outcome, as
        # each candidate's lookups then happen once, while its entries are hot.
        passed: list[str] = []
        failed: dict[str, str] = {}
        keep, room, known = passed.append, headroom.get, reasons.get
        for name in names:
            if room(name, UNKNOWN_HEADROOM) >= need:
                keep(name)
            else:
                failed[name] = known(name) or _refusal(reasons, name, claim, accounts)
        return passed, failed

    def scores(
        self, names: list[str], claim: PodClaim, room: Mapping[str, tuple[int, int]]
    ) -> list[str]:
        """One HostPriority (JSON text) per name; ``room`` as ClusterState.shared_room."""
        need, spread = claim.need, claim.placement == "spread"
        items = self._scores.table((need, spread))
        missing = [name for name in names if name not in items]
        if missing:
            hosts, figures_of = self._hosts, room.get
            values = shared_scores([figures_of(name) for name in missing], need, spread)
            for name, value in zip(missing, values, strict=True):
                if name in room:  # a node the cache holds; others are answered, not kept
                    items[name] = (hosts.get(name) or self._host(name)) + SCORE_ENDS[value]
        known = items.get
        # shared_scores gives 0 to a node the cache does not hold.
        return [known(name) or host_priority_item(name, 0) for name in names]

    def _host(self, name: str) -> str:
        host = self._hosts[name] = host_priority_start(name)
        return host


def _refusal(
    reasons: dict[str, str], name: str, claim: PodClaim, accounts: Mapping[str, NodeAccount]
) -> str:
    account = accounts.get(name)
    if account is None:
        return UNKNOWN_NODE
    reason = reasons[name] = fit(account, claim).reason
    return reason
