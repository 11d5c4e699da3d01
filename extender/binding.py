"""The real binder and reader: ``pods/binding`` and ``GET pod`` through the Kubernetes API.

Binds used to run on asyncio's default executor (a handful of threads) over
the official client's default connection pool, so in a 1,000-pod storm they
queued behind each other past kube-scheduler's 5 s ``httpTimeout`` (issue 7);
then on a pool of 32 threads, where each still cost milliseconds of CPU in the
official client's models and fought the event loop for the GIL: 0.78 s per
bind on average in the 300-node storm (issue 8). They now go out on the event
loop through :class:`kube.rest.Rest` (aiohttp, :data:`CONCURRENCY` connections,
each request bounded by :data:`REQUEST_TIMEOUT_SECONDS`, well inside the
scheduler's timeout).
"""

from typing import Any

from extender.verbs import Binder, BindError, Reader, ReadError
from kube.config import ClientConfiguration, Credentials
from kube.rest import Rest, Unreachable

CONCURRENCY = 32
"""Binds (and reads) in flight at once: kube-scheduler binds in parallel goroutines."""
REQUEST_TIMEOUT_SECONDS = 3.0
"""Below kube-scheduler's extender ``httpTimeout`` (5 s by default and in the
shipped configuration), which bounds the whole bind verb, reads included."""


class ApiCalls(Rest):
    """The extender's binds and reads; create it on the event loop."""

    def __init__(
        self,
        credentials: Credentials | ClientConfiguration,
        *,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(credentials, timeout=timeout, connections=CONCURRENCY)


def api_binder(calls: Rest) -> Binder:
    """Binds through ``pods/binding``, each bounded on the apiserver too by its ``timeout``
    query parameter, the client's own timeout.

    A POST the client gave up on is not abandoned by kube-apiserver: API Priority and
    Fairness queues it before anything reads its body, and Go's HTTP server notices a
    hung-up client only once the body is read, so it stays queued for a quarter of
    its deadline (15 s of the default 60 s: ``getRequestWaitContext``) and is then
    stored -- after the extender's read ``verify_after`` (10 s) later found the pod
    unbound and let go of its charge. With ``timeout`` the deadline starts when the
    apiserver received the request (``WithRequestDeadline``): queued, it is refused
    (429) within a quarter of it, and no write of it starts after it.
    """
    seconds = calls.timeout.total or REQUEST_TIMEOUT_SECONDS
    query = f"?timeout={max(seconds, 0.001):g}s"

    async def bind(namespace: str, name: str, uid: str, node: str) -> None:
        metadata: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            answer = await calls.request(
                "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding{query}", body
            )
        except Unreachable as err:
            raise BindError(f"apiserver unreachable: {err}", uncertain=err.sent) from err
        if answer.status < 300:
            return
        # A 5xx may come after the binding was stored.
        raise BindError(
            f"HTTP {answer.status}: {answer.message()}",
            uncertain=answer.status >= 500,
            conflict=answer.status == 409,
        )

    return bind


def api_reader(calls: Rest) -> Reader:
    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            answer = await calls.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except Unreachable as err:
            raise ReadError(f"apiserver unreachable: {err}") from err
        if answer.status == 404:
            return None
        if answer.status >= 300:
            raise ReadError(f"HTTP {answer.status}: {answer.message()}")
        try:
            pod: dict[str, Any] = answer.json()
        except ValueError as err:
            raise ReadError(f"pod {namespace}/{name}: answer is not JSON") from err
        return pod

    return read
