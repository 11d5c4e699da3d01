"""Admission for ``pods/eviction``: the node agent evicts only pods on its own node.

The agent's runtime guard evicts pods that hold more GPU memory than they
declared (agent.guard), so its ServiceAccount may create ``pods/eviction``
anywhere in the cluster: RBAC cannot scope a verb to the node a pod runs on. A
ValidatingAdmissionPolicy sees the Eviction object and the requester's token
(whose ``authentication.kubernetes.io/node-name`` claim names the agent's node,
as headroom-agent-own-node uses for reports), but not the evicted pod, so it
cannot compare the two. This validating webhook can: for a request from the
agent's ServiceAccount it reads the pod and allows the eviction only when the
pod's ``spec.nodeName`` is the node in the token.

The ValidatingWebhookConfiguration sends only the agent's requests here (a
matchCondition on the username); everyone else is allowed without a look.
Conservative where it cannot tell: a token without the claim, or a pod it
cannot read, is denied (failurePolicy Fail, the agent retries on its next
tick). A pod that does not exist is allowed: the apiserver then answers 404
itself, and nothing is evicted.
"""

import logging
from collections.abc import Awaitable, Callable

from headroom import names
from kube.rest import Rest, Unreachable
from webhook.review import AdmissionRequest, AdmissionResponse, Verdict

log = logging.getLogger(__name__)

NODE_CLAIM = "authentication.kubernetes.io/node-name"
DEFAULT_AGENT_USER = names.AGENT_USER

PodNode = Callable[[str, str], Awaitable[str | None]]
"""``(namespace, name)`` -> the pod's ``spec.nodeName`` ("" if unscheduled), or None if
the pod does not exist; raises :class:`LookupError` when it cannot be read."""


def eviction_reviewer(
    pod_node: PodNode, agent_user: str = DEFAULT_AGENT_USER
) -> Callable[[AdmissionRequest], Awaitable[Verdict]]:
    async def review(request: AdmissionRequest) -> Verdict:
        uid = request.uid
        if request.user_info.username != agent_user:
            return Verdict(AdmissionResponse.allow(uid), "not-agent")
        if request.resource.resource != "pods" or request.sub_resource != "eviction":
            return Verdict(AdmissionResponse.allow(uid), "not-eviction")
        key = f"{request.namespace}/{request.name}"
        claimed = request.user_info.extra.get(NODE_CLAIM) or []
        if len(claimed) != 1 or not claimed[0]:
            return _deny(
                uid,
                f"{agent_user} may evict pods only with a token bound to its Node "
                f"(claim {NODE_CLAIM}); this token has none, so {key} is not evicted",
            )
        node = claimed[0]
        try:
            where = await pod_node(request.namespace, request.name)
        except LookupError as err:
            log.warning("eviction of %s by the agent on %s: pod not readable: %s", key, node, err)
            return _deny(uid, f"cannot read pod {key} to check its node; retry", code=503)
        if where is None:
            return Verdict(AdmissionResponse.allow(uid), "pod-gone")
        if where != node:
            return _deny(
                uid,
                f"the Headroom agent on node {node} may evict only pods on its own node; "
                f"pod {key} is {'not scheduled' if not where else f'on node {where}'}",
            )
        return Verdict(AdmissionResponse.allow(uid), "own-node")

    return review


def api_pod_node(rest: Rest) -> PodNode:
    """:data:`PodNode` by a GET of the pod: authoritative, never a cache."""

    async def pod_node(namespace: str, name: str) -> str | None:
        try:
            answer = await rest.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except Unreachable as err:
            raise LookupError(str(err)) from err
        if answer.status == 404:
            return None
        if answer.status >= 300:
            raise LookupError(f"HTTP {answer.status}: {answer.message()}")
        try:
            spec = answer.json().get("spec") or {}
        except (ValueError, AttributeError) as err:
            raise LookupError("the pod read back is not a JSON object") from err
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        return node if isinstance(node, str) else ""

    return pod_node


def _deny(uid: str, message: str, *, code: int = 403) -> Verdict:
    return Verdict(AdmissionResponse.deny(uid, code, f"headroom: {message}"), "denied")
