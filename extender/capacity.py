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
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from headroom.capacity import capacity_patch
from headroom.nodes import parse_node

log = logging.getLogger(__name__)

Patcher = Callable[[str, dict[str, Any]], None]
"""``(node, merge patch)``: patch the Node's status; raises on failure."""
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
REQUEST_TIMEOUT_SECONDS = 10.0


def api_patcher(api: client.ApiClient) -> Patcher:
    core = client.CoreV1Api(api)

    def patch(node: str, body: dict[str, Any]) -> None:
        # A dict body goes as a strategic merge patch: for the resource maps of
        # status, a merge of one key, the same as a JSON merge patch.
        core.patch_node_status(
            node, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )

    return patch


class CapacityAdvertiser:
    def __init__(self, patcher: Patcher, margin: int) -> None:
        self.patcher = patcher
        self.margin = margin
        self._busy: set[str] = set()
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
            asyncio.get_running_loop().create_task(self._reconcile(name))

    async def _reconcile(self, name: str) -> None:
        try:
            for attempt, delay in enumerate((*RETRY_SECONDS, None)):
                node = self._latest.get(name)
                if node is None:
                    return
                body = capacity_patch(node, parse_node(node), self.margin)
                if not body:
                    return
                try:
                    await asyncio.to_thread(self.patcher, name, body)
                except (ApiException, HTTPError, OSError) as err:
                    if delay is None:
                        log.warning(
                            "node %s: capacity not advertised (%s); next event retries",
                            name,
                            _why(err),
                        )
                        return
                    log.info(
                        "node %s: capacity patch failed (%s), retry %d in %.0fs",
                        name,
                        _why(err),
                        attempt + 1,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                self.patched += 1
                log.info("node %s: advertises %s", name, json.dumps(body["status"]["capacity"]))
                return
        finally:
            self._busy.discard(name)


GPU_LABEL_PREFIX = "nvidia.com/"


def _slim(node: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What :func:`capacity_patch` reads of a Node: its labels and resources, not its
    images and managedFields (tens of KiB per node, kept for every node)."""
    metadata = node.get("metadata")
    status = node.get("status")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    status = status if isinstance(status, Mapping) else {}
    # GPU Feature Discovery's and the device plugin's labels are all parse_node reads.
    gpu_labels = {k: v for k, v in labels.items() if k.startswith(GPU_LABEL_PREFIX)}
    return {
        "metadata": {"name": name, "labels": gpu_labels},
        "status": {k: status[k] for k in ("capacity", "allocatable") if k in status},
    }


def _why(err: Exception) -> str:
    if isinstance(err, ApiException):
        return f"HTTP {err.status} {' '.join(str(err.reason).split())}"[:200]
    return f"{type(err).__name__}: {err}"[:200]
