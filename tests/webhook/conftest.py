"""Fixtures for the webhook tests."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.webhook.apiserver import StandInApiserver
from tests.webhook.reviews import fed_cache
from webhook.admission import Admission
from webhook.cache import ClusterCache
from webhook.metrics import WebhookMetrics
from webhook.server import create_app
from webhook.service import reviewer

Client = TestClient[web.Request, web.Application]


@pytest.fixture
def cache() -> ClusterCache:
    return fed_cache()


@pytest.fixture
async def client(cache: ClusterCache) -> AsyncIterator[Client]:
    """The real webhook app (real admission, real decide) on a loopback socket."""
    app = create_app(reviewer(cache, Admission(cache)), metrics=WebhookMetrics())
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


@pytest.fixture
async def apiserver() -> AsyncIterator[StandInApiserver]:
    stand_in = StandInApiserver()
    await stand_in.server.start_server()
    yield stand_in
    stand_in.closing.set()
    await stand_in.server.close()
