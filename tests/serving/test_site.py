"""serving.site over plain HTTP, as the agent's probe and metrics port and the
extender's metrics port serve: a header sent slowly is cut off at its deadline,
connections beyond the cap or beyond one client's share are closed at once while
the open ones answer, and every slot is given back. One real server on 127.0.0.1;
a second client address from the loopback's 127.0.0.2."""

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from serving.site import CLOSE_REASONS, READ_SIZE, LimitedSite, PortLimits, serve_plain

FAST = PortLimits(
    max_connections=4,
    per_peer=3,
    keepalive_timeout=5.0,
    header_timeout=0.5,
    body_timeout=0.5,
    write_timeout=0.5,
)
"""Deadlines short enough for a unit test; the defaults are in README."""


@dataclass
class Port:
    site: LimitedSite
    registry: CollectorRegistry
    gate: asyncio.Event
    """What ``GET /slow`` waits for before it answers."""
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    def closed(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "headroom_test_connections_closed_total", {"reason": reason}
        )
        assert value is not None
        return value

    async def connect(
        self, source: str = "127.0.0.1"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.site.port, local_addr=(source, 0)
        )
        self.clients.append(writer)
        return reader, writer


PortFactory = Callable[[PortLimits], Awaitable[Port]]


@pytest.fixture
async def serve() -> AsyncIterator[PortFactory]:
    runners: list[web.AppRunner] = []
    ports: list[Port] = []

    async def start(limits: PortLimits) -> Port:
        gate = asyncio.Event()

        async def ok(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def slow(_: web.Request) -> web.Response:
            await gate.wait()
            return web.Response(text="slow")

        app = web.Application()
        app.router.add_get("/healthz", ok)
        app.router.add_get("/slow", slow)
        registry = CollectorRegistry()
        runner, site = await serve_plain(
            app, "127.0.0.1", 0, component="test", registry=registry, limits=limits
        )
        runners.append(runner)
        ports.append(Port(site, registry, gate))
        return ports[-1]

    yield start
    for port in ports:
        for writer in port.clients:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    for runner in runners:
        await runner.cleanup()


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One GET on a kept-alive connection: the status line of its answer."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
    await writer.drain()
    return await asyncio.wait_for(reader.readline(), 2)


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(150):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met within 3s")


async def test_a_header_sent_slowly_is_cut_off_at_its_deadline(serve: PortFactory) -> None:
    port = await serve(FAST)
    reader, writer = await port.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
    await writer.drain()
    # aiohttp alone waits for the rest as long as the keep-alive (5 s here) and longer:
    # a partial header does not stop its timer.
    assert await closed_by_server(reader, within=FAST.header_timeout + 1.5)
    assert port.closed("header-timeout") == 1
    await until(lambda: port.site.open_connections == 0)

    reader, writer = await port.connect()
    assert await get(reader, writer) == b"HTTP/1.1 200 OK\r\n"
    writer.close()


async def test_connections_beyond_the_cap_are_closed_at_once(
    serve: PortFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = await serve(PortLimits(**{**FAST.__dict__, "per_peer": 100}))
    held = [await port.connect() for _ in range(FAST.max_connections)]
    await until(lambda: port.site.open_connections == FAST.max_connections)
    with caplog.at_level(logging.WARNING, logger="serving.site"):
        reader, _ = await port.connect()
        assert await closed_by_server(reader, within=1.0)
    assert port.closed("over-cap") == 1
    # The ports' caps are fixed: the log points at what keeps other pods off them.
    assert "networkpolicy component" in caplog.text
    # The open ones carry on.
    assert await get(*held[0]) == b"HTTP/1.1 200 OK\r\n"
    for _, writer in held:
        writer.close()
    await until(lambda: port.site.open_connections == 0)
    assert await get(*await port.connect()) == b"HTTP/1.1 200 OK\r\n"


async def test_one_client_address_holds_at_most_its_share(serve: PortFactory) -> None:
    port = await serve(FAST)
    flood = [await port.connect("127.0.0.1") for _ in range(FAST.per_peer)]
    reader, _ = await port.connect("127.0.0.1")
    assert await closed_by_server(reader, within=1.0)
    assert port.closed("peer-cap") == 1
    # Another client (the kubelet's probe, Prometheus) still gets in, under the cap.
    other = await port.connect("127.0.0.2")
    assert await get(*other) == b"HTTP/1.1 200 OK\r\n"
    assert port.closed("over-cap") == 0

    # Closed, the flood's slots are the address's again, and the refused one held none.
    for _, writer in flood:
        writer.close()
    await until(lambda: port.site.open_connections == 1)
    again = [await port.connect("127.0.0.1") for _ in range(FAST.per_peer)]
    for connection in again:
        assert await get(*connection) == b"HTTP/1.1 200 OK\r\n"
    assert port.closed("peer-cap") == 1


async def test_every_close_reason_is_exported_from_the_start(serve: PortFactory) -> None:
    port = await serve(FAST)
    # increase() reads a series that first appears at 1 as no increase.
    assert {reason: port.closed(reason) for reason in CLOSE_REASONS} == dict.fromkeys(
        CLOSE_REASONS, 0.0
    )
    # The logs name the port bound, not the 0 asked for.
    assert port.site.name == f"http://127.0.0.1:{port.site.port}" != "http://127.0.0.1:0"
    gauge = port.registry.get_sample_value("headroom_test_open_connections")
    assert gauge == 0.0
    # Plain HTTP: no TLS handshake is ever counted, and the help says none.
    helps = {metric.name: metric.documentation for metric in port.registry.collect()}
    assert "TLS" not in helps["headroom_test_open_connections"]


def test_the_defaults_leave_room_for_probes_and_scrapes() -> None:
    limits = PortLimits()
    # A kubelet's two probes and two Prometheus replicas, each a connection at a time,
    # fit one client's share many times over; one pod cannot take every slot.
    assert 4 <= limits.per_peer < limits.max_connections
    assert limits.header_timeout <= 5.0


async def test_a_request_sending_more_header_than_probes_do_is_cut_off_at_once(
    serve: PortFactory,
) -> None:
    # aiohttp alone takes 128 header fields of 8 KiB: 64 connections, eight from
    # each of eight pods, each sending that much and never the last CRLF, held
    # ~2 MiB apiece (+126 MiB, measured), past the agent's 192Mi over its ~94 MiB.
    port = await serve(PortLimits(**{**FAST.__dict__, "header_timeout": 5.0}))
    reader, writer = await port.connect()
    field_ = b"X-Fat: " + b"a" * 8000 + b"\r\n"
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n" + field_ * 3)
    await writer.drain()
    # Closed at once, not at the header deadline: aiohttp never held it.
    assert await closed_by_server(reader, within=1.0)
    assert port.closed("header-too-large") == 1
    await until(lambda: port.site.open_connections == 0)

    # What the kubelet's probe sends gets in, on a kept-alive connection too.
    reader, writer = await port.connect()
    probe = (
        b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9402\r\nUser-Agent: kube-probe/1.34\r\n"
        b"Accept: */*\r\n\r\n"
    )
    for _ in range(200):  # more than max_header_bytes in all, a request at a time
        writer.write(probe)
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
        while await asyncio.wait_for(reader.readline(), 2) != b"\r\n":
            pass
        await asyncio.wait_for(reader.readexactly(2), 2)  # "ok"
    # Pipelined, many at once, as long as they fit.
    writer.write(probe * 20)
    await writer.drain()
    for _ in range(20):
        assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
        while await asyncio.wait_for(reader.readline(), 2) != b"\r\n":
            pass
        await asyncio.wait_for(reader.readexactly(2), 2)
    assert port.closed("header-too-large") == 1

    # The worst a flood holds: 64 connections' header sections, and two reads each.
    limits = PortLimits()
    assert limits.max_connections * (limits.max_header_bytes + 2 * READ_SIZE) <= 4 * 2**20


async def test_headers_pipelined_behind_a_request_are_counted_soon(serve: PortFactory) -> None:
    # Bytes behind a request's blank line, in its read and in the read before its
    # handler starts, are not counted (they may be its body). A socket read took
    # 256 KiB: a second request with 160 KiB of headers pipelined behind a first was
    # answered on a port of 16 KiB, and 64 such connections held +20 MiB (measured),
    # for the 30 s keep-alive, not 64 times 16 KiB.
    port = await serve(PortLimits(**{**FAST.__dict__, "header_timeout": 5.0}))
    reader, writer = await port.connect()
    fat = b"X-Fat: " + b"a" * 8000 + b"\r\n"
    writer.write(
        b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"
        + b"GET /healthz HTTP/1.1\r\nHost: agent\r\n"
        + fat * 20
    )
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
    await until(lambda: port.closed("header-too-large") == 1)
    assert await closed_by_server(reader, within=1.0)


async def test_a_body_counts_against_its_own_deadline_not_the_header_bytes(
    serve: PortFactory,
) -> None:
    port = await serve(PortLimits(**{**FAST.__dict__, "header_timeout": 5.0}))
    body = b"b" * (3 * FAST.max_header_bytes)
    # In the same write as its headers, as kube-apiserver sends an AdmissionReview ...
    reader, writer = await port.connect()
    head = b"GET /healthz HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\n" % len(body)
    writer.write(head + b"\r\n" + body)
    assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
    # ... or with the blank line that ends the headers split over two reads.
    reader, writer = await port.connect()
    writer.write(head + b"\r")
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.write(b"\n" + body)
    assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
    assert port.closed("header-too-large") == 0

    # Headers alone past the limit, the blank line split the same way, still count.
    reader, writer = await port.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nX-Fat: " + b"a" * FAST.max_header_bytes + b"\r")
    await writer.drain()
    assert await closed_by_server(reader, within=1.0)
    assert port.closed("header-too-large") == 1


SHARE = PortLimits(
    **{**FAST.__dict__, "per_peer": 2, "header_timeout": 10.0, "keepalive_timeout": 10.0}
)
"""Four slots, two per client: two clients fill the port, each within its share,
for as long as the test takes."""


async def probe(port: Port) -> bytes:
    """The kubelet's way: a new connection, one request, closed after."""
    reader, writer = await port.connect("127.0.0.1")
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.readline(), 2)
    except ConnectionResetError:
        return b"reset"


async def test_clients_holding_every_slot_cannot_shut_out_the_probe(serve: PortFactory) -> None:
    port = await serve(SHARE)
    # Two pods, each within its share, hold all four slots: kept alive after a GET,
    # or sending a header slowly.
    idle = [await port.connect("127.0.0.2") for _ in range(2)]
    for connection in idle:
        assert await get(*connection) == b"HTTP/1.1 200 OK\r\n"
    for _ in range(2):
        _, writer = await port.connect("127.0.0.3")
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    await until(lambda: port.site.open_connections == SHARE.max_connections)

    # The kubelet probes three times (a failure threshold's worth), the pods taking
    # back every slot in between: each probe gets in, displacing a connection of a
    # client holding more.
    for attempt in range(1, 4):
        assert await probe(port) == b"HTTP/1.1 200 OK\r\n"
        assert port.closed("displaced") == attempt
        await until(lambda: port.site.open_connections == SHARE.max_connections - 1)
        short = min(("127.0.0.2", "127.0.0.3"), key=lambda a: port.site._peers.get(a, 0))
        await get(*await port.connect(short))
        assert port.site.open_connections == SHARE.max_connections
    assert port.closed("over-cap") == 0


async def test_a_request_being_answered_is_never_displaced(serve: PortFactory) -> None:
    port = await serve(SHARE)
    answering = []
    for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"):
        reader, writer = await port.connect(source)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: agent\r\n\r\n")
        answering.append(reader)
    await until(lambda: port.site.open_connections == SHARE.max_connections)
    await asyncio.sleep(0.1)  # every request's headers in, its handler waiting

    # Nothing to displace: the newcomer is refused, and every request is answered.
    assert await probe(port) in (b"", b"reset")
    assert port.closed("over-cap") == 1
    assert port.closed("displaced") == 0
    port.gate.set()
    for reader in answering:
        assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"


async def test_a_client_holding_as_many_as_the_others_displaces_none(serve: PortFactory) -> None:
    port = await serve(SHARE)
    for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"):
        await get(*await port.connect(source))
    await until(lambda: port.site.open_connections == SHARE.max_connections)
    # 127.0.0.3 already holds as many as anyone: it gains nothing at another's cost.
    reader, _ = await port.connect("127.0.0.3")
    assert await closed_by_server(reader, within=1.0)
    assert port.closed("displaced") == 0
    assert port.closed("peer-cap") == 1


async def test_the_rest_of_a_body_read_after_its_answer_is_no_header(serve: PortFactory) -> None:
    # An answer given before the body was read (as the webhook's busy and too-large
    # answers are): aiohttp reads the rest and drops it. It was counted as the next
    # request's headers -- past max_header_bytes the connection was aborted -- and its
    # first byte started a header deadline that then closed the idle connection.
    port = await serve(FAST)
    reader, writer = await port.connect()
    body = b"b" * (2 * FAST.max_header_bytes)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\n\r\n" % len(body))
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
    while await asyncio.wait_for(reader.readline(), 2) != b"\r\n":
        pass
    await asyncio.wait_for(reader.readexactly(2), 2)
    writer.write(body)
    await writer.drain()
    await asyncio.sleep(FAST.header_timeout + 0.3)  # kept alive, idle
    assert await get(reader, writer) == b"HTTP/1.1 200 OK\r\n"
    assert port.closed("header-too-large") == port.closed("header-timeout") == 0

    # A rest that never comes is still held to the body deadline.
    reader, writer = await port.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nContent-Length: 10\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 2) == b"HTTP/1.1 200 OK\r\n"
    while await asyncio.wait_for(reader.readline(), 2) != b"\r\n":
        pass
    await asyncio.wait_for(reader.readexactly(2), 2)
    assert await closed_by_server(reader, within=FAST.body_timeout + 1.0)
    assert port.closed("body-timeout") == 1


async def test_displacements_are_counted_each_and_logged_seldom(
    serve: PortFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # More client addresses than slots, each holding one: every newcomer displaces
    # the oldest. 70 pods doing so displaced 8,000 connections a second (measured),
    # and each was a line of the agent's log at its default INFO.
    port = await serve(SHARE)
    held = [await port.connect(f"127.0.0.{2 + i}") for i in range(SHARE.max_connections)]
    await until(lambda: port.site.open_connections == SHARE.max_connections)
    with caplog.at_level(logging.INFO, logger="serving.site"):
        for i in range(1, 21):
            held.append(await port.connect(f"127.0.1.{i}"))
            await until(functools.partial(lambda count: port.closed("displaced") == count, i))
    assert len([r for r in caplog.records if "displaced" in r.getMessage()]) <= 1
