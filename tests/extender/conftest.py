"""The real extender app on a loopback socket, over a state fed like the informers feed it."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extender.server import make_app
from extender.state import ClusterState
from extender.verbs import BindError, Extender
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
    calls: list[tuple[str, str, str, str]] = field(default_factory=list)

    async def __call__(self, namespace: str, name: str, uid: str, node: str) -> None:
        await asyncio.sleep(self.delay)
        if self.fail_with:
            raise BindError(self.fail_with, uncertain=self.uncertain)
        self.calls.append((namespace, name, uid, node))


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


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, assume_ttl=60.0, clock=clock)
    binder = RecordingBinder()
    ready = [True]
    extender = Extender(state, binder, ready=lambda: ready[0])
    async with TestClient(TestServer(make_app(extender, max_body=2**20))) as client:
        yield Harness(state, binder, extender, clock, client, ready)
