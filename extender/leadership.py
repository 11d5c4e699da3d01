"""When another binder's binds may still land: after a restart and a leader change.

The extender holds a pod it binds until the pod watch shows it bound or an
authoritative read says where it is (extender.state). Those holds live in one
process. Two binders can have binds in flight that this process holds nothing for:

* **the extender before a restart**: its binding POSTs may still be stored
  after the new process has listed the pods;
* **the previous leader**: ``headroom-scheduler`` runs two replicas with leader
  election, each with its own extender sidecar. When the lease moves, the old
  leader's extender may still have POSTs in flight -- kube-scheduler exits on
  losing the lease, its sidecar does not -- and the new leader's extender has
  never heard of those pods.

A filter that answers before such a binding shows up on the pod watch counts
its node short, and can fit another pod into the same memory. So the extender
refuses filter and bind, with an error kube-scheduler retries after its
backoff, until binds sent before then can no longer be stored
(``verify_after``, the bound the holds already rest on), the watch has had
time to show them (:data:`WATCH_ALLOWANCE_SECONDS`), and -- since no time
can be known by which a lagging watch has -- its pod cache comes from a list
begun after that (:meth:`Leadership.list_from`; extender.service re-lists
then): after it starts, and --
with ``--leader-lease`` -- after its own kube-scheduler is seen taking the
lease from another pod's (or ``leaseTransitions`` says a leader came and went
unseen), and while no renewal by its own kube-scheduler has been seen for two
thirds of the lease duration, or the latest seen was made (its ``renewTime``)
longer ago than that. A filter that comes while the lease, as last seen, is held
by another (the lease watch lags: only a leader schedules) waits too. Its own
kube-scheduler restarting and taking the lease back costs nothing: every
container of it bound through this extender, which holds their binds.

kube-scheduler's leader-election identity is ``<hostname>_<uuid>``
(cmd/kube-scheduler/app/server.go); a sidecar shares its pod's hostname, so
the extender knows its own scheduler's leadership by that prefix. It shares its
node too, and with it the clock its kube-scheduler writes ``renewTime`` by: a
renewal this extender sees late (a lagging lease watch, this process stalled with
the event unread) is aged from when it was made. Another replica takes the lease
15 s after it last saw the Lease change, however late this one saw that change;
a frozen kube-scheduler, thawed, may still send a bind before it notices.
"""

import logging
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

WATCH_ALLOWANCE_SECONDS = 5.0
"""After the last moment a foreign binding POST can be stored, how long the pod watch
gets to show it. Measured watch lag is well under a second (extender_watch_lag_seconds),
but no lag can be ruled out: what makes the answers safe is the pod list begun after
that moment (:meth:`Leadership.list_from`). This keeps the wait at 15 s at least."""


LEASE_DURATION_SECONDS = 15
"""kube-scheduler's leaderElection.leaseDuration default; the Lease says its own."""


class Leadership:
    """Whether this extender's answers can count every bind that may land: :meth:`waiting`."""

    def __init__(
        self,
        verify_after: float,
        *,
        lease: str | None = None,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``lease``: ``namespace/name`` of the scheduler's leader-election Lease, or None
        when the scheduler does not elect a leader (only the restart is waited for).
        ``identity``: this pod's hostname, which its kube-scheduler's identity starts with.
        ``wall``: this node's clock, in seconds since the epoch, which its kube-scheduler
        (in this pod, so on this node) writes ``renewTime`` by."""
        self.verify_after = verify_after
        self.settle = verify_after + WATCH_ALLOWANCE_SECONDS
        self.lease = lease
        self.view: Callable[[], float | None] | None = None
        """When (``clock``) the pod cache's latest complete list began
        (kube.informer.Informer.listed_from); None: not checked (plain-data tests)."""
        self.identity = identity if identity is not None else socket.gethostname()
        self.clock = clock
        self.wall = wall
        self.started = clock()
        self.holder: str | None = None
        """The holder as last seen (None: nobody, or not read yet)."""
        self.last_holder: str | None = None
        """The last holder seen that was somebody."""
        self.transitions: int | None = None
        """``spec.leaseTransitions`` as last seen: client-go adds one whenever a
        candidate that is not the leader acquires the lease, and keeps it on release."""
        self.duration = float(LEASE_DURATION_SECONDS)
        self.since: float | None = None
        """When this pod's kube-scheduler was seen taking the lease from another (or when
        a leader may have come and gone unseen); None while another holds it."""
        self.renewed: float | None = None
        """When the lease was last seen held by this pod's kube-scheduler."""
        self.made: float | None = None
        """``renewTime`` (on ``wall``) of that renewal; None: none it could read."""
        self._seen: tuple[str | None, object] = (None, None)
        """(holder, renewTime) as last seen: a renewal changes it, a re-list does not."""
        self._recreated = False
        """Whether the last event was the lease's deletion: client-go creates it at count 0."""
        self._warned = -float("inf")

    def mine(self, holder: str | None) -> bool:
        """Whether ``holder`` is this pod's kube-scheduler, in this or an earlier
        container: all of them bound through this extender, which holds their binds."""
        return holder is not None and (
            holder == self.identity or holder.startswith(self.identity + "_")
        )

    def on_lease(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A Lease watch event (only the scheduler's lease is watched)."""
        spec = obj.get("spec") if kind != "DELETED" else None
        spec = spec if isinstance(spec, Mapping) else {}
        holder = spec.get("holderIdentity")
        holder = holder if isinstance(holder, str) and holder else None
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) else None
        duration = spec.get("leaseDurationSeconds")
        if isinstance(duration, int) and duration > 0:
            self.duration = float(duration)
        if holder != self.holder:
            log.info("scheduler lease %s: held by %s", self.lease, holder or "nobody")
        self.holder = holder
        # A re-list replays the lease as it stands: only a new renewTime (told new by
        # equality, not by a clock) shows the holder alive since; its age is _stale's.
        renewal = (holder, spec.get("renewTime")) != self._seen
        self._seen = (holder, spec.get("renewTime"))
        if self._acquired_unseen(holder, transitions):
            self.last_holder = None  # another held it between two looks: the next own hold waits
        self._recreated = kind == "DELETED"
        now = self.clock()
        if holder is not None and not self.mine(holder):
            self.since = None
        elif holder is not None:
            if renewal:
                self.renewed = now
                self.made = _instant(spec.get("renewTime"))
            if not self.mine(self.last_holder) or self._missed(holder, transitions):
                self.since = now
        if holder is not None:
            self.last_holder = holder
        if transitions is not None or kind == "DELETED":
            self.transitions = transitions

    def _acquired_unseen(self, holder: str | None, transitions: int | None) -> bool:
        """Whether someone not seen holding the lease acquired it since the last event:
        the count rose on an event that does not show this pod's scheduler (it was
        released since, or another holds it), or a lease re-created after a deletion
        (client-go creates it at count 0) already counts an acquisition."""
        if transitions is None:
            return False
        if self._recreated:
            return transitions > 0
        return (
            self.transitions is not None
            and transitions > self.transitions
            and not self.mine(holder)
        )

    def _missed(self, holder: str, transitions: int | None) -> bool:
        """Whether another leader may have held the lease between the last holder seen
        (this pod's) and ``holder`` (this pod's too): more acquisitions than this
        one's, or a count that cannot be compared (a lease re-created, or none)."""
        if transitions is None or self.transitions is None or transitions < self.transitions:
            return holder != self.last_holder
        return transitions - self.transitions > (0 if holder == self.last_holder else 1)

    def list_from(self) -> float:
        """The pod cache must come from a list begun at or after this (``clock``): a bind
        sent before this extender started, or before its kube-scheduler was seen taking
        the lease, may be stored until ``verify_after`` later. A list begun after that
        shows it; the watch may show it late (a storm, a slow apiserver, the pages of a
        long first list), and no time after which it surely has can be known."""
        since = self.since if self.lease is not None and self.since is not None else 0.0
        return max(self.started, since) + self.verify_after

    def _listed_from(self, point: float) -> bool:
        """Whether the pod cache's latest complete list began at ``point`` or later."""
        if self.view is None:
            return True
        listed = self.view()
        return listed is not None and listed >= point

    def starting(self) -> str | None:
        """Why this extender, just started, must wait (also /readyz's answer); None: it
        need not. Constant text: kube-scheduler writes a pod's condition when it changes."""
        if self.clock() < self.started + self.settle or not self._listed_from(
            self.started + self.verify_after
        ):
            return (
                f"headroom extender just started: binds sent before it started may still "
                f"land; it answers once it has listed the pods {self.verify_after:.0f}s "
                f"after its start, and {self.settle:.0f}s after at the earliest; retry"
            )
        return None

    def waiting(self) -> str | None:
        """Why filter and bind must wait now, for kube-scheduler's error; None: they need not."""
        if (why := self.starting()) is not None or self.lease is None:
            return why
        now = self.clock()
        if self.since is None:
            why = (
                f"headroom extender: scheduler lease {self.lease} was last seen held by "
                f"{self.last_holder or 'nobody'}, not by this pod's kube-scheduler "
                f"({self.identity}_...); waiting for the lease watch; retry"
            )
        elif self._stale(now):
            why = (
                f"headroom extender: the lease watch has shown no renewal of {self.lease} by "
                f"this pod's kube-scheduler made in the last {self.duration * 2 / 3:.0f}s; retry"
            )
        elif now < self.since + self.settle or not self._listed_from(
            self.since + self.verify_after
        ):
            return (
                f"headroom extender: this kube-scheduler took the lease {self.lease} from "
                f"another; the previous leader's binds may still land; it answers once it "
                f"has listed the pods {self.verify_after:.0f}s after, and {self.settle:.0f}s "
                "after at the earliest; retry"
            )
        else:
            return None
        if now - self._warned > 60:
            self._warned = now
            if self.since is None and self.last_holder is not None:
                # A standby: another replica's scheduler leads. Not a misconfiguration.
                log.info("%s (standby)", why)
            else:
                log.warning("%s (is --leader-lease the lease this kube-scheduler elects by?)", why)
        return why

    def _stale(self, now: float) -> bool:
        """Whether the latest renewal by this pod's kube-scheduler is too old to rule out
        a new leader: seen, or made, over two thirds of the lease duration ago.

        kube-scheduler renews every 2 s and gives up after 10 s (of 15): a view this old
        may hide a new leader (a stuck watch, a frozen pod). When it was seen is not
        enough: a renewal seen late (a lagging watch, this process stalled with the event
        unread) would read as fresh while another replica, which counts from when it saw
        the Lease change, already leads. A ``renewTime`` it cannot read (client-go always
        writes one) leaves when it was seen alone."""
        limit = self.duration * 2 / 3
        if self.renewed is None or now - self.renewed > limit:
            return True
        return self.made is not None and self.wall() - self.made > limit

    def path(self) -> str | None:
        """The Lease's collection URL path with its name, for a watch of that one object."""
        if self.lease is None:
            return None
        namespace, _, _ = self.lease.partition("/")
        return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    @property
    def name(self) -> str:
        return "" if self.lease is None else self.lease.partition("/")[2]


def _instant(value: object) -> float | None:
    """A Lease's MicroTime (``2026-11-26T12:00:00.000000Z``) in seconds since the epoch;
    None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
