"""A small asynchronous client for the few requests that sit on a hot path.

The official client is synchronous and builds, validates and serialises model
objects for every call: in a 1,000-pod storm the extender's binds through it
cost milliseconds of CPU each, on threads that fight the event loop for the
GIL, and queued behind each other for most of a second (issue 8: 0.78 s per
bind on average, headroom-scheduler at 0.44x the stock scheduler). Binding a
pod is one POST of a few hundred bytes, so this speaks HTTP itself, with
aiohttp on the event loop, with :class:`kube.config.Credentials`: the server and
CA, a client certificate, or a bearer token, asked for before every request
(the in-cluster service-account token rotates). It imports nothing of the
official client, whose models are ~10 MiB of a process that has no use for them.
"""

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from kube.config import ClientConfiguration, Credentials, from_configuration

DEFAULT_CONNECTIONS = 32


JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""What the official client sends a dict PATCH body as; for a map such as labels or
``status.capacity``, a merge of the keys given."""


class ApiError(Exception):
    """The apiserver answered with an error: ``status`` (e.g. 404, 410) and its message."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


class Unreachable(Exception):
    """No answer. ``sent`` is False when the connection was never made (nothing was
    sent), True when the request may have reached the apiserver."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def check(self) -> "Answer":
        """This answer, or :class:`ApiError` if the apiserver refused (any status >= 300)."""
        if self.status >= 300:
            raise ApiError(self.status, self.message())
        return self

    def message(self) -> str:
        """The ``message`` of a ``Status`` body, or the body's start."""
        try:
            status = json.loads(self.body)
        except ValueError:
            return self.body[:200].decode(errors="replace")
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
        return self.body[:200].decode(errors="replace")


class Rest:
    """JSON requests to the apiserver of ``configuration``; create it on the event loop."""

    def __init__(
        self,
        credentials: Credentials | ClientConfiguration,
        *,
        timeout: float,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        """``credentials``: or the official client's Configuration, as its loader filled it."""
        if not isinstance(credentials, Credentials):
            credentials = from_configuration(credentials)
        self.credentials = credentials
        self.base = credentials.server.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        connector = aiohttp.TCPConnector(
            limit=connections, ssl=credentials.ssl_context() or False, keepalive_timeout=30
        )
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)

    def headers(self, *, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": JSON}
        token = self.credentials.authorization()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def options(self) -> dict[str, Any]:
        """What every request of this client passes to aiohttp besides its URL."""
        options: dict[str, Any] = {}
        if self.credentials.tls_server_name:
            options["server_hostname"] = self.credentials.tls_server_name
        if self.credentials.proxy:
            options["proxy"] = self.credentials.proxy
        return options

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        time_limit: float | None = None,
        content_type: str = JSON,
    ) -> Answer:
        """Any answer the apiserver gives (:meth:`Answer.check` for errors); raises
        :class:`Unreachable` when there is none. ``time_limit``: seconds for this
        request, instead of the client's timeout; ``content_type``: of ``body``."""
        data = None if body is None else json.dumps(body).encode()
        limit = self.timeout if time_limit is None else aiohttp.ClientTimeout(total=time_limit)
        try:
            async with self.session.request(
                method,
                self.base + path,
                data=data,
                headers=self.headers(content_type=content_type if data is not None else None),
                timeout=limit,
                **self.options(),
            ) as response:
                return Answer(response.status, await response.read())
        except aiohttp.ClientConnectorError as err:
            raise Unreachable(f"{type(err).__name__}: {err}", sent=False) from err
        except TimeoutError as err:
            raise Unreachable(f"no answer within {limit.total}s", sent=True) from err
        except aiohttp.ClientError as err:
            raise Unreachable(f"{type(err).__name__}: {err}", sent=True) from err

    async def close(self) -> None:
        await self.session.close()
