"""A private CA and the webhook's serving certificate.

EC P-256 keys: small, fast handshakes, and accepted by Go's TLS client (the
apiserver). The serving certificate names the Service every way a client may
dial it (``NAME``, ``NAME.NS``, ``NAME.NS.svc``, ``NAME.NS.svc.cluster.local``)
plus any extra DNS names and IPs (``127.0.0.1`` for a webhook registered by URL).

Files use the ``kubernetes.io/tls`` Secret key names, so one directory can be
turned into a Secret as is: ``ca.crt``, ``tls.crt``, ``tls.key`` (and
``ca.key``, which stays with whoever issues certificates). Each file is
written to a temporary name and renamed, so a server watching the directory
never reads half a file. An existing CA in the directory is reused unless
asked otherwise: rotating the serving certificate then needs no new caBundle.
"""

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

CA_VALIDITY = datetime.timedelta(days=3650)
SERVING_VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Backdating, so a node whose clock runs a little behind accepts a fresh cert."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class CertificateRequestError(ValueError):
    """Bad input (a name that is not a DNS label, an IP that is not an IP)."""


@dataclass(frozen=True)
class Issuer:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def service_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def ca_common_name(service: str, namespace: str) -> str:
    return f"headroom webhook CA ({namespace}/{service})"


def is_ca(certificate: x509.Certificate) -> bool:
    """Whether BasicConstraints marks ``certificate`` as a CA (absent: not one)."""
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    return constraints.value.ca


def parse_ips(values: Sequence[str]) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(value) for value in values]
    except ValueError as err:
        raise CertificateRequestError(f"--ip: {err}") from err


def new_ca(common_name: str, now: datetime.datetime) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issuer(certificate, key)


def serving_certificate(
    issuer: Issuer,
    dns_names: Sequence[str],
    ips: Sequence[IPAddress],
    now: datetime.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not dns_names:
        raise CertificateRequestError("a serving certificate needs at least one DNS name")
    for name in dns_names:
        _check_dns_name(name)
    key = ec.generate_private_key(ec.SECP256R1())
    # Go ignores the CN and matches SANs only; the CN is for people reading it.
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0][:64])])
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dict.fromkeys(dns_names)]
    sans += [x509.IPAddress(ip) for ip in dict.fromkeys(ips)]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + SERVING_VALIDITY, issuer.certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        )
        .sign(issuer.key, hashes.SHA256())
    )
    return certificate, key


def load_issuer(directory: Path) -> Issuer | None:
    """The CA in ``directory``, if both its files are there; raises if they are unreadable."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if not cert_path.exists() or not key_path.exists():
        return None
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except ValueError as err:
        raise CertificateRequestError(f"{directory}: unreadable CA ({err})") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateRequestError(f"{key_path}: expected an EC private key")
    return Issuer(certificate, key)


def generate(
    out: Path,
    *,
    service: str,
    namespace: str,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    new_ca_always: bool = False,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """Write the CA (unless one is there) and a fresh serving cert; return the latter."""
    now = now or datetime.datetime.now(datetime.UTC)
    addresses = parse_ips(ips)
    out.mkdir(parents=True, exist_ok=True)
    issuer = None if new_ca_always else load_issuer(out)
    if issuer is not None and issuer.certificate.not_valid_after_utc <= now + CLOCK_SKEW:
        # A serving certificate cannot outlive its CA; reusing this one would make
        # a certificate that expired before it was issued.
        expired = issuer.certificate.not_valid_after_utc
        raise CertificateRequestError(
            f"{out / CA_CERT} expires {expired:%Y-%m-%d %H:%M}Z; issue a new CA with --new-ca "
            "(and inject the new caBundle)"
        )
    if issuer is None:
        issuer = new_ca(ca_common_name(service, namespace), now)
        _write(out / CA_KEY, key_pem(issuer.key), private=True)
        _write(out / CA_CERT, cert_pem(issuer.certificate))
    names = service_names(service, namespace) + list(dns)
    certificate, key = serving_certificate(issuer, names, addresses, now)
    # Key first: a reader that sees the new cert with the old key fails to load
    # the pair and retries; the reverse order would give the same, but this
    # keeps the window as short as two renames.
    _write(out / TLS_KEY, key_pem(key), private=True)
    _write(out / TLS_CERT, cert_pem(certificate))
    return certificate


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _check_dns_name(name: str) -> None:
    labels = name.split(".")
    valid = 0 < len(name) <= 253 and all(
        0 < len(label) <= 63
        and label.replace("-", "").isalnum()
        and label.isascii()
        and label == label.lower()
        and not label.startswith("-")
        and not label.endswith("-")
        for label in labels
    )
    if not valid:
        raise CertificateRequestError(f"{name!r} is not a lowercase DNS name")


def cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    mode = 0o600 if private else 0o644
    # Created with its final mode: a key is never readable by others, not even briefly.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # O_CREAT's mode is masked by umask and ignored for an old file
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
