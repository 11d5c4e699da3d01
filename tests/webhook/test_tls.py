"""ReloadingContext on its own: loads, refuses bad pairs, reloads on change."""

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from certs.generate import generate
from webhook.tls import CertificateError, ReloadingContext


def make_certs(directory: Path) -> x509.Certificate:
    return generate(directory, service="headroom-webhook", namespace="headroom", ips=["127.0.0.1"])


def test_the_context_refuses_anything_below_tls_1_2(tmp_path: Path) -> None:
    make_certs(tmp_path)
    tls = ReloadingContext(tmp_path)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_missing_directory_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"tls\.crt"):
        ReloadingContext(tmp_path / "nowhere")


def test_a_key_that_does_not_match_is_refused(tmp_path: Path) -> None:
    make_certs(tmp_path / "a")
    make_certs(tmp_path / "b")
    (tmp_path / "a" / "tls.key").write_bytes((tmp_path / "b" / "tls.key").read_bytes())
    with pytest.raises(CertificateError, match="not a matching"):
        ReloadingContext(tmp_path / "a")


def test_nothing_changes_until_the_files_do(tmp_path: Path) -> None:
    first = make_certs(tmp_path)
    tls = ReloadingContext(tmp_path)
    assert not tls.reload_if_changed()
    assert tls.certificate.serial_number == first.serial_number


def test_a_rotated_pair_is_loaded_and_reported(tmp_path: Path) -> None:
    make_certs(tmp_path)
    reloads: list[tuple[bool, int | None]] = []
    tls = ReloadingContext(
        tmp_path,
        on_reload=lambda ok, cert: reloads.append((ok, cert.serial_number if cert else None)),
    )
    second = make_certs(tmp_path)
    assert tls.reload_if_changed()
    assert tls.certificate.serial_number == second.serial_number
    assert reloads == [(True, second.serial_number)]


def test_a_half_written_rotation_keeps_the_old_pair_and_retries(tmp_path: Path) -> None:
    first = make_certs(tmp_path)
    reloads: list[bool] = []
    tls = ReloadingContext(tmp_path, on_reload=lambda ok, _: reloads.append(ok))
    elsewhere = tmp_path / "next"
    second = make_certs(elsewhere)
    # The new certificate lands before its key: the pair does not match.
    (tmp_path / "tls.crt").write_bytes((elsewhere / "tls.crt").read_bytes())
    assert not tls.reload_if_changed()
    assert tls.certificate.serial_number == first.serial_number
    (tmp_path / "tls.key").write_bytes((elsewhere / "tls.key").read_bytes())
    assert tls.reload_if_changed()
    assert tls.certificate.serial_number == second.serial_number
    assert reloads == [False, True]
