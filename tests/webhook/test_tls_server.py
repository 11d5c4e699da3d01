"""One real TLS server: certificates from ``headroom certs generate`` (the CLI,
in-process), the real app on 127.0.0.1, clients that verify against the CA --
and a certificate rotation while clients keep sending, with no failed request."""

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509

from cli.main import main
from tests.webhook.reviews import fed_cache, review_bytes
from webhook.admission import Admission
from webhook.metrics import WebhookMetrics
from webhook.server import create_app
from webhook.service import reviewer
from webhook.tls import ReloadingContext

SERVICE, NAMESPACE = "headroom-webhook", "headroom-system"
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"


def generate(out: Path) -> None:
    argv = ["certs", "generate", "--service", SERVICE, "--namespace", NAMESPACE]
    assert main([*argv, "--ip", "127.0.0.1", "--out", str(out)]) == 0


@dataclass
class Server:
    url: str
    tls: ReloadingContext
    ca_file: Path
    cert_dir: Path


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    generate(tmp_path)
    tls = ReloadingContext(tmp_path)
    cache = fed_cache()
    app = create_app(reviewer(cache, Admission(cache)), metrics=WebhookMetrics())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock, ssl_context=tls.context)
    await site.start()
    watcher = asyncio.create_task(tls.watch(0.02))
    port = sock.getsockname()[1]
    try:
        yield Server(f"https://127.0.0.1:{port}", tls, tmp_path / "ca.crt", tmp_path)
    finally:
        watcher.cancel()
        await runner.cleanup()


def client_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


class Connection:
    """HTTP/1.1 over one verified TLS connection, by hand, so that the peer's
    certificate can be read for every request (aiohttp hides its transport)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.version() in ("TLSv1.2", "TLSv1.3")
        der = ssl_object.getpeercert(binary_form=True)
        self.serial = x509.load_der_x509_certificate(der).serial_number

    @classmethod
    async def open(
        cls, url: str, context: ssl.SSLContext, server_hostname: str | None = None
    ) -> "Connection":
        host, port = url.removeprefix("https://").split(":")
        reader, writer = await asyncio.open_connection(
            host, int(port), ssl=context, server_hostname=server_hostname
        )
        return cls(reader, writer)

    async def mutate(self, body: bytes) -> tuple[int, dict[str, Any]]:
        head = (
            "POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line, *headers = (await self.reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        length = next(
            int(h.split(":")[1]) for h in headers if h.lower().startswith("content-length:")
        )
        answer: dict[str, Any] = json.loads(await self.reader.readexactly(length))
        return int(status_line.split()[1]), answer

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self.writer.wait_closed()


async def admit(connection: Connection) -> int:
    """One admission of a real Deployment pod; returns the HTTP status."""
    status, answer = await connection.mutate(review_bytes("deployment-pod-shared"))
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    return status


async def test_the_server_verifies_by_ip_and_by_service_name(server: Server) -> None:
    context = client_context(server.ca_file)
    by_ip = await Connection.open(server.url, context)
    assert await admit(by_ip) == 200
    assert by_ip.serial == server.tls.certificate.serial_number
    await by_ip.close()
    # As the apiserver dials a Service: SNI, and verification by DNS name.
    by_name = await Connection.open(server.url, context, server_hostname=SERVICE_DNS)
    assert await admit(by_name) == 200
    await by_name.close()


async def test_a_client_that_does_not_trust_the_ca_is_refused(server: Server) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await Connection.open(server.url, ssl.create_default_context())


@dataclass
class Tally:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    serials: list[int] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, serial: int) -> None:
        self.ok += 1
        self.serials.append(serial)
        self.progress.set()

    async def reach(self, condition: Callable[["Tally"], bool]) -> None:
        async with asyncio.timeout(20):
            while not condition(self):
                self.progress.clear()
                await self.progress.wait()


async def keep_sending(
    url: str, context: ssl.SSLContext, tally: Tally, stop: asyncio.Event, *, fresh: bool
) -> None:
    """Send until stopped; ``fresh`` opens a new TLS connection for every request,
    otherwise one connection is kept alive throughout."""
    connection: Connection | None = None
    while not stop.is_set():
        try:
            if connection is None:
                connection = await Connection.open(url, context)
            status = await admit(connection)
            serial = connection.serial
            if fresh:
                await connection.close()
                connection = None
        except Exception as err:  # every failure is the test's finding
            tally.failures.append(repr(err))
            connection = None
            continue
        if status != 200:
            tally.failures.append(f"HTTP {status}")
        tally.record(serial)
    if connection is not None:
        await connection.close()


async def test_a_rotation_mid_stream_drops_no_request(server: Server) -> None:
    context = client_context(server.ca_file)
    old_serial = server.tls.certificate.serial_number
    stop = asyncio.Event()
    fresh, kept = Tally(), Tally()
    clients = [
        asyncio.create_task(keep_sending(server.url, context, fresh, stop, fresh=True)),
        asyncio.create_task(keep_sending(server.url, context, kept, stop, fresh=False)),
    ]
    await fresh.reach(lambda t: t.ok >= 20)
    await kept.reach(lambda t: t.ok >= 20)
    # Same CA (reused from --out), new serving certificate.
    generate(server.cert_dir)
    new_serial = x509.load_pem_x509_certificate(
        (server.cert_dir / "tls.crt").read_bytes()
    ).serial_number
    assert new_serial != old_serial
    await fresh.reach(lambda t: new_serial in t.serials)
    seen = fresh.ok
    await fresh.reach(lambda t: t.ok >= seen + 20)
    stop.set()
    await asyncio.gather(*clients)
    assert fresh.failures == []
    assert kept.failures == []
    assert fresh.serials[0] == old_serial
    assert fresh.serials[-1] == new_serial
    # Requests on the kept-alive connection went on through the rotation.
    assert kept.ok > 20
    assert server.tls.certificate.serial_number == new_serial


def tls12_client(ca_file: Path, ciphers: str) -> ssl.SSLContext:
    context = client_context(ca_file)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    return context


CBC_SUITES = (
    "ECDHE-ECDSA-AES128-SHA256:ECDHE-RSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:"
    "ECDHE-RSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA:AES128-SHA256:AES128-SHA"
)


async def test_tls12_offers_no_cbc_suite(server: Server) -> None:
    # The server refuses the handshake (no shared cipher); asyncio reports
    # either the alert or the reset that follows it.
    client = tls12_client(server.ca_file, CBC_SUITES)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await Connection.open(server.url, client)


@pytest.mark.parametrize("suites", ["ECDHE+AESGCM", "ECDHE+CHACHA20"])
async def test_tls12_speaks_aead_suites(server: Server, suites: str) -> None:
    connection = await Connection.open(server.url, tls12_client(server.ca_file, suites))
    assert await admit(connection) == 200
    await connection.close()
