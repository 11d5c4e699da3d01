"""The serving certificate, reloaded from disk when a rotated Secret lands.

The listening socket keeps one front :class:`ssl.SSLContext` for its whole
life; its SNI callback, which OpenSSL runs during every handshake (with or
without a server name), hands the connection the newest context. So a new
certificate takes effect for the next handshake, while connections already
open -- and requests in flight on them -- carry on with the old one.

A new pair is committed only when it loads as a matching cert and key and the
files did not change while loading: a half-written rotation (new cert, old
key) is retried on the next tick, and the old certificate stays in service.
A pair that loads but is expired, not yet valid, or does not name the
Service's DNS names is refused the same way (logged once per change; one not
yet valid here -- issued on a node whose clock runs ahead -- is retried once it
is); the webhook goes not-ready only when the pair in service itself is invalid.
"""

import asyncio
import datetime
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path

from webhook.certificate import Certificate, load_pem_certificate

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
"""The key names of a ``kubernetes.io/tls`` Secret, as mounted in the pod."""

Signature = tuple[tuple[int, int, int], ...]
Clock = Callable[[], datetime.datetime]

EXPIRY_WARNING = datetime.timedelta(days=14)
"""How long before expiry the webhook logs a warning (the expiry gauge is always there)."""


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def certificate_problem(
    certificate: Certificate, expected_dns: tuple[str, ...], now: datetime.datetime
) -> str | None:
    """Why this serving certificate must not serve, or None when it may."""
    if now < certificate.not_valid_before_utc:
        return f"certificate not valid before {certificate.not_valid_before_utc.isoformat()}"
    if now >= certificate.not_valid_after_utc:
        return f"certificate expired at {certificate.not_valid_after_utc.isoformat()}"
    names = [n.lower() for n in certificate.dns_names]
    missing = [name for name in expected_dns if not _covered(name.lower(), names)]
    if missing:
        return f"certificate does not name {', '.join(missing)} (its DNS names: {names or 'none'})"
    return None


def _covered(name: str, sans: list[str]) -> bool:
    # A wildcard covers exactly one leftmost label, as Go's verifier has it.
    return any(
        san == name or (san.startswith("*.") and name.partition(".")[2] == san[2:]) for san in sans
    )


TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL"
"""TLS 1.2 suites: forward-secret AEAD only; Python's defaults still offer CBC
(Lucky13-style padding oracles). TLS 1.3 suites are all AEAD and unaffected."""


class CertificateError(RuntimeError):
    """The certificate directory holds no usable pair; the message says which file."""


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context with TLS >= 1.2 and only AEAD suites (see :data:`TLS12_CIPHERS`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as err:
        raise CertificateError(f"{err.filename or cert_file}: no such file") from err
    except (ssl.SSLError, OSError) as err:
        raise CertificateError(
            f"{cert_file} / {key_file}: not a matching PEM certificate and key ({err})"
        ) from err
    return context


class ReloadingContext:
    """``context`` for the server socket; :meth:`watch` polls ``cert_dir`` for changes."""

    def __init__(
        self,
        cert_dir: Path,
        *,
        on_reload: Callable[[bool, Certificate | None], None] | None = None,
        expected_dns: tuple[str, ...] = (),
        clock: Clock = _utc_now,
    ) -> None:
        self.cert_file = cert_dir / CERT_FILE
        self.key_file = cert_dir / KEY_FILE
        self._on_reload = on_reload
        self.expected_dns = expected_dns
        self._clock = clock
        self._refused: Signature | None = None
        self._refused_until: datetime.datetime | None = None
        """For a pair refused as not yet valid: when it becomes valid (then retried)."""
        self._warned_serial: int | None = None
        signature = self._signature()
        self.context = server_context(self.cert_file, self.key_file)
        self.context.sni_callback = self._select
        self._current = self.context
        self._signature_loaded = signature
        self.certificate = self._read_certificate()
        # No older pair to fall back on: serve it, but /readyz says why not ready.
        problem = self.problem()
        if problem:
            log.error("serving certificate %s is not valid: %s", self.cert_file, problem)

    def problem(self) -> str | None:
        """Why the pair in service must not serve now (None when it may); also
        logs, once per certificate, that it expires within EXPIRY_WARNING."""
        now = self._clock()
        problem = certificate_problem(self.certificate, self.expected_dns, now)
        expires = self.certificate.not_valid_after_utc
        if (
            problem is None
            and expires - now <= EXPIRY_WARNING
            and self._warned_serial != self.certificate.serial_number
        ):
            self._warned_serial = self.certificate.serial_number
            log.warning(
                "serving certificate expires at %s (in %s): rotate it",
                expires.isoformat(),
                expires - now,
            )
        return problem

    def _select(self, connection: ssl.SSLObject, server_name: str | None, _: object) -> None:
        # Runs inside the handshake: only swap the context, nothing that may fail.
        current = self._current
        if connection.context is not current:
            connection.context = current

    def reload_if_changed(self) -> bool:
        """Load the files if they changed since the last good load; True if a new pair is live."""
        before = self._signature()
        if before == self._signature_loaded:
            return False
        if before == self._refused and (
            self._refused_until is None or self._clock() < self._refused_until
        ):
            return False
        try:
            fresh = server_context(self.cert_file, self.key_file)
            certificate = self._read_certificate()
        except CertificateError as err:
            log.warning("certificate not reloaded (will retry): %s", err)
            self._notify(False, None)
            return False
        if self._signature() != before:
            return False  # changed while loading: the next tick loads the settled files
        problem = certificate_problem(certificate, self.expected_dns, self._clock())
        if problem is not None:
            # Complete but wrong: refused until the files change again -- or, for a
            # pair issued on a node whose clock runs ahead, until it becomes valid.
            self._refused = before
            early = self._clock() < certificate.not_valid_before_utc
            self._refused_until = certificate.not_valid_before_utc if early else None
            log.error("new certificate not loaded, the old one stays in service: %s", problem)
            self._notify(False, None)
            return False
        self._current = fresh
        self._signature_loaded = before
        self.certificate = certificate
        log.info(
            "serving certificate reloaded: serial %x, valid until %s",
            certificate.serial_number,
            certificate.not_valid_after_utc.isoformat(),
        )
        self._notify(True, certificate)
        return True

    async def watch(self, interval: float = 10.0) -> None:
        """Poll until cancelled. Kubernetes updates a mounted Secret within about a
        minute, so seconds of polling add nothing noticeable and cost nothing."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
            self.problem()

    def _notify(self, ok: bool, certificate: Certificate | None) -> None:
        if self._on_reload is not None:
            self._on_reload(ok, certificate)

    def _signature(self) -> Signature:
        # stat() follows the ..data symlink a Secret volume swaps atomically.
        parts = []
        for path in (self.cert_file, self.key_file):
            try:
                info = os.stat(path)
            except OSError:
                parts.append((0, 0, 0))
            else:
                parts.append((info.st_ino, info.st_mtime_ns, info.st_size))
        return tuple(parts)

    def _read_certificate(self) -> Certificate:
        try:
            return load_pem_certificate(self.cert_file.read_bytes())
        except (OSError, ValueError) as err:
            raise CertificateError(f"{self.cert_file}: not a PEM certificate ({err})") from err
