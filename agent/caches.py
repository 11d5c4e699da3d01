"""What the agent keeps of the cluster besides its pods: policies and its Node.

The guard needs each pod's policy (``guard: off|warn|evict``), watched so that
a changed policy applies on the next tick without a restart; an invalid policy
is dropped with a warning (its pods are then guarded as ``warn``), never half
applied. The simulated backend needs the node's GPU labels, re-read now and
then with a plain ``get`` (RBAC ``nodes get``).
"""

import asyncio
import contextlib
import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from headroom.policy import GPUSharingPolicy, PolicyError, parse_policy

log = logging.getLogger(__name__)

NODE_REFRESH_SECONDS = 60.0


class PolicyCache:
    """Valid GPUSharingPolicy objects by name, fed by an informer's events."""

    def __init__(self) -> None:
        self.policies: dict[str, GPUSharingPolicy] = {}

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self.policies.pop(name, None)
            return
        try:
            self.policies[name] = parse_policy(obj)
        except PolicyError as err:
            log.warning("ignoring invalid policy (guard treats its pods as warn): %s", err)
            self.policies.pop(name, None)


class NodeCache:
    """The agent's own Node, re-read now and then (``nodes get``): the simulated
    backend builds its GPUs from the labels."""

    def __init__(self, core: client.CoreV1Api, node_name: str) -> None:
        self._core = core
        self._name = node_name
        self.node: dict[str, Any] | None = None
        self.tried = asyncio.Event()
        """Set after the first read, successful or not."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                # Raw JSON, as the informers keep it, not the client's model.
                response: Any = await asyncio.to_thread(
                    self._core.read_node, self._name, _preload_content=False, _request_timeout=10
                )
                self.node = json.loads(response.data)
            except (ApiException, OSError, ValueError) as err:
                log.warning("cannot read node %s: %s", self._name, err)
            self.tried.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=NODE_REFRESH_SECONDS)
