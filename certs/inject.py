"""Put a CA into every webhook of a MutatingWebhookConfiguration (its caBundle).

A configuration whose webhooks all carry the bundle already is not written at
all, so a periodic run leaves its resourceVersion alone. The patch is a JSON
Patch that first tests the object's resourceVersion, so a configuration edited
between our read and our write is re-read rather than overwritten with a stale
list of webhooks.
"""

import base64
import json
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs.generate import is_ca

JSON_PATCH = "application/json-patch+json"
ATTEMPTS = 5


class InjectError(RuntimeError):
    """The CA or the configuration is not usable; the message says which and why."""


@dataclass(frozen=True)
class Injection:
    webhooks: int
    """How many webhooks carry the bundle now."""
    patched: bool
    """False when every webhook carried it already (nothing was written)."""


def read_ca(pem: bytes, source: str) -> bytes:
    """``pem`` if it holds CA certificates only; the apiserver would accept nothing else."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise InjectError(f"{source}: no PEM certificate ({err})") from err
    for certificate in certificates:
        if not is_ca(certificate):
            raise InjectError(
                f"{source}: {certificate.subject.rfc4514_string()} is not a CA certificate"
            )
    return pem


def ca_bundle_patch(configuration: dict[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """JSON Patch setting ``clientConfig.caBundle`` on every webhook of ``configuration``."""
    name = (configuration.get("metadata") or {}).get("name", "?")
    webhooks = configuration.get("webhooks") or []
    if not webhooks:
        raise InjectError(f"MutatingWebhookConfiguration {name} has no webhooks")
    bundle = base64.b64encode(ca_pem).decode("ascii")
    version = (configuration.get("metadata") or {}).get("resourceVersion")
    ops: list[dict[str, Any]] = []
    if version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": version})
    for index, webhook in enumerate(webhooks):
        if "clientConfig" not in webhook:
            raise InjectError(f"{name}: webhooks[{index}] has no clientConfig")
        path = f"/webhooks/{index}/clientConfig/caBundle"
        ops.append({"op": "add", "path": path, "value": bundle})  # add also replaces
    return ops


def has_ca_bundle(configuration: dict[str, Any], ca_pem: bytes) -> bool:
    """True if every webhook of ``configuration`` (at least one) carries ``ca_pem``."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    webhooks = configuration.get("webhooks") or []
    return bool(webhooks) and all(
        (webhook.get("clientConfig") or {}).get("caBundle") == bundle for webhook in webhooks
    )


def inject_ca_bundle(api: client.ApiClient, webhook: str, ca_pem: bytes) -> Injection:
    """Patch the caBundle in, unless it is there already."""
    admission = client.AdmissionregistrationV1Api(api)
    for _ in range(ATTEMPTS):
        try:
            # Raw JSON (_preload_content=False): the generated model would drop
            # fields newer than the client.
            response: Any = admission.read_mutating_webhook_configuration(
                webhook, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                raise InjectError(
                    f"MutatingWebhookConfiguration {webhook} not found; apply the manifests first"
                ) from err
            raise InjectError(f"reading MutatingWebhookConfiguration {webhook}: {err}") from err
        configuration = json.loads(response.data)
        ops = ca_bundle_patch(configuration, ca_pem)  # validates even when nothing changes
        if has_ca_bundle(configuration, ca_pem):
            return Injection(len(configuration["webhooks"]), patched=False)
        try:
            admission.patch_mutating_webhook_configuration(
                webhook, ops, _content_type=JSON_PATCH, _preload_content=False
            )
        except ApiException as err:
            if err.status in (409, 422) and _test_failed(err):
                continue  # changed since we read it: read again
            raise InjectError(f"patching MutatingWebhookConfiguration {webhook}: {err}") from err
        return Injection(len(configuration["webhooks"]), patched=True)
    raise InjectError(f"MutatingWebhookConfiguration {webhook} kept changing; try again")


def _test_failed(err: ApiException) -> bool:
    # The apiserver answers a failed JSON Patch "test" with 422 and the jsonpatch
    # library's text ("testing value ... failed", "test failed").
    body = str(err.body or "")
    return err.status == 409 or "testing value" in body or "test failed" in body
