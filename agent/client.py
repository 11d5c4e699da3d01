"""The agent's writes to the API server: its report, Events, and evictions.

All blocking (the official client is synchronous); the service calls them on
worker threads. RBAC they need: ``gpunodereports`` get/create/update,
``events`` create, ``pods/eviction`` create.
"""

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.guard import EVICTION_GRACE_SECONDS
from headroom import names

log = logging.getLogger(__name__)

COMPONENT = "headroom-agent"


class ReportWriter:
    """Create-or-replace of this node's GPUNodeReport.

    Custom resources refuse an update without ``metadata.resourceVersion``, so
    the writer remembers the version of its last write; a conflict (someone
    else changed the object) re-reads it once, a missing object is created.
    """

    def __init__(self, api: client.ApiClient, *, timeout_seconds: float = 10.0) -> None:
        self._api = client.CustomObjectsApi(api)
        self._timeout = timeout_seconds
        self._version: str | None = None

    def __call__(self, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if self._version is None:
            self._version = self._current_version(name)
        for attempt in range(2):
            try:
                if self._version is None:
                    result: Any = self._api.create_cluster_custom_object(
                        names.GROUP,
                        names.VERSION,
                        names.REPORT_PLURAL,
                        obj,
                        _request_timeout=self._timeout,
                    )
                else:
                    body = {**obj, "metadata": {"name": name, "resourceVersion": self._version}}
                    result = self._api.replace_cluster_custom_object(
                        names.GROUP,
                        names.VERSION,
                        names.REPORT_PLURAL,
                        name,
                        body,
                        _request_timeout=self._timeout,
                    )
            except ApiException as err:
                if err.status in (404, 409) and attempt == 0:
                    # 404: deleted under us; 409: changed under us (or created meanwhile).
                    self._version = self._current_version(name)
                    continue
                self._version = None
                raise
            self._version = str((result.get("metadata") or {}).get("resourceVersion") or "") or None
            return

    def read(self, name: str) -> dict[str, Any] | None:
        """The report object stored for ``name`` now (None: none), its version kept
        for the next write. A restarted agent carries the figures it holds for GPUs
        NVML cannot read (agent.attribution)."""
        current = self._get(name)
        if current is not None:
            self._version = (
                str((current.get("metadata") or {}).get("resourceVersion") or "") or None
            )
        return current

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            current: Any = self._api.get_cluster_custom_object(
                names.GROUP,
                names.VERSION,
                names.REPORT_PLURAL,
                name,
                _request_timeout=self._timeout,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return current if isinstance(current, dict) else None

    def _current_version(self, name: str) -> str | None:
        current = self._get(name)
        if current is None:
            return None
        return str((current.get("metadata") or {}).get("resourceVersion") or "") or None


BUDGET_CAUSE = "DisruptionBudget"
"""The cause (``details.causes[].reason``, Go ``policyv1.DisruptionBudgetCause``) on
every 429 by which kube-apiserver's eviction REST refuses for a PodDisruptionBudget.
A 429 without it refused nothing: API Priority and Fairness or a busy admission
webhook (Headroom's own sheds load with 429s) throttled the request, which is
retried; deleting then would pass budgets that had room for the eviction."""

MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"
"""kube-apiserver's refusal to evict a pod two or more PodDisruptionBudgets select
(``pkg/registry/core/pod/storage/eviction.go``): HTTP 500, not 429. A tenant with
``edit`` may write two budgets over their own pod; read as an error, the eviction
was retried for ever and the pod never deleted."""


class PodActions:
    """Events on pods and evictions, for the guard."""

    def __init__(self, api: client.ApiClient, node_name: str, *, timeout_seconds: float = 10.0):
        self._core = client.CoreV1Api(api)
        self._node = node_name
        self._timeout = timeout_seconds

    def record_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        event = client.CoreV1Event.from_dict(
            {
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": namespace,
                    "name": name,
                    "uid": uid,
                },
                "reason": reason,
                "message": message[:1024],
                "type": "Warning",
                "source": {"component": COMPONENT, "host": self._node},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._node,
                "firstTimestamp": now.isoformat(),
                "lastTimestamp": now.isoformat(),
                "count": 1,
            }
        )
        if event is None:  # pragma: no cover - from_dict returns None only for None
            raise ValueError("event body")
        self._core.create_namespaced_event(namespace, event, _request_timeout=self._timeout)

    def evict(
        self, namespace: str, name: str, uid: str, grace: int = EVICTION_GRACE_SECONDS
    ) -> bool:
        """True when evicted (or already gone); False when a PodDisruptionBudget refused
        (one out of budget: 429; several over the pod: :data:`MULTIPLE_BUDGETS`).

        ``grace``: the seconds the pod gets to stop, not the ones its author chose.
        """
        eviction = client.V1Eviction.from_dict(
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                # The UID precondition keeps a same-named successor pod safe.
                "deleteOptions": {"preconditions": {"uid": uid}, "gracePeriodSeconds": grace},
            }
        )
        if eviction is None:  # pragma: no cover - from_dict returns None only for None
            raise ValueError("eviction body")
        try:
            self._core.create_namespaced_pod_eviction(
                name, namespace, eviction, _request_timeout=self._timeout
            )
        except ApiException as err:
            if _budget_refused(err):
                return False
            if err.status in (404, 409):
                return True  # gone, or a different pod now has the name
            raise
        return True

    def delete(
        self, namespace: str, name: str, uid: str, grace: int = EVICTION_GRACE_SECONDS
    ) -> None:
        """Delete the pod (this UID only: a same-named successor is left alone), giving it
        ``grace`` seconds; a pod already gone is fine. For the guard, after a
        PodDisruptionBudget refused its eviction. An admission policy holds the agent to
        the pods of its own node (manifests/base/admission/agent-own-node.yaml)."""
        options = client.V1DeleteOptions(
            grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            self._core.delete_namespaced_pod(
                name, namespace, body=options, _request_timeout=self._timeout
            )
        except ApiException as err:
            if err.status not in (404, 409):  # gone, or a different pod now has the name
                raise


def _budget_refused(err: ApiException) -> bool:
    """A PodDisruptionBudget refused the eviction: a 429 with :data:`BUDGET_CAUSE`,
    or :data:`MULTIPLE_BUDGETS`."""
    text = str(err.body or "")
    if MULTIPLE_BUDGETS in text:
        return True
    if err.status != 429:
        return False
    try:
        body = json.loads(text)
        causes = body.get("details", {}).get("causes") or []
        return any(cause.get("reason") == BUDGET_CAUSE for cause in causes)
    except (ValueError, AttributeError, TypeError):
        return False
