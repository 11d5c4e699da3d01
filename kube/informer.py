"""List-then-watch one kind of object into memory, as client-go's informers do.

An informer is a task on the event loop, and the cache is only touched there,
so readers need no locks. It reads from a :class:`Resource` (kube.rest over
aiohttp: the list and the watch stream are read on the loop, no thread and none
of the official client) or from an official client's list function such as
``CoreV1Api.list_node``, whose blocking calls run on threads and whose watch
hands its events to the loop. A ``410 Gone`` or a dropped watch re-lists, with
capped exponential backoff between failures.
"""

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol, runtime_checkable

import aiohttp

from kube.rest import Answer, ApiError, Rest

log = logging.getLogger(__name__)

Object = dict[str, Any]
ListFunc = Callable[..., Any]
Handler = Callable[[str, Object], None]
"""Called on the event loop with ``ADDED``/``MODIFIED``/``DELETED`` and the object."""

WATCH_WINDOW_SECONDS = 60
"""The ``timeoutSeconds`` of a watch: the apiserver ends it then, and it resumes from
the last version seen, without a re-list."""
WATCH_IDLE_SECONDS = WATCH_WINDOW_SECONDS + 30.0
"""A watch that says nothing this long is dead (an apiserver gone without a FIN or RST).
Not a bookmark period: kube-apiserver's watch cache withholds bookmarks until its
version passes the one the watch started from, and on a resource nobody writes that
took 120 s (kube-apiserver 1.34.4), so a live watch may be silent for all its window.
Past the window, though, the apiserver has closed it. A dead one fails like any
broken watch (blind, re-listed)."""
BACKOFF_MAX_SECONDS = 30.0
PAGE_SIZE = 500
"""The most objects per list request, as client-go's reflector pages its lists."""
FIRST_PAGE = 100
PAGE_BYTES = 1 << 20
"""What a list page aims at, in JSON: its objects are ~4x that as dicts, and a
page is alive while it is handled. 500 nodes carrying their image lists are
5 MiB of JSON and ~30 MiB at their peak (issue 8; bench/memory_bench.py)."""
PAGE_RETRIES = 10
PAGE_RETRY_SECONDS = 1.0
"""A page the apiserver refuses with 429 (API Priority and Fairness throttling) is asked
for again, its continue token kept, up to :data:`PAGE_RETRIES` times this far apart
(the ``Retry-After`` APF sends; client-go's REST client retries a 429 ten times too),
rather than the whole list failing and starting over from page one."""
LIST_TIMEOUT_SECONDS = 60.0
"""A list that takes longer is abandoned and retried: a hung list must not blind the cache."""


@runtime_checkable
class Source(Protocol):
    """A list and a watch of one kind of object."""

    async def list(self, *, limit: int, token: str | None) -> bytes:
        """One page of the list, as the apiserver's JSON."""
        ...

    def watch(self, *, version: str) -> AsyncGenerator[Object, None]:
        """The watch's events from ``version`` until the server ends the window."""
        ...


def identity(obj: Object) -> Object:
    """Keep nothing of an object but what the informer itself needs: its key and UID.

    For caches whose handlers keep what they use (the extender's claims, the
    webhook's parsed policies). An informer remembers every object it has
    seen, to replay a ``DELETED`` for each one a re-list no longer shows, and a
    pod as the apiserver sends it (managedFields, images, env, status) is tens
    of KiB (issue 8: about 27 KiB of heap per pod; 16-18k pods filled a 512Mi
    extender). With ``keep=identity`` the informer stores only each key's UID
    (not even this stub), and the ``DELETED`` replayed after a re-list carries
    the stub, which every such handler must read as "gone" by name or UID.
    """
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    return {"metadata": kept}


def object_key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def next_limit(body_bytes: int, count: int) -> int:
    """The next page's size: :data:`PAGE_BYTES` of objects like the last page's."""
    if count <= 0 or body_bytes <= 0:
        return PAGE_SIZE
    return max(10, min(PAGE_SIZE, PAGE_BYTES * count // body_bytes))


class Informer:
    """A cache of every object ``source`` lists, kept current by a watch.

    ``source`` is a :class:`Resource`, or a bound client method such as
    ``CoreV1Api.list_node`` or ``functools.partial(CustomObjectsApi.list_cluster_custom_object,
    group, version, plural)`` with ``list_kwargs`` (``label_selector=...``).
    """

    def __init__(
        self,
        source: "Source | ListFunc",
        *,
        name: str,
        handler: Handler | None = None,
        on_resync: Callable[[], None] | None = None,
        keep: Callable[[Object], Object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        **list_kwargs: Any,
    ) -> None:
        """``keep`` maps each object to what ``items`` stores (default: all of it).
        :func:`identity`: ``items`` stays empty, only :attr:`uids` is kept."""
        self.name = name
        self.clock = clock
        self.listed_from: float | None = None
        """When (``clock``) the latest complete list asked for its first page: the cache
        shows at least everything stored before then (a paged list is one snapshot,
        taken when its first page is served), the watch what came after."""
        self.items: dict[str, Object] = {}
        self.uids: dict[str, str] = {}
        """Key -> UID of every object listed or watched and not deleted since."""
        self.synced = asyncio.Event()
        # A client's list function has no ``list``/``watch`` (bound methods show their function's).
        self._source = source if isinstance(source, Source) else ClientList(source, **list_kwargs)
        self._handler = handler
        self._on_resync = on_resync
        self._store = keep is not identity
        self._keep = keep if keep is not None else (lambda obj: obj)
        self._task: asyncio.Task[None] | None = None
        self.relists = 0
        self.failing_since: float | None = None
        """Monotonic time of the first failure since the last good list: the cache is
        blind from then on (events may be missed) until a list succeeds."""
        self.windows = 0
        """Watch windows the server closed and that were resumed without a re-list."""

    def start(self) -> None:
        """Start listing and watching on the running loop; ``synced`` is set after the
        first full list."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"informer-{self.name}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def relist(self) -> None:
        """List again now, then watch from that list: what was stored before now is
        in the cache once :attr:`listed_from` is now or later, however the watch lags."""
        if self._task is None:
            return
        self._task.cancel()
        self.start()

    def blind_for(self, now: float | None = None) -> float:
        """Seconds since the watch broke without a good list since (0 while watching)."""
        since = self.failing_since
        if since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    # --- list and watch -----------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                version = await self._relist()
                failures = 0
                self.failing_since = None
                await self._watch(version)
            except Exception as err:  # any failure means: back off, then re-list
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                failures += 1
                delay = min(BACKOFF_MAX_SECONDS, 0.5 * 2 ** min(failures, 6))
                delay *= random.uniform(0.8, 1.2)
                level = logging.INFO if _is_gone(err) else logging.WARNING
                log.log(
                    level,
                    "%s: watch ended (%s); re-listing in %.1fs",
                    self.name,
                    _describe(err),
                    delay,
                )
                await asyncio.sleep(delay)

    async def _relist(self) -> str:
        """List in pages of about :data:`PAGE_BYTES`, each handled as it comes.

        One unpaged list of 20,000 pods is a few hundred MB of JSON and then of
        dicts, all alive at once (issue 8); pages keep one page alive. A
        continue token that expired (410) fails the list, which is retried
        from the start like any other failure.
        """
        seen: set[str] = set()
        token: str | None = None
        limit = FIRST_PAGE
        began = self.clock()
        while True:
            raw = await self._list_page(limit, token)
            size = len(raw)
            text = raw.decode()  # what json.loads(raw) does, with raw gone before the parse
            del raw
            body = json.loads(text)
            del text
            items = body.get("items") or []
            limit = next_limit(size, len(items))
            objects = {object_key(o): o for o in items}
            del items
            seen.update(objects)
            self._page(objects)
            del objects
            metadata = body.get("metadata") or {}
            del body
            token = metadata.get("continue") or None
            if token is None:
                self.listed_from = began
                self._listed(seen)
                self.relists += 1
                return str(metadata.get("resourceVersion", ""))

    async def _list_page(self, limit: int, token: str | None) -> bytes:
        """One page, a throttled one (429) asked for again (:data:`PAGE_RETRIES`): under
        sustained throttling a list of many pages restarted from the first at each
        refusal might never finish, and the cache never sync."""
        for attempt in range(1, PAGE_RETRIES + 1):
            try:
                return await self._source.list(limit=limit, token=token)
            except Exception as err:
                if getattr(err, "status", None) != 429 or attempt == PAGE_RETRIES:
                    raise
                log.info("%s: list page throttled (429), asking again", self.name)
                await asyncio.sleep(PAGE_RETRY_SECONDS * random.uniform(0.8, 1.2))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _watch(self, version: str) -> None:
        """Watch from ``version`` until an error; a window the server closes
        resumes from the last version seen (bookmarks included), so a quiet
        cluster is not re-listed every few minutes."""
        while True:
            async with contextlib.aclosing(self._source.watch(version=version)) as events:
                async for event in events:
                    kind = event.get("type")
                    obj = event.get("object")
                    if kind == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else None
                        message = obj.get("message") if isinstance(obj, dict) else obj
                        raise ApiError(code if isinstance(code, int) else 500, str(message))
                    if not isinstance(obj, dict):
                        continue
                    seen = (obj.get("metadata") or {}).get("resourceVersion")
                    if seen:
                        version = str(seen)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(kind, obj)
            self.windows += 1

    # --- the cache ----------------------------------------------------------

    def _replace(self, objects: dict[str, Object]) -> None:
        """A whole list at once (one page): what :meth:`_relist` does in pages."""
        self.listed_from = self.clock()
        self._page(objects)
        self._listed(set(objects))

    def _page(self, objects: dict[str, Object]) -> None:
        for key, obj in objects.items():
            kind = self._replaced(key, obj)
            self._put(key, obj)
            if self._handler:
                self._handler(kind, obj)

    def _listed(self, seen: set[str]) -> None:
        """The list is complete: objects it did not show are gone."""
        for key in self.uids.keys() - seen:
            self._delete(key)
        if self._on_resync:
            self._on_resync()
        self.synced.set()

    def _apply(self, kind: str, obj: Object) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            # Forgotten only once handled: a handler that raises makes the informer
            # re-list, and that re-list replays a DELETED for a key it still knows.
            if self._handler:
                self._handler(kind, obj)
            self._pop(key)
            return
        kind = "ADDED" if self._replaced(key, obj) == "ADDED" else kind
        self._put(key, obj)
        if self._handler:
            self._handler(kind, obj)

    def _replaced(self, key: str, obj: Object) -> str:
        """``MODIFIED`` for the same object, else ``ADDED`` -- after a ``DELETED`` for the
        object that had this name before, when the name now belongs to another UID.

        A pod recreated under the same name (a StatefulSet's) is another pod: a
        re-list that sees only the new one must not leave the old one's charge.
        """
        uid = self.uids.get(key)
        if uid is None:
            return "ADDED"
        if uid != _uid(obj):
            self._delete(key)
            return "ADDED"
        return "MODIFIED"

    def _put(self, key: str, obj: Object) -> None:
        self.uids[key] = _uid(obj)
        if self._store:
            self.items[key] = self._keep(obj)

    def _delete(self, key: str) -> None:
        """Hand a ``DELETED`` for what ``key`` holds to the handler, then forget it: if
        the handler raises, the key stays, and the re-list that follows replays it."""
        if self._handler:
            self._handler("DELETED", self._held(key))
        self._pop(key)

    def _pop(self, key: str) -> Object:
        """Forget ``key``; what it held, or the stub of its name and UID."""
        old = self._held(key)
        self.uids.pop(key, None)
        self.items.pop(key, None)
        return old

    def _held(self, key: str) -> Object:
        """What ``key`` holds, or the stub of its name and UID."""
        uid = self.uids.get(key, "")
        old = self.items.get(key)
        if old is not None:
            return old
        namespace, _, name = key.rpartition("/")
        if namespace:
            return {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
        return {"metadata": {"name": name, "uid": uid}}


class Resource:
    """A list and watch endpoint of the apiserver, read with :class:`kube.rest.Rest`:
    ``Resource(rest, "/api/v1/nodes", labelSelector="nvidia.com/mig.capable=true")``.

    The watch is read as it streams, one event per line, on the loop.
    """

    def __init__(self, rest: Rest, path: str, **params: str) -> None:
        self.rest = rest
        self.path = path
        self.params = params

    async def list(self, *, limit: int, token: str | None) -> bytes:
        query = {**self.params, "limit": str(limit)}
        if token:
            query["continue"] = token
        timeout = aiohttp.ClientTimeout(total=LIST_TIMEOUT_SECONDS)
        async with self.rest.session.get(
            self.rest.base + self.path,
            params=query,
            headers=self.rest.headers(),
            timeout=timeout,
            **self.rest.options(),
        ) as response:
            body = await response.read()
            Answer(response.status, body).check()
            return body

    async def watch(self, *, version: str) -> AsyncGenerator[Object, None]:
        query = {
            **self.params,
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_WINDOW_SECONDS),
        }
        # The server ends the window: a connection quiet for longer than that is dead.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=LIST_TIMEOUT_SECONDS, sock_read=WATCH_IDLE_SECONDS
        )
        async with self.rest.session.get(
            self.rest.base + self.path,
            params=query,
            headers=self.rest.headers(),
            timeout=timeout,
            **self.rest.options(),
        ) as response:
            if response.status >= 300:
                Answer(response.status, await response.read()).check()
            parts: list[bytes] = []
            async for chunk in response.content.iter_any():
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    parts.append(chunk[start:end])
                    line = b"".join(parts)
                    parts.clear()
                    start = end + 1
                    if line.strip():
                        yield json.loads(line)
                if start < len(chunk):
                    parts.append(chunk[start:])
            line = b"".join(parts)
            if line.strip():
                yield json.loads(line)


class ClientList:
    """An official client's list function as a :class:`Source`: ``CoreV1Api.list_node``
    or ``functools.partial(CustomObjectsApi.list_cluster_custom_object, ...)``.

    The client is synchronous: a list runs on a thread, and a watch's stream is
    read on a thread of its own that hands each event to the loop.
    """

    def __init__(self, func: ListFunc, **kwargs: Any) -> None:
        self.func = func
        self.kwargs = kwargs

    async def list(self, *, limit: int, token: str | None) -> bytes:
        paging: dict[str, Any] = {"limit": limit}
        if token:
            paging["_continue"] = token
        response = await asyncio.to_thread(
            self.func,
            _preload_content=False,
            _request_timeout=LIST_TIMEOUT_SECONDS,
            **paging,
            **self.kwargs,
        )
        data: bytes = response.data
        return data

    async def watch(self, *, version: str) -> AsyncGenerator[Object, None]:
        from kubernetes import watch  # only for callers that already hold the client

        def list_raw(**kwargs: Any) -> Any:
            # No docstring: the client then skips model deserialisation and
            # hands us the raw JSON object, which is all the caches need.
            return self.func(**kwargs)

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stream = watch.Watch()

        def hand(what: str, item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is reading
                loop.call_soon_threadsafe(events.put_nowait, (what, item))

        def read() -> None:
            try:
                for event in stream.stream(
                    list_raw,
                    resource_version=version,
                    timeout_seconds=WATCH_WINDOW_SECONDS,
                    allow_watch_bookmarks=True,
                    _request_timeout=WATCH_WINDOW_SECONDS + 30,
                    **self.kwargs,
                ):
                    hand("event", event)
            except Exception as err:
                hand("error", err)
            else:
                hand("end", None)

        threading.Thread(target=read, name="informer-watch", daemon=True).start()
        try:
            while True:
                what, item = await events.get()
                if what == "error":
                    raise item
                if what == "end":
                    return
                yield {"type": item.get("type"), "object": item.get("raw_object")}
        finally:
            stream.stop()


def _uid(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _describe(err: Exception) -> str:
    """One line: the client's ApiException spans several (headers, body)."""
    status = getattr(err, "status", None)
    if isinstance(status, int):
        return f"{status} {' '.join(str(getattr(err, 'reason', '')).split())}"[:300]
    return f"{type(err).__name__}: {err}"[:300]


def _is_gone(err: Exception) -> bool:
    return getattr(err, "status", None) == 410
