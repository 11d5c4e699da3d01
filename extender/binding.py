"""The real binder and reader: ``pods/binding`` and ``GET pod`` through the Kubernetes API.

The official client is synchronous. Binds used to run on asyncio's default
executor (a handful of threads) over the client's default connection pool, so
in a 1,000-pod storm they queued behind each other past kube-scheduler's 5 s
``httpTimeout`` (issue 7). They now run on their own pool of
:data:`CONCURRENCY` threads over as many connections, each request bounded by
:data:`REQUEST_TIMEOUT_SECONDS`, well inside the scheduler's timeout.

The official client's ``create_namespaced_binding`` fails to deserialise the
apiserver's answer (kubernetes-client/python#825: ``target`` missing from the
returned Status), so the response is not preloaded; a 201 is all that matters.
"""

import asyncio
import concurrent.futures
import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, HTTPError, MaxRetryError

from extender.verbs import Binder, BindError, Reader, ReadError

CONCURRENCY = 32
"""Binds (and reads) in flight at once: kube-scheduler binds in parallel goroutines."""
REQUEST_TIMEOUT_SECONDS = 3.0
"""Below kube-scheduler's extender ``httpTimeout`` (5 s by default and in the
shipped configuration), which bounds the whole bind verb, reads included."""

T = TypeVar("T")


class ApiCalls:
    """Blocking client calls run on a pool of their own, never on the event loop."""

    def __init__(self, api: client.ApiClient, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.core = client.CoreV1Api(api)
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY, "extender-api")

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(func, *args, _request_timeout=self.timeout, **kwargs)
        return await loop.run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def api_binder(calls: ApiCalls) -> Binder:
    async def bind(namespace: str, name: str, uid: str, node: str) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            await calls.run(
                calls.core.create_namespaced_binding, namespace, body, _preload_content=False
            )
        except ApiException as err:
            # A 5xx (or no status) may come after the binding was stored.
            uncertain = not err.status or err.status >= 500
            raise BindError(
                _status_message(err), uncertain=uncertain, conflict=err.status == 409
            ) from err
        except (HTTPError, OSError) as err:
            raise BindError(
                f"apiserver unreachable: {err}", uncertain=not _never_sent(err)
            ) from err

    return bind


def api_reader(calls: ApiCalls) -> Reader:
    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response: Any = await calls.run(
                calls.core.read_namespaced_pod, name, namespace, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise ReadError(_status_message(err)) from err
        except (HTTPError, OSError) as err:
            raise ReadError(f"apiserver unreachable: {err}") from err
        pod: dict[str, Any] = json.loads(response.data)
        return pod

    return read


def _never_sent(err: Exception) -> bool:
    """True when the connection was never made, so the apiserver never saw the binding."""
    reason = err.reason if isinstance(err, MaxRetryError) else err
    return isinstance(reason, ConnectTimeoutError | ConnectionRefusedError)


def _status_message(err: ApiException) -> str:
    """``HTTP 409: Operation cannot be fulfilled ...`` from the apiserver's Status body."""
    message = ""
    try:
        status = json.loads(err.body or "")
        if isinstance(status, dict):
            message = str(status.get("message") or "")
    except (TypeError, ValueError):
        pass
    return f"HTTP {err.status}: {message or err.reason}"
