"""``headroom certs generate``: a CA and a serving certificate a Go-like client accepts."""

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from certs.generate import CertificateRequestError, generate
from cli.main import main

ARGS = ["certs", "generate", "--service", "headroom-webhook", "--namespace", "headroom-system"]


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def verify(directory: Path, name: x509.DNSName | x509.IPAddress) -> None:
    """Path validation as a TLS client does it (chain, SAN, usage, validity)."""
    verifier = (
        PolicyBuilder().store(Store([load(directory / "ca.crt")])).build_server_verifier(name)
    )
    verifier.verify(load(directory / "tls.crt"), [])


def test_the_cli_writes_the_four_files_with_private_keys_0600(tmp_path: Path) -> None:
    assert main([*ARGS, "--ip", "127.0.0.1", "--out", str(tmp_path)]) == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}


def test_the_serving_certificate_names_the_service_every_way(tmp_path: Path) -> None:
    argv = [*ARGS, "--ip", "127.0.0.1", "--ip", "::1", "--dns", "webhook.example.com"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    certificate = load(tmp_path / "tls.crt")
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "headroom-webhook",
        "headroom-webhook.headroom-system",
        "headroom-webhook.headroom-system.svc",
        "headroom-webhook.headroom-system.svc.cluster.local",
        "webhook.example.com",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert isinstance(certificate.public_key(), ec.EllipticCurvePublicKey)
    lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert datetime.timedelta(days=360) < lifetime < datetime.timedelta(days=370)
    for name in (
        x509.DNSName("headroom-webhook.headroom-system.svc"),
        x509.DNSName("headroom-webhook.headroom-system.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ):
        verify(tmp_path, name)


def test_a_name_not_in_the_certificate_does_not_verify(tmp_path: Path) -> None:
    generate(tmp_path, service="headroom-webhook", namespace="headroom-system")
    with pytest.raises(VerificationError):
        verify(tmp_path, x509.DNSName("other.headroom-system.svc"))


def test_regenerating_reuses_the_ca_unless_asked(tmp_path: Path) -> None:
    first = generate(tmp_path, service="w", namespace="n")
    ca = (tmp_path / "ca.crt").read_bytes()
    second = generate(tmp_path, service="w", namespace="n")
    assert second.serial_number != first.serial_number
    assert (tmp_path / "ca.crt").read_bytes() == ca
    verify(tmp_path, x509.DNSName("w.n.svc"))
    generate(tmp_path, service="w", namespace="n", new_ca_always=True)
    assert (tmp_path / "ca.crt").read_bytes() != ca
    verify(tmp_path, x509.DNSName("w.n.svc"))


def test_an_expired_ca_is_refused_not_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=4000)
    generate(tmp_path, service="w", namespace="n", now=long_ago)  # CA valid 3650 days
    ca = (tmp_path / "ca.crt").read_bytes()
    assert main([*ARGS, "--out", str(tmp_path)]) == 2
    assert "ca.crt expires" in caplog.text
    assert "--new-ca" in caplog.text
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert main([*ARGS, "--new-ca", "--out", str(tmp_path)]) == 0
    verify(tmp_path, x509.DNSName("headroom-webhook.headroom-system.svc"))


def test_the_ca_is_a_ca_and_the_leaf_is_not(tmp_path: Path) -> None:
    generate(tmp_path, service="w", namespace="n")
    ca = load(tmp_path / "ca.crt").extensions.get_extension_for_class(x509.BasicConstraints)
    leaf = load(tmp_path / "tls.crt").extensions.get_extension_for_class(x509.BasicConstraints)
    assert ca.value.ca is True
    assert leaf.value.ca is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--ip", "300.1.1.1"], "--ip"), (["--dns", "Not_A_Name"], "Not_A_Name")],
)
def test_bad_input_is_exit_code_2_naming_it(
    tmp_path: Path, extra: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert main([*ARGS, *extra, "--out", str(tmp_path)]) == 2
    assert message in caplog.text


def test_a_dns_name_is_checked() -> None:
    with pytest.raises(CertificateRequestError, match="DNS name"):
        generate(Path("/nonexistent-never-written"), service="UPPER", namespace="n")
