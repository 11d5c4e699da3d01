"""Connection limits for an aiohttp AppRunner listening to clients it does not trust.

:class:`LimitedSite` replaces ``web.TCPSite``, over TLS (the webhook, with
:class:`webhook.limits.Limits`) or plain HTTP (the agent's probe and metrics
port and the extender's metrics port, on the pod network: :class:`PortLimits`):

- it counts connections at TCP accept, before any TLS work: beyond
  ``max_connections`` a new one is aborted at once, the open ones carry on;
  with ``per_peer``, a client address holding that many has its next one
  aborted too, and a full site makes room for a client holding fewer than
  another by aborting that other's oldest connection not being answered (its
  request half-sent, or idle between requests), as nginx drops idle keep-alive
  connections when it runs short: so fewer pods than there are slots, holding
  every slot, each within its share, cannot shut out the kubelet's probe or
  Prometheus (more pods than slots, each holding one, can: every connection,
  the probe's too, is then someone's to displace);
- over TLS, it runs the TLS layer itself (asyncio's SSLProtocol) with a 16 KiB read
  buffer instead of 256 KiB, a handshake deadline, and a 2 s wait for the
  peer's close_notify instead of 30 s;
- it gives a request ``header_timeout`` from its first byte (from the end of
  the handshake, for a connection's first request; from the answer before
  it, for one begun while that was worked out, as Go's server does) to its
  complete headers,
  and ``body_timeout`` from there to its complete body, and aborts the
  connection past either (Go's ReadHeaderTimeout and ReadTimeout; the rest of
  a body its answer did not wait for, which aiohttp reads and drops, counts
  against the body deadline too); it aborts a connection whose request's
  headers run past ``max_header_bytes`` before their blank line, before
  aiohttp buffers any of it (Go's
  MaxHeaderBytes; bytes a client pipelines behind a request's blank line, in
  that read or the one before its handler starts, are counted from the next
  read on, and a read is 16 KiB at most, so a connection holds at most 32 KiB
  more); and it
  aborts a connection whose answer waits ``write_timeout`` for the client to
  read it (its write buffer full: aiohttp waits for it to drain for ever). aiohttp
  3.14 has no such deadline: its keep-alive timer runs only while no request
  is being read, and a partial header does not stop it -- a header sent a byte
  a second lived for the whole keep-alive. So a small protocol between the TLS
  layer (or the socket) and aiohttp's RequestHandler keeps the deadline, and the server's
  request handler, wrapped, tells it when the headers are in and when the
  answer is out;
- ``keepalive_timeout`` itself is aiohttp's (``AppRunner(keepalive_timeout=)``).
"""

import asyncio
import logging
import ssl
import time
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import StreamReader, web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)


class Limits(Protocol):
    """The numbers :class:`LimitedSite` enforces (``keepalive_timeout`` is the runner's)."""

    @property
    def max_connections(self) -> int: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def body_timeout(self) -> float: ...
    @property
    def handshake_timeout(self) -> float: ...
    @property
    def write_timeout(self) -> float: ...
    @property
    def over_cap_remedy(self) -> str:
        """What an operator does about connections refused over the cap: the log says it."""
        ...


@dataclass(frozen=True)
class PortLimits:
    """For a plain-HTTP port of probes and ``/metrics`` that any pod can reach
    (without the networkpolicy component): a kubelet probing every few seconds,
    a Prometheus or two scraping, each a request at a time. aiohttp alone held
    8,000 connections each sending a header slowly, 100 MiB of the agent's
    192Mi, for as long as they liked (measured); capped, a flood costs at most
    ``max_connections`` times ``max_header_bytes``, and one client address holds
    at most ``per_peer`` of them."""

    max_connections: int = 64
    per_peer: int = 8
    max_header_bytes: int = 16 * 1024
    """A request's header bytes, up to the blank line that ends them (a body is
    held to body_timeout and aiohttp's read buffer instead). aiohttp alone
    takes 128 header fields of 8 KiB: 64 connections (eight pods, eight each)
    sending that much, never the last CRLF, held ~2 MiB apiece, +126 MiB
    (measured), past the agent's 192Mi over the ~94 MiB it holds at rest. The
    kubelet's probe sends ~150 bytes, a Prometheus scrape ~500."""
    keepalive_timeout: float = 30.0
    header_timeout: float = 5.0
    body_timeout: float = 5.0
    handshake_timeout: float = 5.0
    """Unused: the port is plain HTTP."""
    write_timeout: float = 5.0
    over_cap_remedy: str = (
        "a pod flooding the port? the networkpolicy component keeps other pods off it"
    )
    """The ports' caps are fixed; what fills them is other pods, not load."""


TLS_READ_BUFFER = 16 * 1024
"""asyncio's SSLProtocol reads into a 256 KiB buffer per connection; a TLS
record carries at most 16 KiB, so a bigger buffer only saves read calls."""
READ_SIZE = 16 * 1024
"""The most :class:`_Guard` reads at once, over TLS or not (asyncio's socket reads
take 256 KiB): bytes pipelined behind a request's headers are counted from the next
read on, so this bounds what a connection gets past ``max_header_bytes``."""
TLS_SHUTDOWN_TIMEOUT = 2.0
"""How long a closing connection waits for the peer's close_notify (asyncio: 30 s)."""
HEADER_END = b"\r\n\r\n"
"""The blank line that ends a request's headers (llhttp, as aiohttp runs it, wants CRLFs)."""


class _SmallBufferTLS(sslproto.SSLProtocol):
    max_size = TLS_READ_BUFFER


CLOSE_REASONS = (
    "over-cap",
    "peer-cap",
    "displaced",
    "header-timeout",
    "header-too-large",
    "body-timeout",
    "write-timeout",
)


class ConnectionMetrics:
    """``headroom_<component>_open_connections`` and ``..._connections_closed_total``."""

    def __init__(
        self, component: str, registry: CollectorRegistry | None, *, tls: bool = False
    ) -> None:
        listener = (
            f"the {component}'s port for untrusted clients"
            if component != "extender"
            else "the extender's --metrics-port"
        )
        self.open = Gauge(
            f"headroom_{component}_open_connections",
            f"Connections open now on {listener}" + (", TLS handshakes included." if tls else "."),
            registry=registry,
        )
        self.closed = Counter(
            f"headroom_{component}_connections_closed_total",
            f"Connections {listener} closed, by reason ({', '.join(CLOSE_REASONS)}).",
            ["reason"],
            registry=registry,
        )
        for reason in CLOSE_REASONS:
            self.closed.labels(reason)  # exported at 0: increase() misses a first 1


class LimitedSite(web.BaseSite):
    """A TCP site for an :class:`aiohttp.web.AppRunner` that enforces :class:`Limits`:
    over TLS with ``ssl_context``, plain HTTP without."""

    __slots__ = (
        "_component",
        "_guards",
        "_host",
        "_limits",
        "_metrics",
        "_open",
        "_peers",
        "_per_peer",
        "_port",
        "_read_buffer",
        "_warned",
    )

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        limits: Limits,
        per_peer: int | None = None,
        component: str = "webhook",
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=1024)
        self._host = host
        self._port = port
        self._limits = limits
        self._per_peer = per_peer
        self._component = component
        self._metrics = ConnectionMetrics(component, registry, tls=ssl_context is not None)
        self._open = 0
        self._peers: dict[str, int] = {}
        self._guards: dict[RequestHandler, _Guard] = {}
        self._warned = 0.0
        self._read_buffer = memoryview(bytearray(READ_SIZE))
        """Every connection's reads land here and are copied out at once."""

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def port(self) -> int:
        """The bound port (``port=0`` picks a free one)."""
        if self._server is not None and self._server.sockets:  # type: ignore[attr-defined]
            return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        # Every request passes here once its headers are complete: the header
        # deadline ends and the body deadline starts.
        server.request_handler = self._wrap(server.request_handler)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept, self._host, self._port, backlog=self._backlog
        )

    def _accept(self) -> asyncio.BaseProtocol:
        # With per_peer, one past the cap is let in as far as connection_made, where
        # its address is known and it may displace another client's (_make_room); a
        # burst of accepts before any connection_made runs is bounded at twice it.
        ceiling = self._limits.max_connections * (1 if self._per_peer is None else 2)
        if self._open >= ceiling:
            self._refused("over-cap", f"{self._open} connections open")
            return _Refuse()
        server = self._runner.server
        assert server is not None
        # Counted here, not in connection_made: asyncio accepts a whole backlog
        # before any connection_made runs.
        slot = _Slot(self)
        guard = _Guard(server(), self, slot)
        if self._ssl_context is None:
            return guard
        return _CountedTLS(
            slot,
            asyncio.get_running_loop(),
            guard,
            self._ssl_context,
            None,
            server_side=True,
            ssl_handshake_timeout=self._limits.handshake_timeout,
            ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
        )

    def _refused(self, reason: str, why: str) -> None:
        self._metrics.closed.labels(reason).inc()
        now = time.monotonic()
        if now - self._warned > 10:
            self._warned = now
            remedy = f"; {self._limits.over_cap_remedy}" if reason == "over-cap" else ""
            log.warning("%s on %s: closing connections (%s%s)", why, self.name, reason, remedy)

    def _opened(self) -> None:
        self._open += 1
        self._metrics.open.set(self._open)

    def _closed(self) -> None:
        self._open -= 1
        self._metrics.open.set(self._open)

    def _admit_peer(self, transport: asyncio.BaseTransport) -> str | None:
        """Count the connection against its client address: that address, or None
        where it already holds ``per_peer`` (the connection is then to be aborted)."""
        if self._per_peer is None:
            return ""
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        held = self._peers.get(address, 0)
        if held >= self._per_peer:
            self._refused("peer-cap", f"{address} holds {held} connections")
            return None
        if self._open > self._limits.max_connections and not self._make_room(held):
            self._refused("over-cap", f"{self._open - 1} connections open")
            return None
        self._peers[address] = held + 1
        return address

    def _make_room(self, held: int) -> bool:
        """For a newcomer whose address holds ``held``: abort the oldest connection,
        not being answered, of an address holding more (the most first). False where
        there is none: every other client holds as few, or is being answered."""
        candidates = [
            guard
            for guard in self._guards.values()
            if guard.displaceable() and self._peers.get(guard.address, 0) > held
        ]
        if not candidates:
            return False
        victim = max(candidates, key=lambda g: (self._peers.get(g.address, 0), -g.since))
        # Counted, and logged once in 10 s as refusals are: a flood from more
        # addresses than slots displaces thousands a second.
        self._refused("displaced", f"{victim._peer()} displaced by a client holding fewer")
        victim.abort()
        return True

    def _peer_closed(self, address: str) -> None:
        if not address:
            return
        held = self._peers.get(address, 0) - 1
        if held > 0:
            self._peers[address] = held
        else:
            self._peers.pop(address, None)

    def _wrap(
        self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            guard = self._guards.get(request.protocol)
            if guard is None:
                return await handler(request)
            guard.reading_body(request)
            try:
                return await handler(request)
            finally:
                guard.answered()

        return handle


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Slot:
    """One accepted connection's place in the site's counts, given back once."""

    __slots__ = ("_address", "_site")

    def __init__(self, site: LimitedSite) -> None:
        self._site: LimitedSite | None = site
        self._address: str | None = None
        site._opened()

    @property
    def address(self) -> str:
        return self._address or ""

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Whether the client's address may hold one more; counts it if so."""
        if self._site is None:
            return False
        self._address = self._site._admit_peer(transport)
        return self._address is not None

    def release(self) -> None:
        site, self._site = self._site, None
        if site is None:
            return
        site._closed()
        if self._address is not None:
            site._peer_closed(self._address)


class _CountedTLS(_SmallBufferTLS):
    def __init__(self, slot: _Slot, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot = slot
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._slot.admit(transport):
            self._slot.release()
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._slot.release()
        if self._admitted:  # refused: no handshake was begun
            super().connection_lost(exc)


class _Guard(asyncio.BufferedProtocol):
    """Between the TLS layer (or the socket) and aiohttp's handler: the read
    deadlines of one connection."""

    def __init__(self, handler: RequestHandler, site: LimitedSite, slot: _Slot) -> None:
        self._handler = handler
        self._site = site
        self._slot = slot
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        """Armed while the write buffer is full (between pause_ and resume_writing)."""
        self._request: web.BaseRequest | None = None
        """Set while the handler runs, that is once the headers are in."""
        self._next = False
        """Whether bytes of the next request came while this one was answered."""
        self.since = 0.0
        """When it was admitted (monotonic): the oldest are displaced first."""
        self._header_bytes = 0
        """Header bytes of the request being read (:meth:`_counting`)."""
        self._header_done = False
        """Whether its blank line has come: what follows is its body."""
        self._tail = b""
        """The last bytes read before the blank line, which may span two reads."""
        self._unread: StreamReader | None = None
        """The body of a request answered before it was read in full (a busy or a
        too-large answer): aiohttp reads the rest and drops it, within the body
        deadline; none of it is the next request's headers."""
        self._plain = site._ssl_context is None
        """Straight on the socket: this protocol admits the client and gives its
        slot back (over TLS, the TLS layer does, handshake failures included)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self._plain and not self._slot.admit(transport):
            self._slot.release()
            transport.abort()
            return
        self._transport = transport
        self.since = time.monotonic()
        self._site._guards[self._handler] = self
        self._handler.connection_made(transport)
        self._arm(self._site._limits.header_timeout)

    @property
    def address(self) -> str:
        return self._slot.address

    def displaceable(self) -> bool:
        """Open, and no request of it being answered (half-sent, or idle between)."""
        transport = self._transport
        return transport is not None and not transport.is_closing() and self._request is None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return  # refused: aborting
        if self._unread is not None and self._unread.is_eof():
            self._unread = None
            self._disarm()  # the body deadline: the rest of the body is in
        if self._unread is not None:
            pass  # the rest of an answered request's body
        elif self._request is None:
            if self._timer is None:
                self._arm(self._site._limits.header_timeout)  # a new request's first byte
        elif self._request.content.is_eof():
            self._next = True  # the next request's, while this one is answered
        if self._counting(data) > self._site._limits.max_header_bytes:
            self._close("header-too-large", "headers too large")
            return  # never handed to aiohttp, which would hold it
        self._handler.data_received(data)

    def _counting(self, data: bytes) -> int:
        """The header bytes of the request being read, ``data`` included: from its
        first byte to the blank line ending its headers. Its body, in the same read
        or after, counts against body_timeout and the app's own limit instead; a
        request begun while the one before is answered counts from its first byte.
        """
        if self._unread is not None or (self._request is not None and not self._next):
            return 0  # the body of the request being answered, or answered
        if self._header_done:
            return self._header_bytes  # the body, before aiohttp hands the request over
        seen = self._tail + data
        end = seen.find(HEADER_END)
        if end < 0:
            self._header_bytes += len(data)
            self._tail = seen[-(len(HEADER_END) - 1) :]
            return self._header_bytes
        self._header_bytes += end + len(HEADER_END) - len(self._tail)
        self._header_done = True
        self._tail = b""
        return self._header_bytes

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._site._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._site._read_buffer[:nbytes]))

    def eof_received(self) -> None:
        if self._transport is not None:
            self._handler.eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._plain:
            self._slot.release()
        if self._transport is None:
            return  # refused before aiohttp saw it
        self._disarm()
        self._disarm_write()
        self._site._guards.pop(self._handler, None)
        self._request = None
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._disarm_write()
        self._write_timer = asyncio.get_running_loop().call_later(
            self._site._limits.write_timeout, self._write_deadline
        )
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._disarm_write()
        self._handler.resume_writing()

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_deadline(self) -> None:
        self._write_timer = None
        self._close("write-timeout", "answers not read")

    def reading_body(self, request: web.BaseRequest) -> None:
        self._request, self._unread = request, None
        self._header_bytes, self._header_done, self._tail = 0, False, b""
        self._arm(self._site._limits.body_timeout)

    def answered(self) -> None:
        request, self._request = self._request, None
        if request is not None and not request.content.is_eof():
            # Answered before its body was read in full: aiohttp reads the rest and
            # drops it (its lingering close), still against the body deadline.
            self._unread = request.content
            return
        self._disarm()
        if self._next:
            # The next request began while this one was answered: aiohttp reads it
            # now, and its keep-alive timer does not stop for a partial header. Its
            # header deadline starts here, as Go's server starts ReadHeaderTimeout
            # when it turns to a request already begun.
            self._next = False
            self._arm(self._site._limits.header_timeout)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._deadline)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _deadline(self) -> None:
        self._timer = None
        request = self._request
        if request is not None and request.content.is_eof():
            return  # the body is in; answering takes as long as it takes
        if self._unread is not None and self._unread.is_eof():
            self._unread = None
            return  # the rest of an answered request's body is in
        if request is None and self._unread is None:
            self._close("header-timeout", "headers too slow")
        else:
            self._close("body-timeout", "body too slow")

    def _close(self, reason: str, why: str) -> None:
        """Abort the connection, counted under ``reason``."""
        self._site._metrics.closed.labels(reason).inc()
        log.info("closing %s: %s", self._peer(), why)
        self.abort()

    def _peer(self) -> object:
        return self._transport.get_extra_info("peername") if self._transport else "connection"


async def serve_plain(
    app: web.Application,
    host: str,
    port: int,
    *,
    component: str,
    registry: CollectorRegistry | None,
    limits: PortLimits | None = None,
) -> tuple[web.AppRunner, LimitedSite]:
    """Serve ``app`` over plain HTTP with :class:`PortLimits`; the caller cleans the
    runner up. No access log: the kubelet probes and Prometheus scrape all day."""
    limits = limits or PortLimits()
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, keepalive_timeout=limits.keepalive_timeout
    )
    await runner.setup()
    site = LimitedSite(
        runner,
        host,
        port,
        ssl_context=None,
        limits=limits,
        per_peer=limits.per_peer,
        component=component,
        registry=registry,
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site
