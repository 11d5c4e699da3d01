"""What the two certificate Secrets should hold: decisions over their data, no I/O.

The CA lives in a Secret of its own (``ca.crt`` + ``ca.key``, type Opaque) that
only the certificates job may read; the webhook mounts the serving Secret
(type ``kubernetes.io/tls``: ``tls.crt``, ``tls.key``, ``ca.crt``) and never
sees the CA key. The CA is created once and reused, so the caBundle the
apiserver trusts does not change when the serving certificate is re-issued.

A CA Secret that exists but is unusable is an error, never silently replaced:
a new CA means a new caBundle, and the admission outage we exist to avoid. A
serving Secret that is unusable is ours to re-issue, and the reason is said.
"""

import base64
import binascii
import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs.generate import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    IPAddress,
    Issuer,
    cert_pem,
    is_ca,
    key_pem,
    new_ca,
    serving_certificate,
)

TLS_TYPE = "kubernetes.io/tls"
CA_TYPE = "Opaque"


CA_REMEDY = (
    "restore it, or delete it to issue a new CA (the caBundle keeps the CAs it has "
    "until the webhook has the new serving certificate)"
)
"""What to do about an unusable CA Secret: the job never replaces one by itself."""


class SecretError(ValueError):
    """A Secret exists but cannot be used as it is; the message names it and the field."""


@dataclass(frozen=True)
class SecretState:
    """A Secret as read from the API: decoded data, plus the raw object to write back."""

    namespace: str
    name: str
    type: str
    data: Mapping[str, bytes]
    resource_version: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        return f"Secret {self.namespace}/{self.name}"


@dataclass(frozen=True)
class ServingSpec:
    """The serving certificate we want: its SANs, and how early to renew it."""

    dns_names: tuple[str, ...]
    ips: tuple[IPAddress, ...] = ()
    renew_before: datetime.timedelta = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Verdict:
    reissue: bool
    reason: str


def decode_secret(obj: Mapping[str, Any]) -> SecretState:
    """A raw Secret (API JSON) as :class:`SecretState`; bad base64 names the key."""
    metadata = obj.get("metadata") or {}
    namespace, name = metadata.get("namespace", ""), metadata.get("name", "?")
    data: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value or "", validate=True)
        except (binascii.Error, ValueError) as err:
            raise SecretError(f"Secret {namespace}/{name}: data.{key} is not base64") from err
    return SecretState(
        namespace=namespace,
        name=name,
        type=obj.get("type") or CA_TYPE,
        data=data,
        resource_version=metadata.get("resourceVersion", ""),
        raw=obj,
    )


def load_ca(
    secret: SecretState, now: datetime.datetime, renew_before: datetime.timedelta
) -> Issuer:
    """The CA held by ``secret``; SecretError naming the field if it is not a usable CA."""
    try:
        certificate = _certificate(secret, CA_CERT)
        key = _private_key(secret, CA_KEY)
        if certificate is None or key is None:
            missing = CA_CERT if certificate is None else CA_KEY
            raise SecretError(f"{secret.ref}: data.{missing} is missing")
        if not _same_public_key(certificate, key):
            raise SecretError(f"{secret.ref}: {CA_KEY} does not match {CA_CERT}")
        if not is_ca(certificate):
            raise SecretError(f"{secret.ref}: {CA_CERT} is not a CA certificate (BasicConstraints)")
    except SecretError as err:
        raise SecretError(f"{err}; {CA_REMEDY}") from err
    expires = certificate.not_valid_after_utc
    if expires - now <= renew_before:
        # Serving certs are capped at the CA's expiry, so renewing them cannot help.
        # Rotating the CA changes the caBundle: a deliberate act, not a cron job's.
        raise SecretError(
            f"{secret.ref}: {CA_CERT} expires {expires:%Y-%m-%d %H:%M}Z, within the renewal "
            f"window; delete the Secret to issue a new CA (the caBundle keeps the old CA "
            f"until the webhook has the new serving certificate)"
        )
    return Issuer(certificate, key)


def check_serving(
    secret: SecretState | None, issuer: Issuer, spec: ServingSpec, now: datetime.datetime
) -> Verdict:
    """Whether the serving Secret must be (re)issued, and why (or why not)."""
    if secret is None:
        return Verdict(True, "missing")
    if secret.type != TLS_TYPE:
        # A Secret's type is immutable: an update cannot fix this, only a delete.
        raise SecretError(
            f"{secret.ref}: type is {secret.type!r}, expected {TLS_TYPE!r}; delete it (a "
            f"Secret's type cannot change) and run again: a new one is issued"
        )
    try:
        certificate = _certificate(secret, TLS_CERT)
        key = _private_key(secret, TLS_KEY)
    except SecretError as err:
        return Verdict(True, str(err))
    if certificate is None or key is None:
        return Verdict(True, f"data.{TLS_CERT if certificate is None else TLS_KEY} is missing")
    if not _same_public_key(certificate, key):
        return Verdict(True, f"{TLS_KEY} does not match {TLS_CERT}")
    if not _issued_by(certificate, issuer.certificate):
        return Verdict(True, "not signed by the current CA")
    if secret.data.get(CA_CERT) != cert_pem(issuer.certificate):
        return Verdict(True, f"{CA_CERT} is not the current CA")
    wanted, have = _san_set(spec.dns_names, spec.ips), _sans(certificate)
    if have != wanted:
        return Verdict(True, f"SANs {sorted(have)} are not {sorted(wanted)}")
    if certificate.not_valid_before_utc > now:
        return Verdict(True, f"not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M}Z")
    expires = certificate.not_valid_after_utc
    if expires - now <= spec.renew_before:
        return Verdict(True, f"expires {expires:%Y-%m-%d %H:%M}Z, within the renewal window")
    return Verdict(False, f"valid until {expires:%Y-%m-%d %H:%M}Z, signed by the current CA")


def issue_ca(common_name: str, now: datetime.datetime) -> tuple[Issuer, dict[str, bytes]]:
    issuer = new_ca(common_name, now)
    return issuer, {CA_CERT: cert_pem(issuer.certificate), CA_KEY: key_pem(issuer.key)}


def issue_serving(
    issuer: Issuer, spec: ServingSpec, now: datetime.datetime
) -> tuple[x509.Certificate, dict[str, bytes]]:
    certificate, key = serving_certificate(issuer, spec.dns_names, spec.ips, now)
    data = {
        TLS_CERT: cert_pem(certificate),
        TLS_KEY: key_pem(key),
        CA_CERT: cert_pem(issuer.certificate),
    }
    return certificate, data


def secret_body(
    namespace: str,
    name: str,
    type_: str,
    data: Mapping[str, bytes],
    *,
    current: SecretState | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Secret to create, or ``current`` with new data (its resourceVersion kept, so a
    concurrent writer makes our update fail with 409 instead of being overwritten)."""
    body: dict[str, Any] = dict(current.raw) if current else {"apiVersion": "v1", "kind": "Secret"}
    metadata = dict(body.get("metadata") or {})
    metadata.update(name=name, namespace=namespace)
    metadata["labels"] = {**(metadata.get("labels") or {}), **(labels or {})}
    body["metadata"] = metadata
    body["type"] = type_
    body["data"] = {key: base64.b64encode(value).decode("ascii") for key, value in data.items()}
    body.pop("stringData", None)
    return body


def _certificate(secret: SecretState, key: str) -> x509.Certificate | None:
    value = secret.data.get(key)
    if not value:
        return None
    try:
        return x509.load_pem_x509_certificate(value)
    except ValueError as err:
        raise SecretError(f"{secret.ref}: data.{key} is not a PEM certificate ({err})") from err


def _private_key(secret: SecretState, key: str) -> ec.EllipticCurvePrivateKey | None:
    value = secret.data.get(key)
    if not value:
        return None
    try:
        loaded = serialization.load_pem_private_key(value, password=None)
    except (ValueError, TypeError) as err:
        raise SecretError(f"{secret.ref}: data.{key} is not a PEM private key ({err})") from err
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise SecretError(f"{secret.ref}: data.{key} is not an EC private key")
    return loaded


def _same_public_key(certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    encoding, form = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ours = key.public_key().public_bytes(encoding, form)
    return certificate.public_key().public_bytes(encoding, form) == ours


def _issued_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _san_set(dns_names: Sequence[str], ips: Sequence[IPAddress]) -> set[str]:
    return {f"DNS:{name}" for name in dns_names} | {f"IP:{ip}" for ip in ips}


def _sans(certificate: x509.Certificate) -> set[str]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return set()
    names: list[str] = extension.value.get_values_for_type(x509.DNSName)
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [
        ip
        for ip in extension.value.get_values_for_type(x509.IPAddress)
        if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)
    ]
    return _san_set(names, ips)
