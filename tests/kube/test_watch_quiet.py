"""A live watch on a quiet resource may say nothing for longer than a bookmark period.

kube-apiserver's watch cache sends a regular watch only bookmarks whose resourceVersion
is above the one the watch started from (cache_watcher.go: ``event.ResourceVersion >
resourceVersion``); the bookmark's is the cacher's last processed version, which on a
resource nobody writes moves only with etcd progress notifications. Measured on
kube-apiserver 1.34.4 with etcd as devcluster runs it: a namespaces watch's first
bookmark came 120 s after it started, and of ten informers on quiet resources
(namespaces, configmaps, serviceaccounts, storageclasses, clusterroles...) three gave
their healthy watch up after WATCH_IDLE_SECONDS (90 s) as dead and re-listed.
"""

import asyncio
from typing import Any

import pytest
from aiohttp import web

import kube.informer as informer_module
from tests.kube.test_watch_protocol import FakeApi, informer_on, pod, until

SCALE = 0.01
"""Seconds here per second of the real settings."""


class QuietApi(FakeApi):
    """A live apiserver on a resource nobody writes: the watch says nothing, and the
    server ends it when its ``timeoutSeconds`` is up, as kube-apiserver does."""

    async def watch(self, request: web.Request) -> web.StreamResponse:
        self.watched.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(float(request.query["timeoutSeconds"]))
        return response


async def test_a_live_watch_silent_until_its_window_ends_is_not_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window: Any = informer_module.WATCH_WINDOW_SECONDS
    monkeypatch.setattr(informer_module, "WATCH_WINDOW_SECONDS", window * SCALE)
    monkeypatch.setattr(
        informer_module, "WATCH_IDLE_SECONDS", informer_module.WATCH_IDLE_SECONDS * SCALE
    )
    api = QuietApi()
    api.pods = [pod("a", "ua", "5")]
    async with informer_on(api) as (inf, _):
        await until(lambda: len(api.watched) >= 3, seconds=4 * window * SCALE + 5)
        assert len(api.lists) == 1, "a healthy, quiet watch was given up and re-listed"
        assert inf.failing_since is None
        assert inf.windows >= 2
