"""``reconcile`` against an in-memory API: what the apiserver trusts at every write.

The webhook serves what its mounted Secret held; the kubelet updates that mount a
minute or two after the Secret changes. So after every write the caBundle must
trust the serving certificate now in the Secret *and* the one it replaced (if it
was replaced within KUBELET_LAG): otherwise, with failurePolicy Fail, admission
fails until the mount catches up -- or, if the Job dies between two writes, until
someone notices.
"""

import base64
import copy
import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from certs.reconciler import Request, reconcile
from certs.secrets import issue_ca, secret_body

NOW = datetime.datetime(2030, 6, 1, tzinfo=datetime.UTC)
KUBELET_LAG = datetime.timedelta(minutes=2)
NAMESPACE = "headroom-system"
REQUEST = Request(namespace=NAMESPACE, service="headroom-webhook", webhook="headroom")


@dataclass
class Response:
    data: bytes


class Killed(BaseException):
    """The Job's pod killed mid-run (not an Exception: nothing catches it)."""


@dataclass
class Cluster:
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    configuration: dict[str, Any] = field(default_factory=dict)
    now: datetime.datetime = NOW
    serving_history: list[tuple[datetime.datetime, bytes]] = field(default_factory=list)
    kill_after_writes: int | None = None
    writes: int = 0
    version: int = 100
    on_read: dict[str, Any] = field(default_factory=dict)
    """Secret name -> a callable run once, after that Secret is read (another writer)."""

    def bump(self) -> str:
        self.version += 1
        return str(self.version)

    def wrote(self) -> None:
        self.check_trusted()
        self.writes += 1
        if self.kill_after_writes is not None and self.writes >= self.kill_after_writes:
            self.kill_after_writes = None
            raise Killed()

    # --- the invariant -----------------------------------------------------------------

    def maybe_served(self) -> list[bytes]:
        """Serving certificates some webhook pod may still be serving now."""
        served = []
        for index, (_written, pem) in enumerate(self.serving_history):
            superseded = (
                self.serving_history[index + 1][0]
                if index + 1 < len(self.serving_history)
                else None
            )
            if superseded is None or self.now - superseded < KUBELET_LAG:
                served.append(pem)
        return served

    def check_trusted(self) -> None:
        hooks = self.configuration["webhooks"]
        if not any((hook["clientConfig"] or {}).get("caBundle") for hook in hooks):
            return  # install: before the first caBundle, admission never worked
        for hook in hooks:
            bundle = (hook["clientConfig"] or {}).get("caBundle")
            cas = x509.load_pem_x509_certificates(base64.b64decode(bundle)) if bundle else []
            for pem in self.maybe_served():
                leaf = x509.load_pem_x509_certificate(pem)
                assert any(_signed_by(leaf, ca) for ca in cas), (
                    f"{hook['name']}: the caBundle ({len(cas)} CA(s)) does not trust serial "
                    f"{leaf.serial_number:x}, which the webhook may be serving"
                )


def _signed_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class FakeCore:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Response:
        secret = self.cluster.secrets.get(name)
        if secret is None:
            raise ApiException(status=404, reason="Not Found")
        response = Response(json.dumps(secret).encode())
        interleave = self.cluster.on_read.pop(name, None)
        if interleave is not None:
            interleave()
        return response

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        name = body["metadata"]["name"]
        if name in self.cluster.secrets:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(name, body)

    def replace_namespaced_secret(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> None:
        current = self.cluster.secrets.get(name)
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self._store(name, body)

    def _store(self, name: str, body: dict[str, Any]) -> None:
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = self.cluster.bump()
        self.cluster.secrets[name] = stored
        if name == REQUEST.secret:
            pem = base64.b64decode(stored["data"]["tls.crt"])
            self.cluster.serving_history.append((self.cluster.now, pem))
        self.cluster.wrote()


class FakeAdmission:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def read_mutating_webhook_configuration(self, name: str, **_: Any) -> Response:
        return Response(json.dumps(self.cluster.configuration).encode())

    def patch_mutating_webhook_configuration(
        self, name: str, ops: list[dict[str, Any]], **_: Any
    ) -> None:
        try:
            patched = jsonpatch.apply_patch(self.cluster.configuration, ops)
        except jsonpatch.JsonPatchTestFailed as err:
            failure = ApiException(status=422, reason="Invalid")
            failure.body = f"testing value failed: {err}"
            raise failure from err
        patched["metadata"]["resourceVersion"] = self.cluster.bump()
        self.cluster.configuration = patched
        self.cluster.wrote()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    state = Cluster(
        configuration={
            "metadata": {"name": "headroom", "resourceVersion": "1"},
            "webhooks": [
                {"name": "pods.headroom.dev", "clientConfig": {"service": {"name": "w"}}},
                {"name": "agent-evictions.headroom.dev", "clientConfig": {"service": {}}},
            ],
        }
    )
    monkeypatch.setattr(client, "CoreV1Api", lambda api: FakeCore(state))
    monkeypatch.setattr(client, "AdmissionregistrationV1Api", lambda api: FakeAdmission(state))
    return state


def run(cluster: Cluster, at: datetime.datetime) -> None:
    cluster.now = at
    reconcile(object(), REQUEST, now=at, report=lambda _: None)  # type: ignore[arg-type]
    cluster.check_trusted()


def test_install_then_renewal_keep_admission_trusted(cluster: Cluster) -> None:
    run(cluster, NOW)
    run(cluster, NOW + datetime.timedelta(days=340))  # renewal, same CA

    assert len(cluster.serving_history) == 2


def test_a_new_ca_is_trusted_before_the_webhook_can_serve_a_certificate_it_signed(
    cluster: Cluster,
) -> None:
    # The CA Secret deleted (by an admin, or as load_ca's message says to do when
    # the CA nears its expiry): the next run issues a new CA and a new serving
    # certificate. While the kubelet still mounts the old certificate, the
    # apiserver must still trust the old CA.
    run(cluster, NOW)
    del cluster.secrets[REQUEST.ca_secret]

    run(cluster, NOW + datetime.timedelta(days=7))


@pytest.mark.parametrize("writes", [1, 2, 3])
def test_the_job_killed_between_any_two_writes_of_a_ca_rotation(
    cluster: Cluster, writes: int
) -> None:
    # E.g. killed after the CA Secret, or between the serving Secret and the caBundle.
    run(cluster, NOW)
    del cluster.secrets[REQUEST.ca_secret]
    later = NOW + datetime.timedelta(days=7)
    cluster.kill_after_writes = cluster.writes + writes
    with pytest.raises(Killed):
        run(cluster, later)
    # restartPolicy OnFailure: the container runs again seconds later.
    run(cluster, later + datetime.timedelta(seconds=10))


def test_the_old_ca_leaves_the_bundle_on_a_later_run(cluster: Cluster) -> None:
    run(cluster, NOW)
    old_ca = base64.b64decode(cluster.secrets[REQUEST.ca_secret]["data"]["ca.crt"])
    del cluster.secrets[REQUEST.ca_secret]
    run(cluster, NOW + datetime.timedelta(days=7))
    run(cluster, NOW + datetime.timedelta(days=14))  # a later CronJob run

    new_ca = base64.b64decode(cluster.secrets[REQUEST.ca_secret]["data"]["ca.crt"])
    for hook in cluster.configuration["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == new_ca != old_ca
    writes = cluster.writes
    run(cluster, NOW + datetime.timedelta(days=21))
    assert cluster.writes == writes  # in line: nothing written


def test_a_ca_rotation_during_a_renewal_run_keeps_the_new_ca_trusted(cluster: Cluster) -> None:
    # The CronJob has read the CA Secret and is about to drop the CAs other
    # than that one from the bundle, when an admin, rotating the CA (delete the
    # CA Secret, run the Job), completes a run: new CA in the bundle, serving
    # certificate signed by it. The CronJob must not then leave the bundle
    # trusting only the CA it read before: the webhook is about to serve the new one.
    run(cluster, NOW)
    later = NOW + datetime.timedelta(days=7)

    def admin_rotates() -> None:
        del cluster.secrets[REQUEST.ca_secret]
        reconcile(object(), REQUEST, now=later, report=lambda _: None)  # type: ignore[arg-type]

    cluster.on_read[REQUEST.secret] = admin_rotates
    run(cluster, later)
    cluster.now = later + KUBELET_LAG  # every webhook pod serves the new certificate now
    cluster.check_trusted()


def test_the_renewal_cronjob_restores_a_deleted_serving_secret_within_the_hour() -> None:
    """A webhook pod replaced after its serving Secret was deleted cannot mount it:
    with both replicas replaced admission has no endpoint and every GPU pod in a
    policy namespace is refused, until the next run puts the Secret back."""
    path = Path(__file__).resolve().parents[2] / "manifests/base/certificates/cronjob.yaml"
    schedule = yaml.safe_load(path.read_text())["spec"]["schedule"]
    minute, hour, day, month, weekday = schedule.split()
    assert minute.isdigit(), schedule
    assert (hour, day, month, weekday) == ("*", "*", "*", "*"), schedule


def test_the_old_ca_leaves_the_bundle_after_a_ca_secret_written_by_hand(
    cluster: Cluster,
) -> None:
    # An admin rotates the CA by putting one in the Secret by hand, as the CA error
    # says ("restore it"): a YAML `stringData` block written `|-` drops the PEM's
    # last newline, which load_ca reads the same. That is the CA the run read, not a
    # change during it: the old CA must still leave, and no run may say otherwise.
    run(cluster, NOW)
    old_ca = base64.b64decode(cluster.secrets[REQUEST.ca_secret]["data"]["ca.crt"])
    _issuer, data = issue_ca("an admin's CA", NOW)
    by_hand = {**data, "ca.crt": data["ca.crt"].rstrip(b"\n")}
    body = secret_body(NAMESPACE, REQUEST.ca_secret, "Opaque", by_hand)
    body["metadata"]["resourceVersion"] = cluster.bump()
    cluster.secrets[REQUEST.ca_secret] = body
    run(cluster, NOW + datetime.timedelta(days=7))

    said: list[str] = []
    cluster.now = NOW + datetime.timedelta(days=14)
    reconcile(object(), REQUEST, now=cluster.now, report=said.append)  # type: ignore[arg-type]

    assert not [line for line in said if "changed during this run" in line], said
    for hook in cluster.configuration["webhooks"]:
        bundle = x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]))
        assert bundle == [x509.load_pem_x509_certificate(data["ca.crt"])]
        assert x509.load_pem_x509_certificate(old_ca) not in bundle
