"""webhook.certificate reads what the ``cryptography`` package reads, on certificates that
package builds: serial, validity (UTCTime and GeneralizedTime), SAN DNS names."""

import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from certs.generate import generate
from webhook.certificate import Certificate, load_der_certificate, load_pem_certificate

EC_KEY = ec.generate_private_key(ec.SECP256R1())
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
UTC = datetime.UTC


def build(
    *,
    serial: int = 12345,
    start: datetime.datetime = datetime.datetime(2026, 1, 1, tzinfo=UTC),
    end: datetime.datetime = datetime.datetime(2027, 1, 1, tzinfo=UTC),
    names: list[x509.GeneralName] | None = None,
    critical: bool = False,
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey = EC_KEY,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "headroom-webhook")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if names is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=critical)
    return builder.sign(key, hashes.SHA256())


def pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def same(ours: Certificate, theirs: x509.Certificate) -> None:
    assert ours.serial_number == theirs.serial_number
    assert ours.not_valid_before_utc == theirs.not_valid_before_utc
    assert ours.not_valid_after_utc == theirs.not_valid_after_utc
    try:
        sans = theirs.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = sans.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    assert list(ours.dns_names) == names


def test_the_certificates_headroom_generates(tmp_path: Path) -> None:
    generate(tmp_path, service="headroom-webhook", namespace="headroom", ips=["127.0.0.1"])
    for name in ("tls.crt", "ca.crt"):
        data = (tmp_path / name).read_bytes()
        same(load_pem_certificate(data), x509.load_pem_x509_certificate(data))
    assert (
        "headroom-webhook.headroom.svc"
        in load_pem_certificate((tmp_path / "tls.crt").read_bytes()).dns_names
    )


def test_rsa_a_critical_san_of_every_kind_and_dates_past_2049() -> None:
    names: list[x509.GeneralName] = [
        x509.DNSName("*.example.com"),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.RFC822Name("ops@example.com"),
        x509.UniformResourceIdentifier("spiffe://cluster/webhook"),
        x509.DNSName("webhook.headroom.svc"),
    ]
    end = datetime.datetime(2051, 6, 30, 23, 59, 59, tzinfo=UTC)  # GeneralizedTime
    certificate = build(names=names, critical=True, key=RSA_KEY, serial=2**100 + 7, end=end)
    ours = load_pem_certificate(pem(certificate))
    same(ours, certificate)
    assert ours.dns_names == ("*.example.com", "webhook.headroom.svc")


def test_no_san_and_the_first_of_a_chain() -> None:
    leaf, issuer = build(serial=1), build(serial=2, names=[x509.DNSName("ca")])
    ours = load_pem_certificate(pem(leaf) + pem(issuer))
    same(ours, leaf)
    assert ours.dns_names == ()


@settings(max_examples=40, deadline=None)
@given(
    serial=st.integers(min_value=1, max_value=2**159 - 1),
    start=st.datetimes(
        min_value=datetime.datetime(1990, 1, 1), max_value=datetime.datetime(2060, 1, 1)
    ),
    days=st.integers(min_value=1, max_value=40 * 365),
    labels=st.lists(
        st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True), max_size=6
    ),
)
def test_any_serial_validity_and_names(
    serial: int, start: datetime.datetime, days: int, labels: list[str]
) -> None:
    start = start.replace(microsecond=0, tzinfo=UTC)
    names: list[x509.GeneralName] = [x509.DNSName(f"{label}.svc") for label in labels]
    certificate = build(
        serial=serial, start=start, end=start + datetime.timedelta(days=days), names=names
    )
    same(load_der_certificate(certificate.public_bytes(serialization.Encoding.DER)), certificate)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not a certificate",
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    ],
)
def test_what_is_not_a_certificate_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"."):
        load_pem_certificate(data)


def test_a_truncated_certificate_is_a_value_error() -> None:
    der = build(names=[x509.DNSName("a")]).public_bytes(serialization.Encoding.DER)
    for cut in range(0, len(der) - 1, 7):
        with pytest.raises(ValueError, match=r"."):
            load_der_certificate(der[:cut])
