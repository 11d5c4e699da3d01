"""The wire types: what is parsed, what is refused, what goes back."""

import base64
import json

import pytest

from tests.webhook.reviews import review_bytes, review_json
from webhook.review import AdmissionResponse, ReviewError, parse_request, response_body


def test_a_deployment_pod_parses_with_generate_name_and_no_name() -> None:
    request = parse_request(review_bytes("deployment-pod-shared"))
    assert request.uid == "0f5c2a47-8e1b-4d3a-b6c9-2e7f1a9d4c83"
    assert request.name == ""
    assert request.namespace == "ml-team"
    assert request.is_pod()
    assert request.object is not None
    assert request.object["metadata"]["generateName"] == "tf-notebook-7d9c8b6f5-"
    assert "namespace" not in request.object["metadata"]


def test_fields_headroom_does_not_read_are_kept() -> None:
    request = parse_request(review_bytes("pod-dry-run"))
    extras = request.model_extra or {}
    assert request.user_info.username == "kubernetes-admin"  # read now (webhook.eviction)
    assert extras["options"]["dryRun"] == ["All"]
    assert request.dry_run is True


def test_a_deployment_is_not_a_pod() -> None:
    assert not parse_request(review_bytes("deployment-create")).is_pod()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "body is not JSON"),
        (b"{not json", "body is not JSON"),
        (b"[]", "body: Input should be an object"),
        (b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}', "apiVersion"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}', "kind"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request: field"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}', "uid"),
        (b"[" * 10_000, "recursion limit"),
    ],
)
def test_bodies_that_are_not_reviews_name_the_problem_and_have_no_uid(
    body: bytes, expected: str
) -> None:
    with pytest.raises(ReviewError, match=expected) as caught:
        parse_request(body)
    assert caught.value.uid is None


def test_a_bad_field_with_a_readable_uid_keeps_the_uid() -> None:
    document = review_json("deployment-pod-shared")
    document["request"]["operation"] = "PATCH"
    document["request"]["dryRun"] = "false"  # a string is not a boolean
    with pytest.raises(ReviewError) as caught:
        parse_request(json.dumps(document).encode())
    assert caught.value.uid == document["request"]["uid"]
    assert "request.operation" in str(caught.value)
    assert "request.dryRun" in str(caught.value)


def test_an_allowed_response_with_a_patch_carries_patch_type_and_base64() -> None:
    ops = [{"op": "add", "path": "/metadata/annotations/headroom.dev~1mode", "value": "shared"}]
    body = json.loads(response_body(AdmissionResponse.allow("u-1", ops, ["headroom: hi"])))
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == ops
    assert response["warnings"] == ["headroom: hi"]
    assert "status" not in response


def test_an_allowed_response_without_a_patch_has_no_patch_type_nor_warnings() -> None:
    body = json.loads(response_body(AdmissionResponse.allow("u-2", [], [])))
    assert body["response"] == {"uid": "u-2", "allowed": True}


def test_a_denial_carries_a_status_with_code_and_message() -> None:
    body = json.loads(response_body(AdmissionResponse.deny("u-3", 403, "no")))
    assert body["response"] == {
        "uid": "u-3",
        "allowed": False,
        "status": {"code": 403, "message": "no", "reason": "Forbidden"},
    }


def test_a_lone_surrogate_in_a_patch_value_still_encodes() -> None:
    ops = [{"op": "add", "path": "/metadata/annotations/x", "value": "\ud800"}]
    body = json.loads(response_body(AdmissionResponse.allow("u-4", ops)))
    assert json.loads(base64.b64decode(body["response"]["patch"])) == ops


def test_a_null_user_extra_value_is_read_as_none() -> None:
    # authenticationv1.ExtraValue is a Go []string: an authenticator (a token webhook's
    # TokenReview) that gives a key a nil slice reaches the review as null; the pod
    # must not be refused for who created it.
    review = review_json("pod-cuda-vectoradd")
    review["request"]["userInfo"]["extra"] = {"example.com/claim": None, "scopes": ["a"]}
    request = parse_request(json.dumps(review).encode())
    assert request.user_info.extra == {"example.com/claim": None, "scopes": ["a"]}
