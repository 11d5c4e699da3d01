"""The real binder (the official client) against a loopback stand-in for the apiserver.

The client's ``create_namespaced_binding`` posts to ``/api/v1/namespaces/<ns>/bindings``
(the apiserver serves it like ``pods/<name>/binding``). The stand-in answers as
kube-apiserver does: 201
with a ``Status`` body, the answer the client fails to deserialise when preloaded
(kubernetes-client/python#825). e2e runs the same binder against a real apiserver.
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from extender.binding import api_binder
from extender.verbs import BindError

Seen = list[tuple[str, dict[str, Any]]]


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, Seen]]:
    seen: Seen = []

    async def binding(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.path, body))
        if body["target"]["name"] == "taken":
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": 'Operation cannot be fulfilled on pods/binding "p": '
                'pod p is already assigned to node "gpu-a"',
                "reason": "Conflict",
                "code": 409,
            }
            return web.json_response(status, status=409)
        success = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return web.json_response(success, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{namespace}/bindings", binding)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), seen


def core_api(host: str) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = host
    return client.CoreV1Api(client.ApiClient(configuration))


async def test_binding_is_created_with_the_node_as_target(apiserver: tuple[str, Seen]) -> None:
    host, seen = apiserver
    bind = api_binder(core_api(host))
    await bind("research", "p", "uid-1", "gpu-b")
    ((path, body),) = seen
    assert path == "/api/v1/namespaces/research/bindings"
    assert body["metadata"] == {"name": "p", "namespace": "research", "uid": "uid-1"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-b"}


async def test_conflict_becomes_a_bind_error_with_the_apiserver_message(
    apiserver: tuple[str, Seen],
) -> None:
    host, _ = apiserver
    bind = api_binder(core_api(host))
    with pytest.raises(BindError, match=r'^HTTP 409: .*already assigned to node "gpu-a"'):
        await bind("research", "p", "uid-1", "taken")


async def test_unreachable_apiserver_is_a_bind_error() -> None:
    api = core_api("http://127.0.0.1:9")  # discard port: connection refused
    api.api_client.configuration.retries = 0
    with pytest.raises(BindError):
        await api_binder(api)("research", "p", "", "gpu-b")
