"""``headroom certs secret``: bring the CA and serving Secrets (and the caBundle) in line.

Reads each Secret, lets :mod:`certs.secrets` decide, and writes only when the
decision says so: create, or update carrying the resourceVersion it read. A
409 (someone created or changed it since) means read again and decide again,
so two runs at once (the Job and the CronJob) agree on one CA and write the
serving Secret once. Every step is reported as a line saying what was decided.
"""

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs.generate import (
    CA_CERT,
    CLOCK_SKEW,
    TLS_CERT,
    IPAddress,
    Issuer,
    ca_common_name,
    cert_pem,
    service_names,
)
from certs.inject import inject_ca_bundle
from certs.secrets import (
    CA_TYPE,
    TLS_TYPE,
    SecretError,
    SecretState,
    ServingSpec,
    check_serving,
    decode_secret,
    issue_ca,
    issue_serving,
    load_ca,
    secret_body,
)

ATTEMPTS = 5
SETTLE = datetime.timedelta(minutes=10)
"""How long after a serving certificate is written before every webhook pod has it
(the kubelet updates a mounted Secret within a minute or two): until then, the CAs
that signed the certificates it replaced stay in the caBundle."""
LABELS = {"app.kubernetes.io/part-of": "headroom", "app.kubernetes.io/managed-by": "headroom-certs"}

Report = Callable[[str], None]


class SecretApiError(RuntimeError):
    """The API refused a read or write; the message names the Secret and the verb."""


@dataclass(frozen=True)
class Request:
    namespace: str
    service: str
    secret: str = "headroom-webhook-tls"
    ca_secret: str = "headroom-webhook-ca"
    webhook: str | None = None
    renew_before: datetime.timedelta = datetime.timedelta(days=30)
    dns: tuple[str, ...] = ()
    ips: tuple[IPAddress, ...] = ()

    def spec(self) -> ServingSpec:
        names = tuple(dict.fromkeys([*service_names(self.service, self.namespace), *self.dns]))
        return ServingSpec(names, self.ips, self.renew_before)


@dataclass(frozen=True)
class Outcome:
    ca_created: bool
    serving_issued: bool
    ca_bundle_patched: bool

    @property
    def wrote(self) -> bool:
        return self.ca_created or self.serving_issued or self.ca_bundle_patched


class SecretStore:
    """Get, create and update (with resourceVersion) Secrets in one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace

    def get(self, name: str) -> SecretState | None:
        try:
            # Raw JSON: the generated model would decode nothing and drop unknown fields.
            response: Any = self._core.read_namespaced_secret(
                name, self.namespace, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise self._error("get", name, err) from err
        return decode_secret(json.loads(response.data))

    def create(self, body: dict[str, Any]) -> bool:
        """False if it exists already (created by someone else since we looked)."""
        name = body["metadata"]["name"]
        try:
            self._core.create_namespaced_secret(self.namespace, _raw(body), _preload_content=False)
        except ApiException as err:
            if err.status == 409:
                return False
            raise self._error("create", name, err) from err
        return True

    def update(self, body: dict[str, Any]) -> bool:
        """False if the Secret changed since ``body``'s resourceVersion was read."""
        name = body["metadata"]["name"]
        try:
            self._core.replace_namespaced_secret(
                name, self.namespace, _raw(body), _preload_content=False
            )
        except ApiException as err:
            if err.status in (404, 409):  # 404: deleted since; re-read and create
                return False
            raise self._error("update", name, err) from err
        return True

    def _error(self, verb: str, name: str, err: ApiException) -> SecretApiError:
        hint = ""
        if err.status == 403:
            hint = f"; the ServiceAccount needs '{verb}' on secrets/{name} in {self.namespace}"
        return SecretApiError(
            f"{verb} Secret {self.namespace}/{name}: {err.status} {err.reason}{hint}"
        )


def _raw(body: dict[str, Any]) -> client.V1Secret:
    # The client serializes a dict as is; a V1Secret model would need the data
    # re-encoded and would drop fields it does not know (kept from the read).
    return cast(client.V1Secret, body)


def ensure_ca(
    store: SecretStore, request: Request, now: datetime.datetime, report: Report
) -> tuple[Issuer, bool]:
    """The CA from ``request.ca_secret`` (created there if missing), and whether it was new."""
    name = request.ca_secret
    for _ in range(ATTEMPTS):
        current = store.get(name)
        if current is not None:
            issuer = load_ca(current, now, request.renew_before)
            report(
                f"{current.ref}: kept (CA valid until "
                f"{issuer.certificate.not_valid_after_utc:%Y-%m-%d}Z)"
            )
            return issuer, False
        issuer, data = issue_ca(ca_common_name(request.service, request.namespace), now)
        if store.create(secret_body(store.namespace, name, CA_TYPE, data, labels=LABELS)):
            report(
                f"Secret {store.namespace}/{name}: created (new CA, valid until "
                f"{issuer.certificate.not_valid_after_utc:%Y-%m-%d}Z)"
            )
            return issuer, True
    raise SecretApiError(f"Secret {store.namespace}/{name} kept changing; try again")


def ensure_serving(
    store: SecretStore, request: Request, issuer: Issuer, now: datetime.datetime, report: Report
) -> tuple[bool, x509.Certificate]:
    """(Re)issue the serving Secret if :func:`check_serving` says so; whether it was
    written, and the certificate it holds now."""
    name, spec = request.secret, request.spec()
    for _ in range(ATTEMPTS):
        current = store.get(name)
        verdict = check_serving(current, issuer, spec, now)
        ref = current.ref if current else f"Secret {store.namespace}/{name}"
        if not verdict.reissue and current is not None:
            report(f"{ref}: kept ({verdict.reason})")
            return False, x509.load_pem_x509_certificate(current.data[TLS_CERT])
        certificate, data = issue_serving(issuer, spec, now)
        body = secret_body(store.namespace, name, TLS_TYPE, data, current=current, labels=LABELS)
        written = store.create(body) if current is None else store.update(body)
        if written:
            report(
                f"{ref}: {'created' if current is None else 'reissued'} ({verdict.reason}; "
                f"new certificate valid until {certificate.not_valid_after_utc:%Y-%m-%d}Z)"
            )
            return True, certificate
    raise SecretApiError(f"Secret {store.namespace}/{name} kept changing; try again")


def reconcile(
    api: client.ApiClient,
    request: Request,
    *,
    now: datetime.datetime | None = None,
    report: Report = print,
) -> Outcome:
    """CA Secret, then (with ``request.webhook``) the caBundle, then serving Secret.

    The caBundle trusts a new CA before any certificate it signs is written, and
    keeps trusting the CAs already in it until the serving certificate has been
    in its Secret for :data:`SETTLE` (a webhook pod serves the old one until the
    kubelet updates its mount): a CA rotation -- the CA Secret deleted -- never
    leaves the apiserver distrusting what the webhook serves, even when the run
    dies between two writes. The bundle changes only with the CA.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    store = SecretStore(api, request.namespace)
    issuer, ca_created = ensure_ca(store, request, now, report)
    ca_pem = cert_pem(issuer.certificate)
    patched = False
    if request.webhook:
        injection = inject_ca_bundle(api, request.webhook, ca_pem, keep_others_at=now)
        patched = injection.patched
        _report_bundle(report, request.webhook, injection, "set" if patched else "kept")
    serving_issued, serving = ensure_serving(store, request, issuer, now, report)
    if request.webhook and now - serving.not_valid_before_utc >= CLOCK_SKEW + SETTLE:
        # Every pod has the certificate signed by the current CA: the others go --
        # unless the CA Secret changed since we read it (another run rotating the CA
        # now: its new CA is in the bundle, and its certificate about to be served).
        ca_changed: list[bool] = []

        def ca_unchanged() -> bool:
            current = store.get(request.ca_secret)
            same = current is not None and _holds(current, issuer.certificate)
            ca_changed.append(not same)
            return same

        injection = inject_ca_bundle(api, request.webhook, ca_pem, only_if=ca_unchanged)
        if injection.patched:
            patched = True
            _report_bundle(report, request.webhook, injection, "set to the current CA only")
        elif ca_changed and ca_changed[-1]:
            report(
                f"Secret {store.namespace}/{request.ca_secret} changed during this run: "
                f"the caBundle keeps its other CAs until a later run"
            )
    return Outcome(ca_created, serving_issued, patched)


def _holds(secret: SecretState, certificate: x509.Certificate) -> bool:
    """Whether ``secret``'s ca.crt is ``certificate``: compared as certificates, not as
    bytes (load_ca reads a PEM written by hand, its newlines its own, the same)."""
    try:
        return x509.load_pem_x509_certificate(secret.data.get(CA_CERT) or b"") == certificate
    except ValueError:
        return False


def _report_bundle(report: Report, webhook: str, injection: Any, done: str) -> None:
    report(
        f"MutatingWebhookConfiguration {webhook}: caBundle {done} "
        f"on {injection.webhooks} webhook(s)"
    )


__all__ = ["Outcome", "Request", "SecretApiError", "SecretError", "SecretStore", "reconcile"]
