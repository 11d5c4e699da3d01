"""Advertise ``headroom.dev/gpu-memory`` on every shared GPU node, and keep it there.

Fed by the extender's node watch: each event compares what the Node
advertises with :func:`headroom.capacity.capacity_patch` and, when they
differ, patches ``nodes/<name>/status``. So a kubelet that restarts and zeroes
extended resources it does not know (it does, when its device-plugin
checkpoint is gone), a node that is recreated, or someone's hand edit is put
right on the next event about that node, and kubelet's own status updates
bring such events every few seconds. A failed patch is retried with capped
backoff. Several extender replicas may patch the same value; a merge patch of
one key is idempotent.

A merge patch rather than server-side apply: kubelet owns
``status.capacity`` through plain updates, and an applied field manager would
only fight it for ownership of a key kubelet never sets.
"""

import asyncio
import json
import logging
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

from headroom.capacity import capacity_patch
from headroom.nodes import parse_node
from kube.rest import STRATEGIC_MERGE_PATCH, ApiError, Rest, Unreachable

log = logging.getLogger(__name__)

Patcher = Callable[[str, dict[str, Any]], Awaitable[None]]
"""``(node, merge patch)``: patch the Node's status; raises ApiError or Unreachable."""
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
REQUEST_TIMEOUT_SECONDS = 10.0
PATCH_WORKERS = 4
"""Patches in flight at once."""


def api_patcher(rest: Rest) -> Patcher:
    async def patch(node: str, body: dict[str, Any]) -> None:
        # A strategic merge patch: for the resource maps of status, a merge of
        # one key, the same as a JSON merge patch.
        answer = await rest.request(
            "PATCH",
            f"/api/v1/nodes/{quote(node, safe='')}/status",
            body,
            time_limit=REQUEST_TIMEOUT_SECONDS,
            content_type=STRATEGIC_MERGE_PATCH,
        )
        answer.check()

    return patch


class CapacityAdvertiser:
    """Patches from a queue, :data:`PATCH_WORKERS` at a time: a first list of
    5,000 nodes that all need a patch queues 5,000 names, not 5,000 tasks
    (~4 KiB apiece: issue 8, bench/memory_bench.py). A
    failed patch goes back on the queue after its backoff, so one node's
    retries hold no worker while they wait."""

    def __init__(self, patcher: Patcher, margin: int) -> None:
        self.patcher = patcher
        self.margin = margin
        self._busy: set[str] = set()
        """Nodes queued, being patched, or waiting to retry."""
        self._queue: deque[tuple[str, int]] = deque()
        """(node, attempts made) waiting for a worker."""
        self._workers = 0
        self._latest: dict[str, Mapping[str, Any]] = {}
        self.patched = 0

    def on_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Informer handler (on the event loop): patch the node later if it needs it."""
        metadata = obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str) or not name:
            return
        if kind == "DELETED":
            self._latest.pop(name, None)
            return
        self._latest[name] = _slim(obj, name)
        if name not in self._busy and capacity_patch(obj, parse_node(obj), self.margin):
            self._busy.add(name)
            self._enqueue(name, 0)

    def _enqueue(self, name: str, attempt: int) -> None:
        self._queue.append((name, attempt))
        if self._workers < PATCH_WORKERS:
            self._workers += 1
            asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        try:
            while self._queue:
                name, attempt = self._queue.popleft()
                try:
                    await self._reconcile(name, attempt)
                except Exception:  # one node's bug must not stop the others' patches
                    log.exception("node %s: capacity patch failed", name)
        finally:
            self._workers -= 1

    async def _reconcile(self, name: str, attempt: int) -> None:
        retrying = False
        try:
            node = self._latest.get(name)
            body = capacity_patch(node, parse_node(node), self.margin) if node else None
            if not body:
                return
            try:
                await self.patcher(name, body)
            except (ApiError, Unreachable) as err:
                if attempt >= len(RETRY_SECONDS):
                    log.warning(
                        "node %s: capacity not advertised (%s); next event retries",
                        name,
                        _why(err),
                    )
                    return
                delay = RETRY_SECONDS[attempt]
                log.info(
                    "node %s: capacity patch failed (%s), retry %d in %.0fs",
                    name,
                    _why(err),
                    attempt + 1,
                    delay,
                )
                asyncio.get_running_loop().call_later(delay, self._enqueue, name, attempt + 1)
                retrying = True
                return
            self.patched += 1
            log.info("node %s: advertises %s", name, json.dumps(body["status"]["capacity"]))
        finally:
            if not retrying:
                self._busy.discard(name)


GPU_LABEL_PREFIX = "nvidia.com/"
KEPT_RESOURCE_PREFIXES = (GPU_LABEL_PREFIX, "headroom.dev/")


def _slim(node: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What :func:`capacity_patch` reads of a Node: its GPU labels and resources, not
    its images and managedFields (tens of KiB per node, kept for every node), nor
    its CPU and memory. Label and resource names and values repeat across nodes:
    one interned copy of each (issue 8: ~2.5 KiB per node before)."""
    metadata = node.get("metadata")
    status = node.get("status")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    status = status if isinstance(status, Mapping) else {}
    # GPU Feature Discovery's and the device plugin's labels are all parse_node reads.
    slim: dict[str, Any] = {
        "metadata": {"name": name, "labels": _gpu_only(labels, (GPU_LABEL_PREFIX,))}
    }
    slim["status"] = {
        key: _gpu_only(status[key], KEPT_RESOURCE_PREFIXES)
        for key in ("capacity", "allocatable")
        if isinstance(status.get(key), Mapping)
    }
    return slim


def _gpu_only(values: Mapping[Any, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    return {
        sys.intern(k): sys.intern(v) if isinstance(v, str) else v
        for k, v in values.items()
        if isinstance(k, str) and k.startswith(prefixes)
    }


def _why(err: Exception) -> str:
    if isinstance(err, ApiError):
        return f"HTTP {err.status} {' '.join(err.reason.split())}"[:200]
    return f"{type(err).__name__}: {err}"[:200]
