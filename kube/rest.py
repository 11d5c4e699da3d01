"""A small asynchronous client for the few requests that sit on a hot path.

The official client is synchronous and builds, validates and serialises model
objects for every call: in a 1,000-pod storm the extender's binds through it
cost milliseconds of CPU each, on threads that fight the event loop for the
GIL, and queued behind each other for most of a second (issue 8: 0.78 s per
bind on average, headroom-scheduler at 0.44x the stock scheduler). Binding a
pod is one POST of a few hundred bytes, so this speaks HTTP itself, with
aiohttp on the event loop, using the credentials the official client loaded
(kube.config): the server and CA, a client certificate, or a bearer token,
re-read before every request where the loader installed a refresh hook (the
in-cluster service-account token rotates).
"""

import json
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes import client

DEFAULT_CONNECTIONS = 32


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
        configuration: client.Configuration,
        *,
        timeout: float,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self.configuration = configuration
        self.base = configuration.host.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        connector = aiohttp.TCPConnector(
            limit=connections, ssl=_ssl_context(configuration), keepalive_timeout=30
        )
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)

    async def request(self, method: str, path: str, body: Any = None) -> Answer:
        headers = {"Accept": "application/json"}
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            async with self.session.request(
                method, self.base + path, data=data, headers=headers
            ) as response:
                return Answer(response.status, await response.read())
        except aiohttp.ClientConnectorError as err:
            raise Unreachable(f"{type(err).__name__}: {err}", sent=False) from err
        except TimeoutError as err:
            raise Unreachable(f"no answer within {self.timeout.total}s", sent=True) from err
        except aiohttp.ClientError as err:
            raise Unreachable(f"{type(err).__name__}: {err}", sent=True) from err

    async def close(self) -> None:
        await self.session.close()


def _ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
    if not configuration.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context
