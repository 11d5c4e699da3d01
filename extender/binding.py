"""The real binder: create ``pods/binding`` through the Kubernetes API.

The official client's ``create_namespaced_binding`` fails to deserialise the
apiserver's answer (kubernetes-client/python#825: ``target`` missing from the
returned Status), so the response is not preloaded; a 201 is all that matters.
The client is synchronous and runs on a worker thread.
"""

import asyncio
import json

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, HTTPError, MaxRetryError

from extender.verbs import Binder, BindError

REQUEST_TIMEOUT_SECONDS = 4.0
"""Below kube-scheduler's extender ``httpTimeout`` (5 s by default and in the
shipped configuration), which bounds the whole bind verb: a slower answer is
one the scheduler no longer waits for."""


def api_binder(api: client.CoreV1Api, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> Binder:
    async def bind(namespace: str, name: str, uid: str, node: str) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            await asyncio.to_thread(
                api.create_namespaced_binding,
                namespace,
                body,
                _preload_content=False,
                _request_timeout=timeout,
            )
        except ApiException as err:
            # A 5xx (or no status) may come after the binding was stored.
            uncertain = not err.status or err.status >= 500
            raise BindError(_status_message(err), uncertain=uncertain) from err
        except (HTTPError, OSError) as err:
            raise BindError(
                f"apiserver unreachable: {err}", uncertain=not _never_sent(err)
            ) from err

    return bind


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
