"""ReloadingContext on its own: loads, refuses bad pairs, reloads on change."""

import datetime
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


SERVICE_DNS = ("headroom-webhook.headroom.svc",)


def test_an_expired_rotation_keeps_the_old_pair_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_certs(tmp_path)
    reloads: list[bool] = []
    tls = ReloadingContext(
        tmp_path, expected_dns=SERVICE_DNS, on_reload=lambda ok, _: reloads.append(ok)
    )
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=800)
    generate(tmp_path, service="headroom-webhook", namespace="headroom", now=long_ago)
    assert not tls.reload_if_changed()
    assert not tls.reload_if_changed()  # said once per change, not once per tick
    assert tls.certificate.serial_number == first.serial_number
    assert tls.problem() is None
    assert reloads == [False]
    refusals = [r for r in caplog.records if "old one stays in service" in r.getMessage()]
    assert len(refusals) == 1
    assert "expired at" in refusals[0].getMessage()


def test_a_rotation_for_another_service_keeps_the_old_pair(tmp_path: Path) -> None:
    first = make_certs(tmp_path)
    tls = ReloadingContext(tmp_path, expected_dns=SERVICE_DNS)
    generate(tmp_path, service="someone-else", namespace="headroom")
    assert not tls.reload_if_changed()
    assert tls.certificate.serial_number == first.serial_number
    # A good pair after the bad one is loaded.
    second = make_certs(tmp_path)
    assert tls.reload_if_changed()
    assert tls.certificate.serial_number == second.serial_number


def test_not_ready_only_when_the_pair_in_service_is_invalid(tmp_path: Path) -> None:
    certificate = make_certs(tmp_path)
    later = certificate.not_valid_after_utc + datetime.timedelta(seconds=1)
    now = [datetime.datetime.now(datetime.UTC)]
    tls = ReloadingContext(tmp_path, expected_dns=SERVICE_DNS, clock=lambda: now[0])
    assert tls.problem() is None
    now[0] = later
    problem = tls.problem()
    assert problem is not None
    assert "expired at" in problem


def test_a_pair_that_names_other_services_is_not_ready_from_the_start(tmp_path: Path) -> None:
    make_certs(tmp_path)
    tls = ReloadingContext(tmp_path, expected_dns=("headroom-webhook.elsewhere.svc",))
    problem = tls.problem()
    assert problem is not None
    assert "headroom-webhook.elsewhere.svc" in problem


def test_two_weeks_before_expiry_a_warning_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certificate = make_certs(tmp_path)
    soon = certificate.not_valid_after_utc - datetime.timedelta(days=13)
    tls = ReloadingContext(tmp_path, expected_dns=SERVICE_DNS, clock=lambda: soon)
    assert tls.problem() is None
    assert tls.problem() is None
    warnings = [r for r in caplog.records if "rotate it" in r.getMessage()]
    assert len(warnings) == 1


def test_a_rotation_not_yet_valid_here_is_loaded_once_the_clock_reaches_it(
    tmp_path: Path,
) -> None:
    # The Job ran on a node whose clock is 10 minutes ahead: the new certificate's
    # notBefore (its now - 5 min) lies 5 minutes in this node's future. Refusing it
    # is right; refusing it until the files change again (a year: the CronJob keeps
    # a valid certificate) leaves the old one in service until it expires.
    first = make_certs(tmp_path)
    now = [datetime.datetime.now(datetime.UTC)]
    tls = ReloadingContext(tmp_path, expected_dns=SERVICE_DNS, clock=lambda: now[0])
    ahead = now[0] + datetime.timedelta(minutes=10)
    second = generate(tmp_path, service="headroom-webhook", namespace="headroom", now=ahead)
    assert not tls.reload_if_changed()
    assert tls.certificate.serial_number == first.serial_number
    now[0] += datetime.timedelta(minutes=6)
    assert tls.reload_if_changed()
    assert tls.certificate.serial_number == second.serial_number
