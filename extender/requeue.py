"""Tell kube-scheduler when GPU memory frees up, so waiting pods move within seconds.

kube-scheduler 1.34 parks a pod it could not schedule in its unschedulable
pool until a cluster event that one of the plugins which rejected it cares
about. A pod the extender rejected carries the pseudo-plugin ``Extender``,
whose default enqueue extension accepts *every* event
(pkg/scheduler/schedule_one.go, framework/runtime/framework.go; kubernetes
issue 122019) -- but nothing happens in a quiet cluster when room appears in
the extender's own view: its watch may deliver a deletion after kube-scheduler
already retried the pod, a charge held for an unconfirmed bind is released by
a read, a report shows usage fall. Without an event the pod waits for the
5-minute flush.

So when room may have appeared on a node, this stamps the node's annotation
``headroom.dev/room-at`` (coalesced: at most one patch per
``PATCH_EVERY_SECONDS`` in all, on one of the nodes where room appeared since
the last; one that fails for want of an answer, a 429 or a 5xx is tried again
as late, on another of them first if there is one, so that a node whose every
PATCH fails holds back no stamp; one a node gone refuses is made on another of
them). A Node annotation change is an ``UpdateNodeAnnotation`` cluster event
(framework/events.go), which moves those pods back to the active queue. The
ValidatingAdmissionPolicy ``headroom-scheduler-node-annotation`` lets the
scheduler's ServiceAccount change that annotation and nothing else.

Until the extender's caches have first synced it stamps nothing: every report
in the first list is new, so every reporting node would seem to have room (one
patch per node, thousands on a large cluster, before the extender can answer a
filter). Once synced it stamps one GPU node. That is enough: the pseudo-plugin
takes any event, so one Node update moves every pod the extender refused,
wherever it waits. And it is needed: room may have appeared anywhere while no
extender was watching, for pods the one before a restart refused, and without
an event they would wait for the flush.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kube.rest import STRATEGIC_MERGE_PATCH, ApiError, Rest, Unreachable

log = logging.getLogger(__name__)

ANNOTATION_ROOM_AT = "headroom.dev/room-at"
PATCH_EVERY_SECONDS = 1.0
REQUEST_TIMEOUT_SECONDS = 5.0

Stamper = Callable[[str, str], Awaitable[None]]
"""``(node, timestamp)``: set the node's room-at annotation; raises ApiError or Unreachable."""


def api_stamper(rest: Rest) -> Stamper:
    async def stamp(node: str, when: str) -> None:
        body = {"metadata": {"annotations": {ANNOTATION_ROOM_AT: when}}}
        answer = await rest.request(
            "PATCH",
            f"/api/v1/nodes/{quote(node, safe='')}",
            body,
            time_limit=REQUEST_TIMEOUT_SECONDS,
            content_type=STRATEGIC_MERGE_PATCH,
        )
        answer.check()

    return stamp


class RoomNotifier:
    def __init__(
        self, stamper: Stamper, every: float = PATCH_EVERY_SECONDS, *, started: bool = True
    ) -> None:
        """``started=False``: stamp nothing until :meth:`start` (the caches have synced)."""
        self.stamper = stamper
        self.every = every
        self.started = started
        self._rooms: set[str] = set()
        """Nodes where room appeared since the last stamp began: one of them is stamped."""
        self._due = False
        """Whether a stamp is scheduled and not yet begun."""
        self._last = -float("inf")
        self._failed: dict[str, float] = {}
        """When a stamp on a node last failed for want of an answer, a 429 or a 5xx:
        it is tried again, but after the other nodes with room."""
        self.stamped = 0
        self._tasks: set[asyncio.Task[None]] = set()
        """The stamps in flight: the loop keeps only a weak reference to a task."""

    def start(self, gpu_nodes: Iterable[str]) -> None:
        """The caches have synced: stamp one of ``gpu_nodes`` (the first by name), and
        from now on a node where room appears."""
        self.started = True
        first = min(gpu_nodes, default=None)
        if first is not None:
            self.room(first)

    def room(self, node: str) -> None:
        """Room may have appeared on ``node`` (on the event loop): stamp soon, once.

        One stamp per ``every`` seconds in all, on a node where room appeared, not
        one per node: one Node event moves every pod the extender refused, so a storm
        of room on 100 nodes a second is one PATCH a second, not 100 (each stored,
        sent to every watcher of nodes, and holding a connection the binds need)."""
        if not self.started:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (plain-data tests of the state): nobody to tell
        self._rooms.add(node)
        self._schedule()

    def _schedule(self) -> None:
        if self._due or not self._rooms:
            return
        loop = asyncio.get_running_loop()
        self._due = True
        delay = max(0.0, self._last + self.every - time.monotonic())
        loop.call_later(delay, self._begin)

    def _begin(self) -> None:
        task = asyncio.get_running_loop().create_task(self._stamp())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stamp(self) -> None:
        self._due = False
        rooms, self._rooms = self._rooms, set()
        if not rooms:
            return
        node = min(rooms, key=lambda name: (self._failed.get(name, -float("inf")), name))
        self._last = time.monotonic()
        when = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        try:
            await self.stamper(node, when)
        except (ApiError, Unreachable) as err:
            reason: Any = err.status if isinstance(err, ApiError) else type(err).__name__
            log.info("node %s: could not stamp %s (%s)", node, ANNOTATION_ROOM_AT, reason)
            if not (isinstance(err, Unreachable) or err.status == 429 or err.status >= 500):
                rooms.discard(node)  # refused for good (404: node gone): try another
                self._failed.pop(node, None)
            else:
                self._failed[node] = self._last  # kept, but another with room goes first
            # The room is still untold (a stamp that may have landed only moves the
            # pods once more): without a stamp they wait for the flush.
            self._rooms |= rooms
            self._schedule()
            return
        self._failed.pop(node, None)
        self.stamped += 1
