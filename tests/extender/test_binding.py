"""The real binder (the official client) against a loopback stand-in for the apiserver.

The client's ``create_namespaced_binding`` posts to ``/api/v1/namespaces/<ns>/bindings``
(the apiserver serves it like ``pods/<name>/binding``). The stand-in answers as
kube-apiserver does: 201
with a ``Status`` body, the answer the client fails to deserialise when preloaded
(kubernetes-client/python#825). e2e runs the same binder against a real apiserver.
"""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from extender.binding import REQUEST_TIMEOUT_SECONDS, ApiCalls, api_binder
from extender.verbs import BindError

Seen = list[tuple[str, dict[str, Any]]]
MANIFESTS = Path(__file__).parents[2] / "manifests" / "base"


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, Seen]]:
    seen: Seen = []

    async def binding(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.path, body))
        if body["target"]["name"] == "slow":
            await asyncio.sleep(2)
        if body["target"]["name"] == "overloaded":
            overloaded: dict[str, Any] = {
                "kind": "Status",
                "status": "Failure",
                "message": "etcdserver: request timed out",
                "code": 500,
            }
            return web.json_response(overloaded, status=500)
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
    bind = api_binder(ApiCalls(core_api(host).api_client))
    await bind("research", "p", "uid-1", "gpu-b")
    ((path, body),) = seen
    assert path == "/api/v1/namespaces/research/bindings"
    assert body["metadata"] == {"name": "p", "namespace": "research", "uid": "uid-1"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-b"}


async def test_conflict_becomes_a_bind_error_with_the_apiserver_message(
    apiserver: tuple[str, Seen],
) -> None:
    host, _ = apiserver
    bind = api_binder(ApiCalls(core_api(host).api_client))
    with pytest.raises(BindError, match=r'^HTTP 409: .*already assigned to node "gpu-a"') as err:
        await bind("research", "p", "uid-1", "taken")
    assert not err.value.uncertain  # a definite refusal: the pod may be released
    assert err.value.conflict  # bound already: the extender reads where, in case it was us


async def test_server_error_leaves_the_outcome_uncertain(apiserver: tuple[str, Seen]) -> None:
    host, _ = apiserver
    with pytest.raises(BindError, match=r"^HTTP 500: etcdserver") as err:
        await api_binder(ApiCalls(core_api(host).api_client))(
            "research", "p", "uid-1", "overloaded"
        )
    assert err.value.uncertain


async def test_timeout_leaves_the_outcome_uncertain(apiserver: tuple[str, Seen]) -> None:
    host, seen = apiserver
    api = core_api(host)
    api.api_client.configuration.retries = 0
    with pytest.raises(BindError, match="unreachable") as err:
        await api_binder(ApiCalls(api.api_client, timeout=0.2))("research", "p", "uid-1", "slow")
    assert seen  # the apiserver got the binding; only its answer was lost
    assert err.value.uncertain


def test_request_timeout_is_below_the_scheduler_http_timeout() -> None:
    """kube-scheduler stops waiting for /bind after the extender's httpTimeout."""
    configmap = yaml.safe_load((MANIFESTS / "scheduler" / "configmap.yaml").read_text())
    configuration = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    (extender,) = configuration["extenders"]
    http_timeout = float(extender["httpTimeout"].removesuffix("s"))
    assert http_timeout > REQUEST_TIMEOUT_SECONDS
    assert REQUEST_TIMEOUT_SECONDS < 5  # kube-scheduler's default httpTimeout


async def test_unreachable_apiserver_is_a_bind_error() -> None:
    api = core_api("http://127.0.0.1:9")  # discard port: connection refused
    api.api_client.configuration.retries = 0
    with pytest.raises(BindError) as err:
        await api_binder(ApiCalls(api.api_client))("research", "p", "", "gpu-b")
    assert not err.value.uncertain  # never connected: nothing can have been bound
