"""List-then-watch one kind of object into memory, as client-go's informers do.

The official client is synchronous, so each informer reads its watch on a
daemon thread and hands every event to the event loop; the cache is only
touched on the loop, so readers need no locks. A ``410 Gone`` or a dropped
watch re-lists, with capped exponential backoff between failures.
"""

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

Object = dict[str, Any]
ListFunc = Callable[..., Any]
Handler = Callable[[str, Object], None]
"""Called on the event loop with ``ADDED``/``MODIFIED``/``DELETED`` and the object."""

WATCH_WINDOW_SECONDS = 240
BACKOFF_MAX_SECONDS = 30.0
PAGE_SIZE = 500
"""Objects per list request, as client-go's reflector pages its lists."""
LIST_TIMEOUT_SECONDS = 60.0
"""A list that takes longer is abandoned and retried: a hung list must not blind the cache."""


def identity(obj: Object) -> Object:
    """Only what the informer itself needs of an object: its key and UID.

    For caches whose handlers keep what they use (the extender's claims, the
    webhook's parsed policies): an informer keeps every object it has seen, to
    replay a ``DELETED`` for each one a re-list no longer shows, and a pod as
    the apiserver sends it (managedFields, images, env, status) is tens of KiB
    (issue 8: about 27 KiB of heap per pod; 16-18k pods filled a 512Mi
    extender). The ``DELETED`` replayed after a re-list then carries this
    stub, which every such handler must read as "gone" by name or UID.
    """
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    return {"metadata": kept}


def object_key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


class Informer:
    """A cache of every object ``list_func`` returns, kept current by a watch.

    ``list_func`` is a bound client method such as ``CoreV1Api.list_node`` or
    ``functools.partial(CustomObjectsApi.list_cluster_custom_object, group, version, plural)``.
    """

    def __init__(
        self,
        list_func: ListFunc,
        *,
        name: str,
        handler: Handler | None = None,
        on_resync: Callable[[], None] | None = None,
        keep: Callable[[Object], Object] | None = None,
        **list_kwargs: Any,
    ) -> None:
        """``keep`` maps each object to what ``items`` stores (default: all of it;
        :func:`identity` for handlers that keep their own parsed copy)."""
        self.name = name
        self.items: dict[str, Object] = {}
        self.synced = asyncio.Event()
        self._list = list_func
        self._list_kwargs = list_kwargs
        self._handler = handler
        self._on_resync = on_resync
        self._keep = keep if keep is not None else (lambda obj: obj)
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.relists = 0
        self.failing_since: float | None = None
        """Monotonic time of the first failure since the last good list: the cache is
        blind from then on (events may be missed) until a list succeeds."""
        self.windows = 0
        """Watch windows the server closed and that were resumed without a re-list."""

    def start(self) -> None:
        """Start the watch thread; ``synced`` is set after the first full list."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def blind_for(self, now: float | None = None) -> float:
        """Seconds since the watch broke without a good list since (0 while watching)."""
        since = self.failing_since
        if since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    # --- the watch thread -------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                version = self._relist()
                failures = 0
                self.failing_since = None
                self._watch(version)
            except Exception as err:  # any failure means: back off, then re-list
                if self._stopping.is_set():
                    return
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
                self._stopping.wait(delay)

    def _relist(self) -> str:
        """List in pages of :data:`PAGE_SIZE`, each handed to the loop as it comes.

        One unpaged list of 20,000 pods is a few hundred MB of JSON and then of
        dicts, all alive at once (issue 8); pages keep one page alive. A
        continue token that expired (410) fails the list, which is retried
        from the start like any other failure.
        """
        seen: set[str] = set()
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"limit": PAGE_SIZE}
            if token:
                paging["_continue"] = token
            response = self._list(
                _preload_content=False,
                _request_timeout=LIST_TIMEOUT_SECONDS,
                **paging,
                **self._list_kwargs,
            )
            body = json.loads(response.data)
            objects = {object_key(o): o for o in body.get("items") or []}
            seen.update(objects)
            self._post(self._page, objects)
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                self._post(self._listed, seen)
                self.relists += 1
                return str(metadata.get("resourceVersion", ""))

    def _watch(self, version: str) -> None:
        """Watch from ``version`` until an error; a window the server closes
        resumes from the last version seen (bookmarks included), so a quiet
        cluster is not re-listed every few minutes."""

        def list_raw(**kwargs: Any) -> Any:
            # No docstring: the client then skips model deserialisation and
            # hands us the raw JSON object, which is all the caches need.
            return self._list(**kwargs)

        while not self._stopping.is_set():
            stream = watch.Watch()
            for event in stream.stream(
                list_raw,
                resource_version=version,
                timeout_seconds=WATCH_WINDOW_SECONDS,
                allow_watch_bookmarks=True,
                _request_timeout=WATCH_WINDOW_SECONDS + 30,
                **self._list_kwargs,
            ):
                if self._stopping.is_set():
                    stream.stop()
                    return
                kind = event.get("type")
                obj = event.get("raw_object") or event.get("object")
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    raise ApiException(status=code or 500, reason=str(obj))
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                    self._post(self._apply, kind, obj)
            version = stream.resource_version or version
            self.windows += 1

    def _post(self, func: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(func, *args)

    # --- on the event loop --------------------------------------------------

    def _replace(self, objects: dict[str, Object]) -> None:
        """A whole list at once (one page): what :meth:`_relist` does in pages."""
        self._page(objects)
        self._listed(set(objects))

    def _page(self, objects: dict[str, Object]) -> None:
        for key, obj in objects.items():
            kind = self._replaced(key, obj)
            self.items[key] = self._keep(obj)
            if self._handler:
                self._handler(kind, obj)

    def _listed(self, seen: set[str]) -> None:
        """The list is complete: objects it did not show are gone."""
        for key in self.items.keys() - seen:
            old = self.items.pop(key)
            if self._handler:
                self._handler("DELETED", old)
        if self._on_resync:
            self._on_resync()
        self.synced.set()

    def _apply(self, kind: str, obj: Object) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            self.items.pop(key, None)
        else:
            kind = "ADDED" if self._replaced(key, obj) == "ADDED" else kind
            self.items[key] = self._keep(obj)
        if self._handler:
            self._handler(kind, obj)

    def _replaced(self, key: str, obj: Object) -> str:
        """``MODIFIED`` for the same object, else ``ADDED`` -- after a ``DELETED`` for the
        object that had this name before, when the name now belongs to another UID.

        A pod recreated under the same name (a StatefulSet's) is another pod: a
        re-list that sees only the new one must not leave the old one's charge.
        """
        old = self.items.get(key)
        if old is None:
            return "ADDED"
        if _uid(old) != _uid(obj):
            self.items.pop(key)
            if self._handler:
                self._handler("DELETED", old)
            return "ADDED"
        return "MODIFIED"


def _uid(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _describe(err: Exception) -> str:
    """One line: ApiException's own text spans several (headers, body)."""
    if isinstance(err, ApiException):
        return f"{err.status} {' '.join(str(err.reason).split())}"[:300]
    return f"{type(err).__name__}: {err}"[:300]


def _is_gone(err: Exception) -> bool:
    return isinstance(err, ApiException) and err.status == 410
