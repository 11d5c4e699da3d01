"""``POST /validate-eviction``: the node agent evicts only pods on the node its token names.

Reviews are shaped as kube-apiserver 1.34 sends them for ``pods/eviction``
(an ``Eviction`` object, ``subResource: eviction``, the requester's token
claims in ``userInfo.extra``); e2e runs the same webhook behind a real
ValidatingWebhookConfiguration (tests/e2e/test_agent_eviction.py).
"""

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from headroom import names
from kube.rest import Rest
from tests.pod_reads import POD_PATH, read_pod
from tests.webhook.conftest import Client
from webhook.eviction import NODE_CLAIM, api_pod_node, eviction_reviewer
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionResponse, Verdict
from webhook.server import create_app

PODS = {("ml", "on-a"): "gpu-a", ("ml", "on-b"): "gpu-b", ("ml", "pending"): ""}


def eviction_review(
    pod: str, *, user: str = names.AGENT_USER, node: str | None = "gpu-a", uid: str | None = None
) -> dict[str, Any]:
    """The agent's Eviction of ``pod``, with the UID precondition it sends (``uid``: ""
    for none; by default the pod's own)."""
    extra = {NODE_CLAIM: [node]} if node is not None else {}
    uid = f"uid-{pod}" if uid is None else uid
    options = {"deleteOptions": {"preconditions": {"uid": uid}}} if uid else {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "name": pod,
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {
                "username": user,
                "uid": "3b1f6a0e-0000-4000-8000-000000000001",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/credential-id": ["JTI=abc"], **extra},
            },
            "object": {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": "ml"},
                **options,
            },
            "dryRun": False,
        },
    }


class Pods:
    """The apiserver's answer to a GET of a pod, as the reviewer sees it."""

    def __init__(self) -> None:
        self.fail = False
        self.reads = 0

    async def __call__(self, namespace: str, name: str) -> tuple[str, str] | None:
        self.reads += 1
        if self.fail:
            raise LookupError("apiserver unreachable")
        node = PODS.get((namespace, name))
        return None if node is None else (node, f"uid-{name}")


@pytest.fixture
def pods() -> Pods:
    return Pods()


@pytest.fixture
async def webhook(pods: Pods) -> AsyncIterator[Client]:
    async def mutate(request: Any) -> Verdict:
        return Verdict(AdmissionResponse.allow(request.uid), "skipped")

    app = create_app(mutate, metrics=WebhookMetrics(), evictions=eviction_reviewer(pods))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def answer(webhook: Client, review: dict[str, Any]) -> dict[str, Any]:
    response = await webhook.post("/validate-eviction", data=json.dumps(review))
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    assert body["response"]["uid"] == review["request"]["uid"]
    return dict(body["response"])


async def test_the_agent_may_evict_a_pod_on_its_own_node(webhook: Client) -> None:
    assert (await answer(webhook, eviction_review("on-a")))["allowed"] is True


async def test_a_pod_on_another_node_is_refused_naming_both_nodes(webhook: Client) -> None:
    response = await answer(webhook, eviction_review("on-b"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert "agent on node gpu-a may evict only pods on its own node" in message, message
    assert "pod ml/on-b is on node gpu-b" in message, message


async def test_an_unscheduled_pod_is_not_the_agents_to_evict(webhook: Client) -> None:
    response = await answer(webhook, eviction_review("pending"))
    assert response["allowed"] is False
    assert "not scheduled" in response["status"]["message"]


async def test_a_token_without_the_node_claim_evicts_nothing(webhook: Client, pods: Pods) -> None:
    response = await answer(webhook, eviction_review("on-a", node=None))
    assert response["allowed"] is False
    assert NODE_CLAIM in response["status"]["message"]
    assert pods.reads == 0


async def test_an_unreadable_pod_is_refused_for_now_not_a_500(webhook: Client, pods: Pods) -> None:
    pods.fail = True
    response = await answer(webhook, eviction_review("on-a"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "retry" in response["status"]["message"]


async def test_a_missing_pod_and_other_users_are_allowed(webhook: Client, pods: Pods) -> None:
    assert (await answer(webhook, eviction_review("no-such-pod")))["allowed"] is True
    other = eviction_review("on-b", user="system:serviceaccount:kube-system:pdb-tool")
    assert (await answer(webhook, other))["allowed"] is True
    assert pods.reads == 1  # only the agent's requests are looked into


async def test_an_eviction_without_the_pods_uid_or_of_another_pod_evicts_nothing(
    webhook: Client,
) -> None:
    # The apiserver reads the pod after admission: without a UID precondition a pod
    # of the same name created meanwhile, on any node, would be the one evicted.
    bare = await answer(webhook, eviction_review("on-a", uid=""))
    assert bare["allowed"] is False
    assert "deleteOptions.preconditions.uid" in bare["status"]["message"]
    other = await answer(webhook, eviction_review("on-a", uid="uid-of-its-predecessor"))
    assert other["allowed"] is False
    assert other["status"]["code"] == 409
    assert "is now another pod" in other["status"]["message"]


async def test_a_malformed_review_is_a_denial_naming_the_field(webhook: Client) -> None:
    review = eviction_review("on-a")
    review["request"]["userInfo"]["extra"] = {NODE_CLAIM: "gpu-a"}  # a string, not a list
    response = await answer(webhook, review)
    assert response["allowed"] is False
    assert "userInfo" in response["status"]["message"]


async def read_pod_with_uid(request: web.Request) -> web.Response:
    """As tests.pod_reads.read_pod, with the pod's UID."""
    answer = await read_pod(request)
    if answer.status != 200:
        return answer
    pod = json.loads(cast(bytes, answer.body))
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    return web.json_response(pod)


async def test_the_pod_is_read_from_the_apiserver() -> None:
    app = web.Application()
    app.router.add_get(POD_PATH, read_pod_with_uid)
    async with TestServer(app, host="127.0.0.1") as server:
        configuration = client.Configuration()
        configuration.host = str(server.make_url("")).rstrip("/")
        rest = Rest(configuration, timeout=2.0)
        try:
            pod_node = api_pod_node(rest)
            assert await pod_node("ml", "p") == ("gpu-a", "uid-p")
            assert await pod_node("ml", "gone") is None
            with pytest.raises(LookupError, match="HTTP 503: etcd down"):
                await pod_node("ml", "broken")
        finally:
            await rest.close()
