"""caBundle injection: the CA check and the JSON Patch, applied with ``jsonpatch``.
(The call against a real apiserver runs in the e2e suite.)"""

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonpatch
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs.generate import generate
from certs.inject import InjectError, ca_bundle_patch, has_ca_bundle, inject_ca_bundle, read_ca


def configuration(webhooks: int) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "headroom", "resourceVersion": "4711"},
        "webhooks": [
            {
                "name": f"pods-{i}.headroom.dev",
                "clientConfig": {"service": {"name": "headroom-webhook", "namespace": "hs"}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
            }
            for i in range(webhooks)
        ],
    }


def test_every_webhook_gets_the_bundle_and_the_patch_tests_the_version(tmp_path: Path) -> None:
    generate(tmp_path, service="headroom-webhook", namespace="hs")
    ca = read_ca((tmp_path / "ca.crt").read_bytes(), "ca.crt")
    original = configuration(2)
    original["webhooks"][1]["clientConfig"]["caBundle"] = "b2xk"  # replaced, not kept
    ops = ca_bundle_patch(original, ca)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"}
    result = jsonpatch.apply_patch(original, ops)
    for webhook in result["webhooks"]:
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
        assert webhook["clientConfig"]["service"]["name"] == "headroom-webhook"


def test_a_stale_version_makes_the_patch_fail() -> None:
    ops = ca_bundle_patch(configuration(1), b"pem")
    newer = configuration(1)
    newer["metadata"]["resourceVersion"] = "4712"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(newer, ops)


def test_a_configuration_without_webhooks_is_an_error() -> None:
    with pytest.raises(InjectError, match="no webhooks"):
        ca_bundle_patch(configuration(0), b"pem")


def test_a_serving_certificate_is_not_a_ca(tmp_path: Path) -> None:
    generate(tmp_path, service="w", namespace="n")
    with pytest.raises(InjectError, match="not a CA"):
        read_ca((tmp_path / "tls.crt").read_bytes(), "tls.crt")


def test_text_that_is_no_certificate_is_an_error() -> None:
    with pytest.raises(InjectError, match="no PEM certificate"):
        read_ca(b"hello", "ca.crt")


def test_a_bundle_counts_as_set_only_when_every_webhook_carries_it() -> None:
    partly = configuration(2)
    partly["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(b"pem").decode()
    fully = jsonpatch.apply_patch(partly, ca_bundle_patch(partly, b"pem"))

    assert not has_ca_bundle(partly, b"pem")
    assert has_ca_bundle(fully, b"pem")
    assert not has_ca_bundle(fully, b"other")
    assert not has_ca_bundle(configuration(0), b"pem")


def test_the_shipped_configuration_gives_the_eviction_check_the_same_ca(tmp_path: Path) -> None:
    # The agent's eviction check lives in the MutatingWebhookConfiguration so that
    # the certificates Job and cert-manager's injector, which patch that one
    # object, keep its caBundle too; moved to a configuration of its own, it would
    # be left without a CA and (failurePolicy Fail) refuse every agent eviction.
    shipped = Path(__file__).resolve().parents[2] / "manifests/base/webhook"
    (document,) = [
        doc
        for file in sorted(shipped.glob("*webhookconfiguration*.yaml"))
        for doc in yaml.safe_load_all(file.read_text())
    ]
    generate(tmp_path, service="headroom-webhook", namespace="hs")
    ca = read_ca((tmp_path / "ca.crt").read_bytes(), "ca.crt")
    result = jsonpatch.apply_patch(document, ca_bundle_patch(document, ca))
    bundles = {hook["name"]: hook["clientConfig"].get("caBundle") for hook in result["webhooks"]}
    assert set(bundles) == {"pods.headroom.dev", "agent-evictions.headroom.dev"}
    assert {base64.b64decode(b) for b in bundles.values()} == {ca}


class _RefusingAdmission:
    def __init__(self, verb: str, status: int, message: str) -> None:
        self.verb, self.status, self.message = verb, status, message

    def _refuse(self, verb: str) -> None:
        if verb == self.verb:
            err = ApiException(status=self.status, reason="Forbidden")
            err.headers = {"Audit-Id": "0b5c", "Content-Type": "application/json"}
            err.body = json.dumps({"kind": "Status", "message": self.message})
            raise err

    def read_mutating_webhook_configuration(self, name: str, **_: Any) -> Any:
        self._refuse("get")
        return SimpleNamespace(data=json.dumps(configuration(1)).encode())

    def patch_mutating_webhook_configuration(self, name: str, body: Any, **_: Any) -> None:
        self._refuse("patch")


@pytest.mark.parametrize("verb", ["get", "patch"])
def test_a_refused_read_or_patch_is_one_line_naming_the_permission(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verb: str
) -> None:
    said = f'mutatingwebhookconfigurations "headroom" is forbidden: cannot {verb}'
    admission = _RefusingAdmission(verb, 403, said)
    monkeypatch.setattr(client, "AdmissionregistrationV1Api", lambda api: admission)
    generate(tmp_path, service="headroom-webhook", namespace="hs")

    with pytest.raises(InjectError) as raised:
        inject_ca_bundle(object(), "headroom", (tmp_path / "ca.crt").read_bytes())  # type: ignore[arg-type]

    message = str(raised.value)
    assert "\n" not in message
    assert "Audit-Id" not in message
    assert said in message
    assert f"needs '{verb}' on mutatingwebhookconfigurations/headroom" in message
