"""kube.informer over kube.rest against a loopback stand-in for the apiserver's list and
watch (NOT the real apiserver: tests/e2e/test_informer.py runs the same informer against
that): paging, a watch stream cut anywhere, bookmarks, windows, ERROR events."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kube import informer as informer_module
from kube.config import Credentials
from kube.informer import FIRST_PAGE, Informer, Resource, identity
from kube.rest import ApiError, Rest


def pod(name: str, uid: str, version: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x" * 200}]}}


class StandIn:
    """Lists in pages; each watch request is answered by the next script in ``watches``."""

    def __init__(self) -> None:
        self.items = [pod(f"p{i}", f"u{i}", str(10 + i)) for i in range(3)]
        self.version = "20"
        self.lists: list[dict[str, str]] = []
        self.watches_asked: list[dict[str, str]] = []
        self.watches: list[list[bytes]] = []
        """Per watch request: the chunks written, then the window ends."""
        self.list_status = 200
        app = web.Application()
        app.router.add_get("/api/v1/pods", self.handle)
        self.server = TestServer(app)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch") != "true":
            self.lists.append(query)
            if self.list_status != 200:
                status = {"kind": "Status", "code": self.list_status, "message": "nope"}
                return web.json_response(status, status=self.list_status)
            start = int(query.get("continue") or 0)
            page = self.items[start : start + int(query["limit"])]
            metadata: dict[str, str] = {"resourceVersion": self.version}
            if start + len(page) < len(self.items):
                metadata["continue"] = str(start + len(page))
            return web.json_response({"metadata": metadata, "items": page})
        self.watches_asked.append(query)
        response = web.StreamResponse()
        await response.prepare(request)
        chunks = self.watches.pop(0) if self.watches else []
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.005)
        if not chunks and not self.watches:
            await asyncio.sleep(30)  # nothing more scripted: hold the watch open
        return response


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@pytest.fixture
async def standin() -> AsyncIterator[StandIn]:
    server = StandIn()
    await server.server.start_server()
    yield server
    await server.server.close()


@pytest.fixture
async def rest(standin: StandIn) -> AsyncIterator[Rest]:
    url = str(standin.server.make_url("")).rstrip("/")
    client = Rest(Credentials(server=url), timeout=5.0)
    yield client
    await client.close()


async def until(what: str, condition: Any, within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {within}s: {what}")


async def test_pages_selectors_and_an_error_status(standin: StandIn, rest: Rest) -> None:
    resource = Resource(rest, "/api/v1/pods", fieldSelector="spec.nodeName=a")
    body = json.loads(await resource.list(limit=2, token=None))
    assert [o["metadata"]["name"] for o in body["items"]] == ["p0", "p1"]
    assert standin.lists[-1] == {"fieldSelector": "spec.nodeName=a", "limit": "2"}
    body = json.loads(await resource.list(limit=2, token=body["metadata"]["continue"]))
    assert [o["metadata"]["name"] for o in body["items"]] == ["p2"]
    standin.list_status = 410
    with pytest.raises(ApiError) as refused:
        await resource.list(limit=2, token="expired")
    assert refused.value.status == 410
    assert refused.value.reason == "nope"


async def test_a_watch_stream_cut_anywhere_gives_whole_events(standin: StandIn, rest: Rest) -> None:
    big = pod("big", "ubig", "31")
    big["spec"]["containers"] = [{"name": f"c{i}", "image": "y" * 100} for i in range(3000)]
    stream = event("ADDED", pod("a", "ua", "30")) + event("MODIFIED", big) + b"\n"
    # Cut into odd pieces: mid-line, mid-UTF-8 never matters (lines split on the byte 0x0a).
    standin.watches = [[stream[i : i + 777] for i in range(0, len(stream), 777)]]
    events = [e async for e in Resource(rest, "/api/v1/pods").watch(version="20")]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "big"),
    ]
    assert len(events[1]["object"]["spec"]["containers"]) == 3000  # a line of ~350 KB
    asked = standin.watches_asked[0]
    assert asked["resourceVersion"] == "20"
    assert asked["allowWatchBookmarks"] == "true"


async def test_the_informer_resumes_windows_from_the_last_version_and_relists_on_410(
    standin: StandIn, rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "BACKOFF_MAX_SECONDS", 0.05)
    bookmark = {"metadata": {"resourceVersion": "40"}}
    gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
    standin.watches = [
        [event("ADDED", pod("new", "unew", "30")), event("BOOKMARK", bookmark)],
        [event("DELETED", pod("p0", "u0", "41"))],
        [event("ERROR", gone)],
    ]
    seen: list[tuple[str, str]] = []
    cache = Informer(
        Resource(rest, "/api/v1/pods"),
        name="pods",
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        keep=identity,
    )
    cache.start()
    try:
        await until(
            "re-listed after the 410, watching again",
            lambda: cache.relists == 2 and len(standin.watches_asked) == 4,
        )
    finally:
        cache.stop()
    assert standin.lists[0]["limit"] == str(FIRST_PAGE)
    versions = [w["resourceVersion"] for w in standin.watches_asked]
    # The list's version, then the bookmark's, then the deletion's; then a new list's.
    assert versions[:4] == ["20", "40", "41", "20"]
    assert cache.windows == 2
    assert seen[:6] == [
        ("ADDED", "p0"),
        ("ADDED", "p1"),
        ("ADDED", "p2"),
        ("ADDED", "new"),
        ("DELETED", "p0"),
        ("ADDED", "p0"),  # the re-list shows p0 again (the stand-in never removed it)
    ]
    # "new" is gone from the second list: replayed as a stub of its key and UID.
    assert ("DELETED", "new") in seen[6:]
    assert sorted(cache.uids) == ["ns/p0", "ns/p1", "ns/p2"]
