"""The HTTP side: health, readiness, metrics, body cap, and bad input that is
answered with a 4xx or a denial -- never a 500."""

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.webhook.conftest import Client
from tests.webhook.reviews import review_bytes, review_json
from webhook.metrics import WebhookMetrics
from webhook.review import AdmissionRequest, AdmissionResponse, Verdict
from webhook.server import create_app


class Double:
    """A test double of the review function: allows everything, or raises."""

    def __init__(self) -> None:
        self.seen: list[AdmissionRequest] = []
        self.fail = False

    async def __call__(self, request: AdmissionRequest) -> Verdict:
        self.seen.append(request)
        if self.fail:
            raise KeyError("boom")
        return Verdict(AdmissionResponse.allow(request.uid), "skipped", "p1")


@pytest.fixture
def double() -> Double:
    return Double()


@pytest.fixture
def waiting() -> list[str]:
    """What the app reports as not ready; tests empty it to flip readiness."""
    return ["namespaces", "gpusharingpolicies"]


@pytest.fixture
async def small(double: Double, waiting: list[str]) -> AsyncIterator[Client]:
    """An app with a 2 KiB body cap and the test double as its review function."""
    app = create_app(
        double, metrics=WebhookMetrics(), not_ready=lambda: waiting, max_body_bytes=2048
    )
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_healthz_answers_ok(small: Client) -> None:
    reply = await small.get("/healthz")
    assert reply.status == 200
    assert await reply.text() == "ok"


async def test_readyz_is_503_until_the_caches_sync(small: Client, waiting: list[str]) -> None:
    reply = await small.get("/readyz")
    assert reply.status == 503
    assert "namespaces" in await reply.text()
    waiting.clear()
    assert (await small.get("/readyz")).status == 200


async def test_metrics_count_admissions_by_outcome_and_policy(small: Client) -> None:
    uid = review_json("deployment-pod-no-gpu")["request"]["uid"]
    small_review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml-team",
            "operation": "CREATE",
            "object": {"metadata": {}},
        },
    }
    assert (await small.post("/mutate", json=small_review)).status == 200
    text = await (await small.get("/metrics")).text()
    assert 'headroom_webhook_admissions_total{outcome="skipped",policy="p1"} 1.0' in text
    assert "headroom_webhook_admission_duration_seconds_bucket" in text
    assert "headroom_webhook_admission_duration_seconds_count" in text


async def test_a_body_over_the_cap_is_413_by_content_length(small: Client, double: Double) -> None:
    reply = await small.post("/mutate", data=b"{" + b" " * 4096 + b"}")
    assert reply.status == 413
    body = await reply.json()
    assert body["reason"] == "RequestEntityTooLarge"
    assert "2048-byte limit" in body["message"]
    assert not double.seen


async def test_a_chunked_body_over_the_cap_is_413(small: Client) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b" " * 1024

    reply = await small.post("/mutate", data=chunks())
    assert reply.status == 413
    assert (await reply.json())["code"] == 413


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"\xff\xfe not utf-8", "body is not JSON"),
        (b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}', "apiVersion"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request"),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}',
            "request.uid",
        ),
    ],
)
async def test_input_without_a_usable_uid_is_a_400_status(
    small: Client, body: bytes, expected: str
) -> None:
    reply = await small.post("/mutate", data=body, headers={"Content-Type": "application/json"})
    assert reply.status == 400
    status = await reply.json()
    assert status["kind"] == "Status"
    assert status["reason"] == "BadRequest"
    assert expected in status["message"]


async def test_a_bad_field_with_a_uid_is_a_denial_naming_the_field(small: Client) -> None:
    document = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-9", "kind": {"kind": "Pod"}, "operation": "CREATE"},
    }
    reply = await small.post("/mutate", json=document)
    assert reply.status == 200
    response = (await reply.json())["response"]
    assert response["uid"] == "u-9"
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "request.resource" in response["status"]["message"]


async def test_a_failing_review_is_a_denial_not_a_500(small: Client, double: Double) -> None:
    double.fail = True
    uid = review_json("pod-cuda-vectoradd")["request"]["uid"]
    app = create_app(double, metrics=WebhookMetrics())
    async with TestClient(TestServer(app)) as client:
        reply = await client.post("/mutate", data=review_bytes("pod-cuda-vectoradd"))
        assert reply.status == 200
        response = (await reply.json())["response"]
        metrics = await (await client.get("/metrics")).text()
    assert response["uid"] == uid
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "KeyError" in response["status"]["message"]
    assert 'outcome="error"' in metrics


async def test_other_methods_and_paths_are_4xx(small: Client) -> None:
    assert (await small.get("/mutate")).status == 405
    assert (await small.post("/validate", data=b"{}")).status == 404
