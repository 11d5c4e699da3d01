"""The real extender app on a loopback socket, over a state fed like the informers feed it."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extender.server import make_app
from extender.state import ClusterState
from extender.verbs import BindError, Extender, ReadError
from tests.extender.objects import EPOCH

Client = TestClient[web.Request, web.Application]
MARGIN = 2**29


@dataclass
class RecordingBinder:
    """Test double for the apiserver's ``pods/binding``: records calls, may be slow or fail.

    The real binder is extender.binding.api_binder (tests/extender/test_binding.py, e2e).
    """

    delay: float = 0.0
    fail_with: str = ""
    uncertain: bool = False
    """Fail as a timeout does: the binding may exist after all."""
    lands: bool = False
    """With ``uncertain``: the apiserver did store the binding, only the answer was lost."""
    calls: list[tuple[str, str, str, str]] = field(default_factory=list)
    bound: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> node: the bindings the apiserver holds, as reads see them."""

    async def __call__(self, namespace: str, name: str, uid: str, node: str) -> None:
        await asyncio.sleep(self.delay)
        where = self.bound.get((namespace, name))
        if where is not None:
            raise BindError(
                f"HTTP 409: pod {name} is already assigned to node {where}", conflict=True
            )
        if self.fail_with:
            if self.uncertain and self.lands:
                self.bound[(namespace, name)] = node
            raise BindError(self.fail_with, uncertain=self.uncertain)
        self.calls.append((namespace, name, uid, node))
        self.bound[(namespace, name)] = node


@dataclass
class PodReader:
    """Test double for ``GET pod``: the pods the test put here, bound as the binder says."""

    binder: RecordingBinder
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    fail: bool = False
    reads: int = 0

    def put(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = pod

    async def __call__(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.fail:
            raise ReadError("apiserver unreachable")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return None
        node = self.binder.bound.get((namespace, name))
        return {**pod, "spec": {**pod["spec"], "nodeName": node}} if node else pod


@dataclass
class Clock:
    now: float = EPOCH.timestamp()

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    state: ClusterState
    binder: RecordingBinder
    extender: Extender
    clock: Clock
    client: Client
    ready: list[bool]
    reader: PodReader


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    binder = RecordingBinder()
    reader = PodReader(binder)
    ready = [True]
    extender = Extender(state, binder, ready=lambda: ready[0], reader=reader)
    async with TestClient(TestServer(make_app(extender, max_body=2**20))) as client:
        yield Harness(state, binder, extender, clock, client, ready, reader)
