"""The cert-manager component's CA: renewing it must not change the key old leaves chain to.

cert-manager's CA injector sets the caBundle from the serving Secret's ``ca.crt``,
which changes at the serving certificate's next renewal after the CA renewed;
the webhook serves the old leaf until the kubelet updates its mount. Only a CA
renewed with the same key (and subject) trusts both the old leaf and the new:
``rotationPolicy: Never`` (cert-manager >= 1.18 defaults to Always, a new key).
"""

import datetime
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509 import verification

from certs.generate import Issuer, new_ca, service_names, serving_certificate

COMPONENT = Path(__file__).resolve().parents[2] / "manifests/components/cert-manager"
NOW = datetime.datetime(2030, 6, 1, tzinfo=datetime.UTC)
NAMES = service_names("headroom-webhook", "headroom-system")


def _renewed(ca: Issuer, now: datetime.datetime, *, same_key: bool) -> Issuer:
    """The CA re-issued as cert-manager's self-signed issuer does: same subject, new serial."""
    key = ca.key if same_key else new_ca("unused", now).key
    certificate = (
        x509.CertificateBuilder()
        .subject_name(ca.certificate.subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            ca.certificate.extensions.get_extension_for_class(x509.KeyUsage).value, critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issuer(certificate, key)


def _trusts(bundle: x509.Certificate, leaf: x509.Certificate, at: datetime.datetime) -> bool:
    verifier = (
        verification.PolicyBuilder()
        .store(verification.Store([bundle]))
        .time(at)
        .build_server_verifier(x509.DNSName(NAMES[2]))
    )
    try:
        verifier.verify(leaf, [])
    except verification.VerificationError:
        return False
    return True


@pytest.mark.parametrize("same_key", [True, False])
def test_a_renewed_ca_trusts_the_leaf_of_the_old_one_only_with_the_same_key(
    same_key: bool,
) -> None:
    ca = new_ca("headroom-webhook-ca", NOW)
    later = NOW + datetime.timedelta(days=2435)  # cert-manager renews at 2/3 of its duration
    leaf, _ = serving_certificate(ca, NAMES, [], later - datetime.timedelta(days=30))
    renewed = _renewed(ca, later, same_key=same_key)
    new_leaf, _ = serving_certificate(renewed, NAMES, [], later)

    # Until the kubelet updates the mount, the webhook serves the old leaf under the
    # new bundle; a pod started meanwhile serves the new leaf under the old bundle.
    assert _trusts(renewed.certificate, leaf, later) is same_key
    assert _trusts(ca.certificate, new_leaf, later) is same_key


def test_the_ca_certificate_keeps_its_key_on_renewal() -> None:
    documents = yaml.safe_load_all((COMPONENT / "certificates.yaml").read_text())
    (ca,) = [d for d in documents if d["kind"] == "Certificate" and d["spec"].get("isCA")]
    assert ca["spec"]["privateKey"].get("rotationPolicy") == "Never"
