"""A stand-in for kube-apiserver's list and watch endpoints, and the objects it serves."""

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.webhook.reviews import policy_objects

POLICY = policy_objects()[0]  # shared-default


def namespace(name: str, **labels: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def mig_node(name: str, count: str = "7", **extra_labels: str) -> dict[str, Any]:
    labels = {"nvidia.com/mig.capable": "true", "nvidia.com/mig-1g.10gb.memory": "9856"}
    labels.update(extra_labels)
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": {"cpu": "64", "nvidia.com/mig-1g.10gb": count}},
    }


class StandInApiserver:
    """A stand-in for kube-apiserver's list and watch endpoints (NOT the real one;
    the e2e suite runs that): enough to prove which URLs the cache calls."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.authorizations: set[str | None] = set()
        self.namespaces = [namespace("ml-team", **{"headroom.dev/policy": "shared-default"})]
        self.watched = asyncio.Event()
        self.closing = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/v1/namespaces", self.namespace_list)
        app.router.add_get("/api/v1/namespaces/{name}", self.namespace_get)
        app.router.add_get("/apis/headroom.dev/v1alpha1/gpusharingpolicies", self.policy_list)
        app.router.add_get("/api/v1/nodes", self.node_list)
        self.server = TestServer(app)

    async def _list(self, request: web.Request, items: list[dict[str, Any]]) -> web.StreamResponse:
        self.requests.append(request.path_qs)
        self.authorizations.add(request.headers.get("Authorization"))
        if request.query.get("watch") not in ("true", "True", "1"):
            return web.json_response({"metadata": {"resourceVersion": "7"}, "items": items})
        response = web.StreamResponse()
        await response.prepare(request)
        if request.path == "/api/v1/namespaces":
            event = {"type": "ADDED", "object": namespace("late", **{"headroom.dev/policy": "x"})}
            await response.write(json.dumps(event).encode() + b"\n")
            self.watched.set()
        await self.closing.wait()  # hold the watch open until the test ends
        return response

    async def namespace_list(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, self.namespaces)

    async def policy_list(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, [POLICY])

    async def node_list(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, [mig_node("a100-1")])

    async def namespace_get(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        self.authorizations.add(request.headers.get("Authorization"))
        name = request.match_info["name"]
        return web.json_response(namespace(name, **{"headroom.dev/policy": "fresh"}))
