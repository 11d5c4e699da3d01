"""``headroom certs secret`` against the real apiserver, as a least-privilege identity.

The command runs as a ServiceAccount user bound to the rules of
``manifests/base/rbac/certificates.yaml`` (the names rewritten to this test's
own Secrets and MutatingWebhookConfiguration, so the running local webhook and
its configuration are never touched). The test configuration is harmless:
failurePolicy Ignore and an objectSelector no pod matches.
"""

import base64
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from certs.generate import key_pem
from devcluster import controlplane
from devcluster.binaries import CHECKOUT
from devcluster.cluster import Cluster
from tests.e2e.conftest import NamespaceFactory

pytestmark = pytest.mark.e2e

RBAC = CHECKOUT / "manifests" / "base" / "rbac" / "certificates.yaml"
SERVICE = "e2e-webhook"
_runs = itertools.count(1)


@dataclass(frozen=True)
class Setup:
    namespace: str
    secret: str
    ca_secret: str
    webhook: str
    kubeconfig: Path


def _least_privilege(setup: Setup, account: str) -> list[dict[str, Any]]:
    """The manifest's Role and ClusterRole for the certs job, renamed to this test's objects."""
    renames = {
        "headroom-webhook-tls": setup.secret,
        "headroom-webhook-ca": setup.ca_secret,
        "headroom": setup.webhook,
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": setup.namespace}
    objects: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(RBAC.read_text()):
        if document["kind"] not in ("Role", "ClusterRole"):
            continue
        kind = document["kind"]
        for rule in document["rules"]:
            if "resourceNames" in rule:
                rule["resourceNames"] = [renames[name] for name in rule["resourceNames"]]
        metadata: dict[str, Any] = {"name": setup.webhook}
        if kind == "Role":
            metadata["namespace"] = setup.namespace
        objects.append({**document, "metadata": metadata})
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": f"{kind}Binding",
                "metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                            "name": setup.webhook},
                "subjects": [subject],
            }
        )  # fmt: skip
    return objects


def _webhook_configuration(setup: Setup) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": setup.webhook},
        "webhooks": [
            {
                "name": "certs-e2e.headroom.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "clientConfig": {
                    "service": {"name": SERVICE, "namespace": setup.namespace, "path": "/m"}
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": {
                    "matchExpressions": [{"key": "headroom.dev/certs-e2e", "operator": "Exists"}]
                },
            }
        ],
    }


@pytest.fixture
def setup(cluster: Cluster, namespace: NamespaceFactory) -> Iterator[Setup]:
    ns = namespace()
    account = "e2e-certs"
    user = f"system:serviceaccount:{ns}:{account}"
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated")
    name = f"e2e-certs-{next(_runs)}-{os.getpid()}"
    kubeconfig = controlplane.identity(cluster.state, name, user, groups)
    made = Setup(ns, f"{name}-tls", f"{name}-ca", name, kubeconfig)
    cluster.apply([*_least_privilege(made, account), _webhook_configuration(made)])
    yield made
    cluster.kubectl(
        "delete", "mutatingwebhookconfiguration,clusterrole,clusterrolebinding", name,
        "--ignore-not-found",
    )  # fmt: skip


def _certs_secret(
    setup: Setup, *extra: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "cli", "certs", "secret",
        "--namespace", setup.namespace, "--service", SERVICE,
        "--secret", setup.secret, "--ca-secret", setup.ca_secret, "--webhook", setup.webhook,
        "--kubeconfig", str(kubeconfig or setup.kubeconfig), *extra,
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, cwd=CHECKOUT
    )


def _secret(cluster: Cluster, setup: Setup, name: str) -> dict[str, Any]:
    secret: dict[str, Any] = cluster.kubectl_json("get", "secret", name, "-n", setup.namespace)
    return secret


def _data(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _versions(cluster: Cluster, setup: Setup) -> tuple[str, str, str]:
    configuration = cluster.kubectl_json("get", "mutatingwebhookconfiguration", setup.webhook)
    return (
        _secret(cluster, setup, setup.ca_secret)["metadata"]["resourceVersion"],
        _secret(cluster, setup, setup.secret)["metadata"]["resourceVersion"],
        configuration["metadata"]["resourceVersion"],
    )


def _ca_bundle(cluster: Cluster, setup: Setup) -> bytes:
    configuration = cluster.kubectl_json("get", "mutatingwebhookconfiguration", setup.webhook)
    return base64.b64decode(configuration["webhooks"][0]["clientConfig"]["caBundle"])


def test_first_run_creates_both_secrets_then_reruns_write_nothing_and_renewal_keeps_the_ca(
    cluster: Cluster, setup: Setup
) -> None:
    first = _certs_secret(setup)

    assert first.returncode == 0, first.stderr
    ca_secret = _secret(cluster, setup, setup.ca_secret)
    serving = _secret(cluster, setup, setup.secret)
    ca_pem = _data(ca_secret, "ca.crt")
    assert sorted(ca_secret["data"]) == ["ca.crt", "ca.key"]
    assert serving["type"] == "kubernetes.io/tls"
    assert sorted(serving["data"]) == ["ca.crt", "tls.crt", "tls.key"]  # never the CA key
    assert _data(serving, "ca.crt") == ca_pem
    certificate = x509.load_pem_x509_certificate(_data(serving, "tls.crt"))
    certificate.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{SERVICE}.{setup.namespace}.svc" in sans.get_values_for_type(x509.DNSName)
    assert _ca_bundle(cluster, setup) == ca_pem
    assert "created (new CA" in first.stdout

    before = _versions(cluster, setup)
    second = _certs_secret(setup)

    assert second.returncode == 0, second.stderr
    assert _versions(cluster, setup) == before
    assert second.stdout.strip().endswith("in line; nothing written")

    # A window longer than the certificate's whole lifetime: due for renewal now.
    renewed = _certs_secret(setup, "--renew-before", "400d")

    assert renewed.returncode == 0, renewed.stderr
    assert "reissued (expires" in renewed.stdout
    after = _versions(cluster, setup)
    assert after[0] == before[0]  # the CA Secret is untouched
    assert after[1] != before[1]  # the serving Secret was re-issued
    assert after[2] == before[2]  # the caBundle did not change, so it was not written
    fresh = _secret(cluster, setup, setup.secret)
    new_certificate = x509.load_pem_x509_certificate(_data(fresh, "tls.crt"))
    assert new_certificate.serial_number != certificate.serial_number
    new_certificate.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    assert _data(fresh, "ca.crt") == ca_pem
    assert _ca_bundle(cluster, setup) == ca_pem


def test_a_ca_key_that_does_not_match_is_refused_naming_the_secret_and_field(
    cluster: Cluster, setup: Setup
) -> None:
    assert _certs_secret(setup).returncode == 0
    ca = _secret(cluster, setup, setup.ca_secret)
    # The kind of hand edit that must stop the job, not make it issue a new CA.
    stray = key_pem(ec.generate_private_key(ec.SECP256R1()))
    ca["data"]["ca.key"] = base64.b64encode(stray).decode()
    cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(ca))
    versions = _versions(cluster, setup)

    result = _certs_secret(setup, "--renew-before", "400d")

    assert result.returncode == 2
    message = f"Secret {setup.namespace}/{setup.ca_secret}: ca.key does not match ca.crt"
    assert message in result.stderr
    assert _versions(cluster, setup) == versions  # nothing was replaced


@pytest.mark.parametrize(
    ("account", "verb", "resource", "allowed"),
    [
        ("headroom-certs", "get", "secrets/headroom-webhook-ca", True),
        ("headroom-certs", "update", "secrets/headroom-webhook-tls", True),
        ("headroom-certs", "create", "secrets", True),
        ("headroom-certs", "get", "secrets/some-other-secret", False),
        ("headroom-certs", "delete", "secrets/headroom-webhook-ca", False),
        ("headroom-certs", "patch", "secrets/headroom-webhook-tls", False),
        ("headroom-certs", "patch", "mutatingwebhookconfigurations/headroom", True),
        ("headroom-certs", "patch", "mutatingwebhookconfigurations/other", False),
        ("headroom-webhook", "get", "secrets/headroom-webhook-ca", False),
    ],
)
def test_only_the_certs_account_reaches_the_ca_secret(
    cluster: Cluster, account: str, verb: str, resource: str, allowed: bool
) -> None:
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", "headroom-system",
        f"--as=system:serviceaccount:headroom-system:{account}", check=False,
    )  # fmt: skip

    assert result.stdout.strip() == ("yes" if allowed else "no"), (account, verb, resource)


def test_the_certs_account_changes_only_the_ca_of_the_webhook_configuration(
    cluster: Cluster,
) -> None:
    # RBAC lets it patch the whole object; the admission policy keeps it to caBundle.
    account = "--as=system:serviceaccount:headroom-system:headroom-certs"
    bundle = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "headroom")["webhooks"][0][
        "clientConfig"
    ]["caBundle"]

    def patch(op: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(
            account, "patch", "mutatingwebhookconfiguration", "headroom", "--type=json",
            "-p", json.dumps([op]), check=False,
        )  # fmt: skip

    same = patch({"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle})
    assert same.returncode == 0, same.stderr
    for op in (
        {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"},
        {"op": "remove", "path": "/webhooks/1"},
        {"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": "https://elsewhere/m"},
        {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
    ):
        result = patch(op)
        assert result.returncode != 0, op
        assert "may change only clientConfig.caBundle" in result.stderr, result.stderr
    configuration = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "headroom")
    assert configuration["webhooks"][0]["failurePolicy"] == "Fail"
