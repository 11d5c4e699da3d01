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
tick). The agent's Eviction must carry a UID precondition (agent.client sends
the UID of the pod it judged): the apiserver reads the pod after admission, so
without one a pod of the same name created meanwhile -- on any node -- would be
the one evicted. With it, a pod that does not exist is allowed (the apiserver
then answers 404 or 409 itself, and nothing is evicted), and one whose UID is
not the precondition's is refused as another pod.
"""

import logging
from collections.abc import Awaitable, Callable

from headroom import names
from kube.rest import Rest, Unreachable
from webhook.review import AdmissionRequest, AdmissionResponse, Verdict

log = logging.getLogger(__name__)

NODE_CLAIM = "authentication.kubernetes.io/node-name"
DEFAULT_AGENT_USER = names.AGENT_USER

PodNode = Callable[[str, str], Awaitable[tuple[str, str] | None]]
"""``(namespace, name)`` -> the pod's (``spec.nodeName``, ``metadata.uid``) (node "" if
unscheduled), or None if the pod does not exist; raises :class:`LookupError` when it
cannot be read."""


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
        expected = _precondition_uid(request.object)
        if not expected:
            return _deny(
                uid,
                f"the Headroom agent's eviction of {key} must name the pod's UID "
                "(deleteOptions.preconditions.uid)",
            )
        try:
            found = await pod_node(request.namespace, request.name)
        except LookupError as err:
            log.warning("eviction of %s by the agent on %s: pod not readable: %s", key, node, err)
            return _deny(uid, f"cannot read pod {key} to check its node; retry", code=503)
        if found is None:
            return Verdict(AdmissionResponse.allow(uid), "pod-gone")
        where, pod_uid = found
        if pod_uid != expected:
            return _deny(
                uid, f"pod {key} is now another pod (uid {pod_uid}, not {expected})", code=409
            )
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

    async def pod_node(namespace: str, name: str) -> tuple[str, str] | None:
        try:
            answer = await rest.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except Unreachable as err:
            raise LookupError(str(err)) from err
        if answer.status == 404:
            return None
        if answer.status >= 300:
            raise LookupError(f"HTTP {answer.status}: {answer.message()}")
        try:
            pod = answer.json()
            spec, metadata = pod.get("spec") or {}, pod.get("metadata") or {}
        except (ValueError, AttributeError) as err:
            raise LookupError("the pod read back is not a JSON object") from err
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        return (node if isinstance(node, str) else "", uid if isinstance(uid, str) else "")

    return pod_node


def _precondition_uid(eviction: object) -> str:
    """``deleteOptions.preconditions.uid`` of the Eviction ("" when absent)."""
    options = eviction.get("deleteOptions") if isinstance(eviction, dict) else None
    conditions = options.get("preconditions") if isinstance(options, dict) else None
    uid = conditions.get("uid") if isinstance(conditions, dict) else None
    return uid if isinstance(uid, str) else ""


def _deny(uid: str, message: str, *, code: int = 403) -> Verdict:
    return Verdict(AdmissionResponse.deny(uid, code, f"headroom: {message}"), "denied")
