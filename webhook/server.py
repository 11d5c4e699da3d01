"""The HTTP side of the webhook: ``POST /mutate``, ``POST /validate-eviction``, health,
readiness, metrics.

The server knows one function type, :data:`Reviewer`: an AdmissionRequest in,
a :class:`~webhook.review.Verdict` out. It reads and caps the body, parses the
envelope, and turns every failure into an answer the apiserver and a person
can read: a 400/413 ``Status`` when there is no uid to answer to, otherwise an
AdmissionReview denial naming the problem. Never an aiohttp 500 page.
"""

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from webhook.limits import InFlight
from webhook.metrics import CONTENT_TYPE, WebhookMetrics
from webhook.review import (
    AdmissionRequest,
    AdmissionResponse,
    ReviewError,
    Verdict,
    parse_request,
    response_body,
)

log = logging.getLogger(__name__)

Reviewer = Callable[[AdmissionRequest], Awaitable[Verdict]]
NotReady = Callable[[], list[str]]
"""Names of whatever is not ready yet (caches not synced); empty when ready."""

MAX_BODY_BYTES = 3 * 1024 * 1024
"""Measured on kube-apiserver 1.34 (README, "The webhook under load"): the
largest pod etcd stored made a 2.4 MiB AdmissionReview (6,000 small
containers; 6,500 were refused, "request is too large"); 3,000 with
managedFields, 2.0 MiB; a one-container pod's review is 7-8x the manifest sent
(defaults, managedFields, envelope). A larger review is of a pod etcd would
refuse anyway."""
LARGE_BODY_BYTES = 256 * 1024
"""Reviews above this (pods of ~400 containers and up) count as large for
:class:`~webhook.limits.InFlight`."""
BUSY_MESSAGE = "headroom webhook busy, retry"
_UID = re.compile(rb'"uid"\s*:\s*"([^"\\]{1,128})"')
_UID_PREFIX_BYTES = 4096

JSON = "application/json"


def create_app(
    review: Reviewer,
    *,
    metrics: WebhookMetrics,
    in_flight: InFlight | None = None,
    not_ready: NotReady = list,
    max_body_bytes: int = MAX_BODY_BYTES,
    evictions: Reviewer | None = None,
) -> web.Application:
    """``evictions``: the reviewer of ``POST /validate-eviction`` (webhook.eviction)."""
    middlewares = [] if in_flight is None else [_admission_cap(in_flight, metrics)]
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    endpoints = _Endpoints(review, metrics, not_ready, max_body_bytes)
    app.router.add_post("/mutate", endpoints.mutate)
    if evictions is not None:
        app.router.add_post(
            "/validate-eviction", _Endpoints(evictions, metrics, not_ready, max_body_bytes).mutate
        )
    app.router.add_get("/healthz", endpoints.healthz)
    app.router.add_get("/readyz", endpoints.readyz)
    app.router.add_get("/metrics", endpoints.metrics)
    return app


def status_body(code: int, reason: str, message: str) -> bytes:
    """A ``meta/v1`` Status, the error shape every Kubernetes client understands."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return json.dumps(status).encode()


def _admission_cap(in_flight: InFlight, metrics: WebhookMetrics) -> Middleware:
    """Over the cap, an AdmissionReview denial, never a 500: failurePolicy is
    Fail, so the apiserver would refuse the pod anyway, and this way the
    ReplicaSet controller (or the user) reads why and retries."""

    @web.middleware
    async def cap(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        large = _maybe_large(request)
        if not in_flight.try_enter(large):
            return await _busy(request, metrics)
        try:
            return await handler(request)
        finally:
            in_flight.leave(large)

    return cap


def _maybe_large(request: web.Request) -> bool:
    """Large unless its length is known: a chunked body has no Content-Length, and
    a compressed one's is not the size aiohttp inflates it to (up to the body
    cap). kube-apiserver sends neither (client-go: a bytes.Reader, never a
    Content-Encoding), so this costs it nothing."""
    length = request.content_length
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    return length is None or length > LARGE_BODY_BYTES or encoding != "identity"


async def _busy(request: web.Request, metrics: WebhookMetrics) -> web.Response:
    # Only the head of the body: kube-apiserver writes request.uid first, and a
    # busy webhook should not buffer the rest (aiohttp discards it).
    head = b""
    while len(head) < _UID_PREFIX_BYTES and not request.content.at_eof():
        chunk = await request.content.read(_UID_PREFIX_BYTES - len(head))
        if not chunk:
            break
        head += chunk
    metrics.observe("busy", "", 0.0)
    uid = _head_uid(head)
    if uid is None:
        body = status_body(429, "TooManyRequests", BUSY_MESSAGE)
        return web.Response(status=429, body=body, content_type=JSON)
    denial = AdmissionResponse.deny(uid, 429, BUSY_MESSAGE)
    return web.Response(body=response_body(denial), content_type=JSON)


def _head_uid(head: bytes) -> str | None:
    """The first uid in the head of a body; None if there is none, or it is not
    UTF-8 (kube-apiserver's never is: its encoder writes valid UTF-8 only)."""
    match = _UID.search(head)
    try:
        return match[1].decode() if match is not None else None
    except UnicodeDecodeError:
        return None


class _Endpoints:
    def __init__(
        self, review: Reviewer, metrics: WebhookMetrics, not_ready: NotReady, max_body: int
    ) -> None:
        self._review = review
        self._metrics = metrics
        self._not_ready = not_ready
        self._max_body = max_body

    async def mutate(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > self._max_body:
            return self._too_large(request.content_length)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(None)
        started = time.perf_counter()
        code, payload, outcome, policy = await self._answer(body)
        self._metrics.observe(outcome, policy, time.perf_counter() - started)
        return web.Response(status=code, body=payload, content_type=JSON)

    async def _answer(self, body: bytes) -> tuple[int, bytes, str, str]:
        uid: str | None = None
        try:
            admission = parse_request(body)
            uid = admission.uid
            verdict = await self._review(admission)
            return 200, response_body(verdict.response), verdict.outcome, verdict.policy
        except ReviewError as err:
            log.info("bad AdmissionReview (uid %s): %s", err.uid, err)
            if err.uid is None:
                return 400, status_body(400, "BadRequest", str(err)), "bad-request", ""
            denial = AdmissionResponse.deny(err.uid, 400, f"headroom webhook: {err}")
            return 200, response_body(denial), "bad-request", ""
        except Exception as err:  # a bug must deny one pod, not crash the server
            log.exception("admission failed (uid %s)", uid)
            message = f"headroom webhook: internal error ({type(err).__name__}); see its log"
            if uid is None:
                return 400, status_body(400, "BadRequest", message), "error", ""
            return 200, response_body(AdmissionResponse.deny(uid, 500, message)), "error", ""

    def _too_large(self, length: int | None) -> web.Response:
        size = f"{length} bytes" if length is not None else "the body"
        message = f"{size} exceeds the {self._max_body}-byte limit for an AdmissionReview"
        self._metrics.observe("too-large", "", 0.0)
        return web.Response(
            status=413, body=status_body(413, "RequestEntityTooLarge", message), content_type=JSON
        )

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _: web.Request) -> web.Response:
        waiting = self._not_ready()
        if waiting:
            return web.Response(status=503, text=f"waiting for: {', '.join(waiting)}")
        return web.Response(text="ok")

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})
