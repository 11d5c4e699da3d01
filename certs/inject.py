"""Put a CA into every webhook of a MutatingWebhookConfiguration (its caBundle).

A configuration whose webhooks all carry the bundle already is not written at
all, so a periodic run leaves its resourceVersion alone. The patch is a JSON
Patch that first tests the object's resourceVersion, so a configuration edited
between our read and our write is re-read rather than overwritten with a stale
list of webhooks.
"""

import base64
import binascii
import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
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


def bundle_keeping(configuration: dict[str, Any], ca_pem: bytes, now: datetime.datetime) -> bytes:
    """``ca_pem`` followed by every other CA the webhooks already trust, while valid.

    For a CA rotation: the webhook serves its old certificate until the kubelet
    updates its mounted Secret (a minute or two), so the old CA must stay trusted
    until then; the new one must be trusted before a certificate it signed can land.
    """
    current = {c.fingerprint(hashes.SHA256()) for c in x509.load_pem_x509_certificates(ca_pem)}
    kept: list[bytes] = []
    for webhook in configuration.get("webhooks") or []:
        encoded = (webhook.get("clientConfig") or {}).get("caBundle")
        try:
            certificates = x509.load_pem_x509_certificates(base64.b64decode(encoded or ""))
        except (ValueError, binascii.Error):
            continue  # nothing the apiserver could have trusted either
        for certificate in certificates:
            fingerprint = certificate.fingerprint(hashes.SHA256())
            if (
                fingerprint not in current
                and is_ca(certificate)
                and certificate.not_valid_after_utc > now
            ):
                current.add(fingerprint)
                kept.append(certificate.public_bytes(serialization.Encoding.PEM))
    return ca_pem + b"".join(kept)


def inject_ca_bundle(
    api: client.ApiClient,
    webhook: str,
    ca_pem: bytes,
    *,
    keep_others_at: datetime.datetime | None = None,
    only_if: Callable[[], bool] | None = None,
) -> Injection:
    """Patch the caBundle in, unless it is there already. With ``keep_others_at``, the
    CAs already in the bundle (and valid then) stay after ``ca_pem`` (:func:`bundle_keeping`).
    With ``only_if``, the patch is made only if it says True after the configuration
    was read (checked again on each re-read): a change it looks for that lands later
    also changes the configuration first, and fails the patch's resourceVersion test."""
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
            raise _api_error("get", webhook, err) from err
        configuration = json.loads(response.data)
        bundle = ca_pem
        if keep_others_at is not None:
            bundle = bundle_keeping(configuration, ca_pem, keep_others_at)
        ops = ca_bundle_patch(configuration, bundle)  # validates even when nothing changes
        if has_ca_bundle(configuration, bundle) or (only_if is not None and not only_if()):
            return Injection(len(configuration["webhooks"]), patched=False)
        try:
            admission.patch_mutating_webhook_configuration(
                webhook, ops, _content_type=JSON_PATCH, _preload_content=False
            )
        except ApiException as err:
            if err.status in (409, 422) and _test_failed(err):
                continue  # changed since we read it: read again
            raise _api_error("patch", webhook, err) from err
        return Injection(len(configuration["webhooks"]), patched=True)
    raise InjectError(f"MutatingWebhookConfiguration {webhook} kept changing; try again")


def _api_error(verb: str, webhook: str, err: ApiException) -> InjectError:
    """One line: the status, the apiserver's message, and for a 403 the permission."""
    message = str(err.body or "")[:300]
    try:
        status = json.loads(err.body or "")
    except ValueError:
        pass
    else:
        if isinstance(status, dict) and status.get("message"):
            message = str(status["message"])
    hint = ""
    if err.status == 403:
        hint = (
            f"; the ServiceAccount needs '{verb}' on mutatingwebhookconfigurations/{webhook} "
            "(ClusterRole headroom-certs)"
        )
    text = " ".join(
        f"{verb} MutatingWebhookConfiguration {webhook}: {err.status} "
        f"{err.reason}: {message}".split()
    )
    return InjectError(text + hint)


def _test_failed(err: ApiException) -> bool:
    # The apiserver answers a failed JSON Patch "test" with 422 and the jsonpatch
    # library's text ("testing value ... failed", "test failed").
    body = str(err.body or "")
    return err.status == 409 or "testing value" in body or "test failed" in body
