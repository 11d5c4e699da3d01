"""The real binder (kube.rest over aiohttp) against a loopback stand-in for the apiserver.

It posts to ``/api/v1/namespaces/<ns>/pods/<name>/binding``; the stand-in answers
as kube-apiserver does: 201 with a ``Status`` body. e2e runs the same binder
against a real apiserver.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from extender.binding import REQUEST_TIMEOUT_SECONDS, ApiCalls, api_binder, api_reader
from extender.verbs import BindError, ReadError
from tests.pod_reads import POD_PATH, read_pod

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
    app.router.add_get(POD_PATH, read_pod)
    app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), seen


Calls = Callable[..., ApiCalls]


@pytest.fixture
async def calls() -> AsyncIterator[Calls]:
    made: list[ApiCalls] = []

    def make(host: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> ApiCalls:
        configuration = client.Configuration()
        configuration.host = host
        made.append(ApiCalls(configuration, timeout=timeout))
        return made[-1]

    yield make
    for each in made:
        await each.close()


async def test_binding_is_created_with_the_node_as_target(
    apiserver: tuple[str, Seen], calls: Calls
) -> None:
    host, seen = apiserver
    bind = api_binder(calls(host))
    await bind("research", "p", "uid-1", "gpu-b")
    ((path, body),) = seen
    assert path == "/api/v1/namespaces/research/pods/p/binding"
    assert body["metadata"] == {"name": "p", "namespace": "research", "uid": "uid-1"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-b"}


async def test_the_apiserver_is_told_the_binding_timeout_too(calls: Calls) -> None:
    # kube-apiserver keeps a POST its client gave up on queued (API Priority and
    # Fairness) and then stores it, unless the request's own deadline says otherwise
    # (tests/e2e/test_bind_queued.py).
    queries: list[dict[str, str]] = []

    async def binding(request: web.Request) -> web.Response:
        queries.append(dict(request.query))
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
    async with TestServer(app, host="127.0.0.1") as server:
        host = str(server.make_url("")).rstrip("/")
        await api_binder(calls(host))("research", "p", "uid-1", "gpu-b")
        await api_binder(calls(host, timeout=2.5))("research", "p", "uid-1", "gpu-b")
    assert queries == [{"timeout": f"{REQUEST_TIMEOUT_SECONDS:g}s"}, {"timeout": "2.5s"}]


async def test_conflict_becomes_a_bind_error_with_the_apiserver_message(
    apiserver: tuple[str, Seen], calls: Calls
) -> None:
    host, _ = apiserver
    bind = api_binder(calls(host))
    with pytest.raises(BindError, match=r'^HTTP 409: .*already assigned to node "gpu-a"') as err:
        await bind("research", "p", "uid-1", "taken")
    assert not err.value.uncertain  # a definite refusal: the pod may be released
    assert err.value.conflict  # bound already: the extender reads where, in case it was us


async def test_server_error_leaves_the_outcome_uncertain(
    apiserver: tuple[str, Seen], calls: Calls
) -> None:
    host, _ = apiserver
    with pytest.raises(BindError, match=r"^HTTP 500: etcdserver") as err:
        await api_binder(calls(host))("research", "p", "uid-1", "overloaded")
    assert err.value.uncertain


async def test_timeout_leaves_the_outcome_uncertain(
    apiserver: tuple[str, Seen], calls: Calls
) -> None:
    host, seen = apiserver
    with pytest.raises(BindError, match="unreachable") as err:
        await api_binder(calls(host, timeout=0.2))("research", "p", "uid-1", "slow")
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


async def test_unreachable_apiserver_is_a_bind_error(calls: Calls) -> None:
    with pytest.raises(BindError) as err:  # discard port: connection refused
        await api_binder(calls("http://127.0.0.1:9"))("research", "p", "", "gpu-b")
    assert not err.value.uncertain  # never connected: nothing can have been bound


async def test_reads_say_bound_gone_or_unknown(apiserver: tuple[str, Seen], calls: Calls) -> None:
    host, _ = apiserver
    read = api_reader(calls(host))
    pod = await read("research", "p")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert await read("research", "gone") is None
    with pytest.raises(ReadError, match="HTTP 503: etcd down"):
        await read("research", "broken")
