"""How much of the webhook one client may hold, and for how long.

aiohttp alone keeps an idle connection for an hour, gives a request as long as
it likes to send its headers and body, and accepts every connection the
kernel hands it; asyncio's TLS layer gives each connection a 256 KiB read
buffer. 1,000 idle connections took 367 MiB against a 256Mi limit (issue 8).
:class:`Limits` are the numbers; :mod:`serving.site` enforces those on
connections, :class:`InFlight` the cap on requests answered at once, and
:class:`OffLoop` decides large pods on a worker thread, so a 6,500-container
pod no longer holds the event loop for a second while other tenants wait.

This module imports nothing heavy: ``headroom --help`` reads its defaults.
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar


@dataclass(frozen=True)
class Limits:
    max_connections: int = 512
    """Open connections, TLS handshakes included. Each costs about 40 KiB when
    idle (measured, tests/webhook/test_limits.py), so 512 stay near 20 MiB; and
    it is above the in-flight cap, as HTTP/1.1 carries one request at a time."""
    max_in_flight: int = 256
    """Admission requests being answered at once. Above kube-apiserver's default
    --max-mutating-requests-inflight (200), so one apiserver at its own limit is
    never told to retry; one request takes about a millisecond."""
    keepalive_timeout: float = 30.0
    """Idle time after a response; kube-apiserver reuses a connection within
    milliseconds under load and redials cheaply after a quiet spell."""
    header_timeout: float = 5.0
    """From a request's first byte (or the end of the handshake, or the answer before
    it for one begun meanwhile) to its last header."""
    body_timeout: float = 5.0
    """From the headers to the last byte of the body; the webhook configuration's
    timeoutSeconds is 5, after which the apiserver has given up anyway."""
    max_header_bytes: int = 64 * 1024
    """A request's headers, up to the blank line that ends them (Go's MaxHeaderBytes);
    past it the connection is aborted before aiohttp buffers more. aiohttp alone
    takes 128 header fields of 8 KiB and holds them: 200 connections sending that
    much took the webhook from 36 to 446 MiB (measured), past its 256Mi limit.
    kube-apiserver sends under 1 KiB."""
    handshake_timeout: float = 5.0
    """For the TLS handshake (asyncio's default is 60 s)."""
    write_timeout: float = 5.0
    """How long an answer may wait for the client to read it (its write buffer
    full). aiohttp waits for the buffer to drain with no deadline, and no other
    timer runs meanwhile: a client that pipelines requests and reads none of the
    answers held ~1.25 MiB for ever. kube-apiserver reads an answer at once, or
    has given up on it after timeoutSeconds (5)."""
    over_cap_remedy: str = "raise --max-connections if apiservers need more"


MAX_LARGE_IN_FLIGHT = 2
"""Large reviews (see webhook.server.LARGE_BODY_BYTES) answered at once."""


class InFlight:
    """Admission requests being answered, refused beyond ``limit`` -- and large
    ones beyond ``large_limit``: parsed, a review holds about six times its
    size in memory (a 2.6 MiB review: 15 MiB, measured), so a handful of large
    pods at once is what a 256Mi webhook affords."""

    def __init__(self, limit: int, large_limit: int = MAX_LARGE_IN_FLIGHT) -> None:
        self.limit = limit
        self.large_limit = large_limit
        self.count = 0
        self.large = 0

    def try_enter(self, large: bool = False) -> bool:
        if self.count >= self.limit or (large and self.large >= self.large_limit):
            return False
        self.count += 1
        self.large += large
        return True

    def leave(self, large: bool = False) -> None:
        self.count -= 1
        self.large -= large


P = ParamSpec("P")
T = TypeVar("T")

LARGE_POD_CONTAINERS = 32
"""From this many containers (init containers included) a pod is decided off
the event loop. decide() costs about 0.13 ms a container (6,500: 0.85 s), so
below this a pod takes under ~4 ms on the loop, less than a thread hand-off
plus the GIL switches it causes (5 ms interval) would save other requests."""


LARGE_POD_BYTES = 64 * 1024
"""From this size of AdmissionReview a pod is decided off the event loop, whatever
its container count: decide() costs about 60 us a KiB of pod (a one-container pod
with 2 MiB of env: ~0.15 s), so a pod of few containers but long env lists,
arguments or annotations would hold the loop as long as thousands of containers."""


class OffLoop:
    """One worker thread for large pods.

    One, not a pool: the work is Python under the GIL, so a second thread would
    not decide faster, only hold a second large pod in memory. The event loop
    still gets the GIL every switch interval (5 ms) and keeps answering small
    pods while a large one is decided.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-pods")

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: function(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def container_count(pod: dict[str, Any] | None) -> int:
    spec = (pod or {}).get("spec")
    if not isinstance(spec, dict):
        return 0
    return sum(
        len(value)
        for key in ("containers", "initContainers")
        if isinstance(value := spec.get(key), list)
    )
