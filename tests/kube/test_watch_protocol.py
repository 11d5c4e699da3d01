"""The informer over kube.rest against a local aiohttp server that speaks the list/watch
protocol: paged lists, watch streams cut mid-line, ERROR events, bookmarks, silent
connections, and handlers that fail."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import kube.informer as informer_module
from kube.config import Credentials
from kube.informer import Informer, Resource, identity
from kube.rest import Rest

HANG = object()
"""A watch action: say nothing more, and keep the connection open."""
GATE = object()
"""A watch action: wait until the test sets ``FakeApi.gate``."""


def pod(name: str, uid: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}}


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class FakeApi:
    """``/api/v1/pods``: each list serves ``pages`` (one item per page, continue tokens);
    each watch plays the next script of ``watches`` (bytes to send, HANG), then ends."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.version = "10"
        self.list_failures: dict[str, int] = {}  # continue token -> HTTP status, once
        self.watches: list[list[Any]] = []
        self.lists: list[str | None] = []
        self.watched: list[str] = []
        self.gate = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            return await self.watch(request)
        token = request.query.get("continue")
        self.lists.append(token)
        if token is not None and token in self.list_failures:
            status = self.list_failures.pop(token)
            body = {"kind": "Status", "code": status, "message": "the continue token expired"}
            return web.json_response(body, status=status)
        start = int(token or 0)
        more = start + 1 < len(self.pods)
        meta = {"continue": str(start + 1)} if more else {}
        meta["resourceVersion"] = self.version
        return web.json_response({"metadata": meta, "items": self.pods[start : start + 1]})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        self.watched.append(request.query["resourceVersion"])
        script = self.watches.pop(0) if self.watches else [HANG]
        response = web.StreamResponse()
        await response.prepare(request)
        for action in script:
            if action is HANG:
                await asyncio.Event().wait()
            elif action is GATE:
                await self.gate.wait()
            elif isinstance(action, bytes):
                await response.write(action)
        return response


async def serve(api: FakeApi) -> tuple[TestServer, Rest]:
    app = web.Application()
    app.router.add_get("/api/v1/pods", api.handle)
    server = TestServer(app)
    await server.start_server()
    rest = Rest(Credentials(server=str(server.make_url("")).rstrip("/")), timeout=5.0)
    return server, rest


async def until(check: Any, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer_module, "BACKOFF_MAX_SECONDS", 0.01)


@contextlib.asynccontextmanager
async def informer_on(api: FakeApi) -> AsyncIterator[tuple[Informer, list[tuple[str, str]]]]:
    server, rest = await serve(api)
    events: list[tuple[str, str]] = []
    inf = Informer(
        Resource(rest, "/api/v1/pods"),
        name="pods",
        keep=identity,
        handler=lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
    )
    inf.start()
    try:
        yield inf, events
    finally:
        inf.stop()
        await asyncio.sleep(0.05)
        await rest.close()
        await server.close()


# --- behaviour that holds on HEAD (regression cover) ---------------------------


async def test_a_stream_cut_mid_line_applies_nothing_of_it_and_relists() -> None:
    api = FakeApi()
    api.pods = [pod("a", "ua", "5")]
    half = line("DELETED", pod("a", "ua", "11"))
    api.watches = [[line("ADDED", pod("b", "ub", "11")), half[: len(half) // 2]]]
    async with informer_on(api) as (inf, events):
        await until(lambda: len(api.lists) >= 2 and inf.synced.is_set() and len(api.watched) >= 2)
        assert ("DELETED", "a") not in events
        assert "ns/a" in inf.uids


async def test_a_410_error_event_relists_and_drops_what_went_missing() -> None:
    api = FakeApi()
    api.pods = [pod("a", "ua", "5"), pod("b", "ub", "6")]
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    api.watches = [[GATE, line("ERROR", gone)]]
    async with informer_on(api) as (inf, events):
        await until(lambda: len(api.watched) >= 1)
        api.pods = [pod("a", "ua", "5")]
        api.version = "20"
        api.gate.set()
        await until(lambda: len(api.watched) >= 2)
        assert api.watched[1] == "20"
        assert ("DELETED", "b") in events
        assert set(inf.uids) == {"ns/a"}


async def test_an_expired_continue_token_restarts_the_list_from_the_first_page() -> None:
    api = FakeApi()
    api.pods = [pod("a", "ua", "5"), pod("b", "ub", "6"), pod("c", "uc", "7")]
    api.list_failures = {"2": 410}
    async with informer_on(api) as (inf, _):
        await until(lambda: inf.synced.is_set())
        assert api.lists == [None, "1", "2", None, "1", "2"]
        assert set(inf.uids) == {"ns/a", "ns/b", "ns/c"}


async def test_a_closed_window_resumes_from_the_last_bookmark_without_a_relist() -> None:
    api = FakeApi()
    api.pods = [pod("a", "ua", "5")]
    bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "42"}}
    api.watches = [[line("BOOKMARK", bookmark)]]
    async with informer_on(api) as (inf, _):
        await until(lambda: len(api.watched) >= 2)
        assert api.watched == ["10", "42"]
        assert len(api.lists) == 1
        assert inf.windows == 1


# --- bugs -------------------------------------------------------------------


async def test_a_silent_watch_is_given_up_well_before_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A watch on an apiserver that died without a FIN/RST (its node lost, a load
    # balancer's failover) hears nothing. The apiserver sends a bookmark about every
    # minute, so silence far longer than that is a dead connection. At HEAD the read
    # timeout is the window plus 30 s (270 s), and all that time the informer says it
    # is not blind: the extender stays ready on a view that misses every event.
    # (raising=False: HEAD has no such setting, and keeps its 270 s.)
    monkeypatch.setattr(informer_module, "WATCH_IDLE_SECONDS", 0.5, raising=False)
    api = FakeApi()
    api.pods = [pod("a", "ua", "5")]
    api.watches = [[line("ADDED", pod("b", "ub", "11")), HANG]]
    async with informer_on(api) as (inf, _):
        await until(lambda: len(api.watched) >= 2, seconds=5.0)
        assert len(api.lists) == 2  # given up as broken: listed again, then watched
        assert set(inf.uids) == {"ns/a"}  # b was never in a list: its ADDED was the test's


async def test_a_deletion_whose_handler_failed_is_delivered_again_after_the_relist() -> None:
    # A handler that raises on an event (a bug in the accounting, a state it did not
    # expect) makes the informer re-list, which is how every other event gets another
    # try: an ADDED or MODIFIED comes back with the list. A DELETED did not: the key was
    # forgotten before the handler ran, so the re-list, which replays a DELETED only for
    # keys it still remembers, never did -- the extender charged the pod's GPU memory
    # for good (it is in no list and no later event again).
    api = FakeApi()
    api.pods = [pod("a", "ua", "5"), pod("b", "ub", "6")]
    api.watches = [[line("DELETED", pod("b", "ub", "11")), HANG]]
    server, rest = await serve(api)
    delivered: list[tuple[str, str]] = []
    failed: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" and not failed:
            failed.append(name)
            api.pods = [pod("a", "ua", "5")]  # what the re-list will find
            raise RuntimeError("a handler bug")
        delivered.append((kind, name))

    inf = Informer(Resource(rest, "/api/v1/pods"), name="pods", keep=identity, handler=handler)
    inf.start()
    try:
        await until(lambda: len(api.lists) >= 2 and len(api.watched) >= 2)
        assert failed == ["b"]
        assert ("DELETED", "b") in delivered
        assert set(inf.uids) == {"ns/a"}
    finally:
        inf.stop()
        await asyncio.sleep(0.05)
        await rest.close()
        await server.close()


async def test_a_replayed_deletion_whose_handler_failed_is_replayed_again() -> None:
    # The same for the DELETED a re-list replays for a key it no longer shows, and for
    # the one it sends for an old UID when the name now belongs to another.
    api = FakeApi()
    api.pods = [pod("a", "ua", "5"), pod("b", "ub", "6"), pod("c", "uc", "7")]
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    api.watches = [[GATE, line("ERROR", gone)]]
    server, rest = await serve(api)
    delivered: list[tuple[str, str]] = []
    failures: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if kind == "DELETED" and meta["uid"] not in failures:
            failures.append(meta["uid"])
            raise RuntimeError("a handler bug")
        delivered.append((kind, meta["uid"]))

    inf = Informer(Resource(rest, "/api/v1/pods"), name="pods", keep=identity, handler=handler)
    inf.start()
    try:
        await until(lambda: len(api.watched) >= 1)
        api.pods = [pod("a", "ua", "5"), pod("c", "uc2", "12")]  # b gone, c recreated
        api.gate.set()
        await until(lambda: ("DELETED", "ub") in delivered and ("DELETED", "uc") in delivered)
        assert ("ADDED", "uc2") in delivered
        assert inf.uids == {"ns/a": "ua", "ns/c": "uc2"}
    finally:
        inf.stop()
        await asyncio.sleep(0.05)
        await rest.close()
        await server.close()
