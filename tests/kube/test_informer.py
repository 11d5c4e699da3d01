"""The informer's cache on plain data: a recreated object is a delete plus an add; blindness;
a re-list on demand, against a source the test drives."""

import asyncio
import json
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

import kube.informer as informer_module
from extender.state import ClusterState
from kube.informer import FIRST_PAGE, PAGE_BYTES, PAGE_SIZE, Informer, identity, next_limit
from kube.rest import ApiError
from tests.extender.objects import gpu_node, gpu_pod, uid_of


def pod(name: str, uid: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}}


def recording() -> tuple[Informer, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["uid"]))

    return Informer(lambda **_: None, name="pods", handler=handler), events


def test_a_relist_that_finds_a_recreated_pod_deletes_the_old_uid() -> None:
    # Issue 7: a StatefulSet's pod recreated under the same name kept the old UID's charge.
    informer, events = recording()
    informer._replace({"ns/web-0": pod("web-0", "old")})
    informer._replace({"ns/web-0": pod("web-0", "new")})
    assert events == [("ADDED", "old"), ("DELETED", "old"), ("ADDED", "new")]
    informer._replace({"ns/web-0": pod("web-0", "new", "2")})
    assert events[-1] == ("MODIFIED", "new")


def test_a_watch_event_for_a_new_uid_under_an_old_name_deletes_the_old_one() -> None:
    informer, events = recording()
    informer._apply("ADDED", pod("web-0", "old"))
    informer._apply("MODIFIED", pod("web-0", "new"))
    assert events == [("ADDED", "old"), ("DELETED", "old"), ("ADDED", "new")]
    assert informer.items["ns/web-0"]["metadata"]["uid"] == "new"


def test_blind_since_the_first_failure_until_a_good_list() -> None:
    informer, _ = recording()
    assert informer.blind_for(now=100.0) == 0.0
    informer.failing_since = 90.0
    assert informer.blind_for(now=100.0) == 10.0


def test_an_identity_informer_keeps_stubs_and_a_relist_still_frees_a_gone_gpu_pod() -> None:
    # Issue 8: whole pods in the informer's store were ~27 KiB of heap each. The
    # extender keeps only identities there; a pod a re-list no longer shows must
    # still be dropped from its accounting by the DELETED replayed from the stub.
    clock = Clock()
    state = ClusterState(margin=0, stale_after=90.0, clock=clock)
    state.on_node("ADDED", gpu_node("gpu-a"))
    informer = Informer(lambda **_: None, name="pods", handler=state.on_pod, keep=identity)
    bound = gpu_pod("p", node="gpu-a", declared="10Gi", phase="Running")
    bound["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    replayed: list[dict[str, Any]] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        replayed.append(obj)
        state.on_pod(kind, obj)

    informer._handler = handler
    informer._replace({"research/p": bound})
    assert informer.items == {}  # not even a stub: only the key's UID
    assert informer.uids == {"research/p": uid_of(bound)}
    assert uid_of(bound) in state.pods
    informer._replace({})
    stub = {"name": "p", "namespace": "research", "uid": uid_of(bound)}
    assert replayed[-1] == {"metadata": stub}
    assert state.pods == {}
    # Nothing says kubelet stopped it: charged for its grace period, then freed.
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].declared == 10 * 2**30
    clock.now += 60
    state.refresh(clock.now)
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].declared == 0


async def test_a_relist_reads_pages_and_deletes_only_what_no_page_showed() -> None:
    pages = {
        None: {"metadata": {"continue": "p2"}, "items": [pod("a", "ua"), pod("b", "ub")]},
        "p2": {"metadata": {"resourceVersion": "42"}, "items": [pod("c", "uc")]},
    }
    asked: list[dict[str, Any]] = []

    def list_func(**kwargs: Any) -> Any:
        asked.append(kwargs)
        return SimpleNamespace(data=json.dumps(pages[kwargs.get("_continue")]).encode())

    events: list[tuple[str, str]] = []
    informer = Informer(
        list_func, name="pods", handler=lambda k, o: events.append((k, o["metadata"]["uid"]))
    )
    informer._apply("ADDED", pod("gone", "ugone"))
    version = await informer._relist()
    assert version == "42"
    assert [a.get("_continue") for a in asked] == [None, "p2"]
    assert [a["limit"] for a in asked] == [FIRST_PAGE, PAGE_SIZE]  # small objects: full pages
    assert events[1:] == [("ADDED", "ua"), ("ADDED", "ub"), ("ADDED", "uc"), ("DELETED", "ugone")]
    assert sorted(informer.items) == ["ns/a", "ns/b", "ns/c"]
    assert informer.synced.is_set()


async def test_a_throttled_page_is_asked_for_again_not_the_whole_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # API Priority and Fairness refuses a page with 429: the list went back to page
    # one, and under sustained throttling a list of many pages might never finish.
    monkeypatch.setattr(informer_module, "PAGE_RETRY_SECONDS", 0.0)
    src = Controlled()
    src.pods = [pod(f"p{n}", f"u{n}") for n in range(3)]
    asked: list[str | None] = []
    real_list = src.list

    async def list_page(*, limit: int, token: str | None) -> bytes:
        asked.append(token)
        if len(asked) in (2, 3):  # the second page, twice
            raise ApiError(429, "TooManyRequests: the server has received too many requests")
        return await real_list(limit=limit, token=token)

    src.list = list_page  # type: ignore[method-assign]
    informer = Informer(src, name="pods")
    assert await informer._relist() == "100"
    assert asked == [None, "1", "1", "1", "2"]
    assert sorted(informer.items) == ["ns/p0", "ns/p1", "ns/p2"]
    src.list = real_list  # type: ignore[method-assign]
    # Anything else still fails the list (a 410 expired token: start over), and so
    # does throttling past PAGE_RETRIES.
    src.fail = [ApiError(410, "Expired")]
    with pytest.raises(ApiError):
        await informer._relist()


def test_pages_are_sized_by_what_the_last_page_weighed() -> None:
    # Issue 8: 500 nodes with their image lists are ~5 MiB of JSON and ~30 MiB as
    # dicts at once; pages of PAGE_BYTES keep a re-list's peak at a few MiB.
    assert next_limit(100 * 11_000, 100) == PAGE_BYTES // 11_000  # fat nodes: ~95 a page
    assert next_limit(100 * 600, 100) == PAGE_SIZE  # namespaces: never above PAGE_SIZE
    assert next_limit(10 * 2_000_000, 10) == 10  # 2 MB pods: never below 10
    assert next_limit(0, 0) == PAGE_SIZE  # an empty page says nothing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Controlled:
    """List pages and watch events handed out by the test; records open/closed watches."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.gate: asyncio.Queue[None] | None = None  # when set, each page waits for a put
        self.fail: list[Exception] = []
        self.lists = 0
        self.queues: list[asyncio.Queue[dict[str, Any]]] = []
        self.open = 0

    async def list(self, *, limit: int, token: str | None) -> bytes:
        self.lists += 1
        if self.gate is not None:
            await self.gate.get()
        if self.fail:
            raise self.fail.pop(0)
        start = int(token or 0)
        snap = self.pods
        more = start + 1 < len(snap)
        meta = {"continue": str(start + 1)} if more else {"resourceVersion": "100"}
        return json.dumps({"metadata": meta, "items": snap[start : start + 1]}).encode()

    async def watch(self, *, version: str) -> AsyncGenerator[dict[str, Any], None]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues.append(q)
        self.open += 1
        try:
            while True:
                yield await q.get()
        finally:
            self.open -= 1


def controlled(clock: Clock) -> tuple[Informer, Controlled, list[tuple[str, str]]]:
    src = Controlled()
    events: list[tuple[str, str]] = []
    inf = Informer(
        src,
        name="pods",
        keep=identity,
        clock=clock,
        handler=lambda k, o: events.append((k, o["metadata"]["name"])),
    )
    return inf, src, events


async def spin(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_relist_mid_watch_closes_the_old_watch_and_sweeps_deletions() -> None:
    clock = Clock()
    inf, src, events = controlled(clock)
    src.pods = [pod("a", "ua"), pod("b", "ub")]
    inf.start()
    await spin()
    assert inf.synced.is_set()
    assert src.open == 1
    assert inf.listed_from == 1000.0
    old_q = src.queues[0]
    old_q.put_nowait({"type": "ADDED", "object": pod("c", "uc", "101")})
    await spin()
    assert "ns/c" in inf.uids
    # b and c deleted while the watch is replaced; an event queued on the old watch
    # must never be applied once relist() returned.
    old_q.put_nowait({"type": "ADDED", "object": pod("late", "ul", "102")})
    src.pods = [pod("a", "ua", "103")]
    clock.now = 2000.0
    inf.relist()
    await spin()
    assert src.open == 1
    assert len(src.queues) == 2
    assert set(inf.uids) == {"ns/a"}, inf.uids
    assert inf.listed_from == 2000.0
    assert ("DELETED", "b") in events
    assert ("DELETED", "c") in events
    src.queues[1].put_nowait({"type": "ADDED", "object": pod("d", "ud", "104")})
    await spin()
    assert set(inf.uids) == {"ns/a", "ns/d"}
    inf.stop()
    await spin()


async def test_relist_while_the_first_list_is_paging_and_repeatedly() -> None:
    clock = Clock()
    inf, src, events = controlled(clock)
    src.gate = asyncio.Queue()
    src.pods = [pod("a", "ua"), pod("b", "ub"), pod("c", "uc")]
    inf.start()
    await spin()
    src.gate.put_nowait(None)  # page 1 (a) of list 1
    await spin()
    assert set(inf.uids) == {"ns/a"}
    assert not inf.synced.is_set()
    src.pods = [pod("b", "ub"), pod("c", "uc")]  # a deleted meanwhile
    for t in (1001.0, 1002.0, 1003.0):  # relist several times, each mid-page
        clock.now = t
        inf.relist()
        await spin()
    for _ in range(10):
        src.gate.put_nowait(None)
    await spin(50)
    assert inf.synced.is_set()
    assert inf.listed_from == 1003.0
    assert set(inf.uids) == {"ns/b", "ns/c"}
    assert ("DELETED", "a") in events
    assert src.open == 1  # one watch only
    inf.stop()
    await spin()
