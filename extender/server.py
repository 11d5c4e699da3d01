"""The extender's HTTP shell: read a capped body, validate the wire model, call a verb.

kube-scheduler treats any status but 200 as a transport error and drops the
message, so a request it sent that we cannot use is answered 200 with
``Error`` (filter, bind) where the protocol has one; a body that is not JSON
at all gets 400. Nothing reaches the client as a 500: an unexpected exception
is logged and answered like a bad request, with the exception's type.
"""

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from pydantic import BaseModel

from extender.preemption import PreemptionError
from extender.state import ClusterState
from extender.verbs import CandidateError, Extender
from extender.wire import (
    BadShape,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    NotJSON,
    parse,
)
from headroom.accounting import REPORT_FAULTS, report_fault

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20
"""Room for a NodeList of some thousands of nodes (``nodeCacheCapable: false``)."""
JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Answered = tuple[web.Response, str]
"""A response and its outcome label for the metrics."""
Answer = Callable[[bytes], Awaitable[Answered]]


OUTCOMES = {
    "filter": ("ok", "error", "bad-request", "not-json", "too-large", "internal-error"),
    "prioritize": ("ok", "bad-request", "not-json", "too-large", "internal-error"),
    "bind": ("ok", "refused", "bad-request", "not-json", "too-large", "internal-error"),
    "preempt": ("ok", "no-victims", "bad-request", "not-json", "too-large", "internal-error"),
}
"""Each verb's outcomes (the ``outcome`` label of ``headroom_extender_requests_total``)."""


class Metrics:
    def __init__(self, extender: Extender) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "headroom_extender_requests",
            "Scheduler requests by verb and outcome",
            ["verb", "outcome"],
            registry=self.registry,
        )
        for verb, outcomes in OUTCOMES.items():
            for outcome in outcomes:
                # Exported at 0: rate() of a series whose first sample is already 1
                # misses that error (HeadroomExtenderErrors would wait for a second).
                self.requests.labels(verb, outcome)
        self.latency = Histogram(
            "headroom_extender_request_seconds",
            "Time to answer a scheduler request",
            ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0),
            registry=self.registry,
        )
        watch_lag = Histogram(
            "headroom_extender_watch_lag_seconds",
            "Time from a successful bind to the pod watch showing the pod bound",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=self.registry,
        )
        extender.state.observe_watch_lag = watch_lag.observe
        assumed = Gauge(
            "headroom_extender_assumed_pods",
            "Pods held on a node by a filter or a bind, not yet seen bound in the pod cache",
            registry=self.registry,
        )
        assumed.set_function(lambda: len(extender.state.assumed))
        nodes = Gauge(
            "headroom_extender_nodes", "Nodes in the extender's cache", registry=self.registry
        )
        nodes.set_function(lambda: len(extender.state.nodes))
        ready = Gauge(
            "headroom_extender_ready",
            "1 when /readyz answers 200: every watch listed and none blind, the restart wait over",
            registry=self.registry,
        )
        ready.set_function(lambda: float(extender.ready() and extender.starting() is None))
        answering = Gauge(
            "headroom_extender_answering",
            "1 when filter and bind answer now: ready, and this pod's kube-scheduler holds "
            "the lease with any takeover wait over (extender.leadership); one replica in all",
            registry=self.registry,
        )
        answering.set_function(lambda: float(extender.ready() and extender.waiting() is None))
        self.registry.register(UnmeasuredNodes(extender.state))


class UnmeasuredNodes(Collector):
    """``headroom_extender_gpu_nodes_unmeasured{reason}``: GPU nodes charged by declaration
    rather than measured, by :func:`headroom.accounting.report_fault` (every reason, 0 when
    none). Worked out at each scrape from the reports the state holds: a few thousand
    comparisons, nothing cached to drift."""

    NAME = "headroom_extender_gpu_nodes_unmeasured"
    HELP = (
        "GPU nodes whose GPUNodeReport is missing, stale or faulty, so some or all of their "
        "GPUs are charged by declaration (pods may wait), by reason"
    )

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=["reason"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self.state
        counts = dict.fromkeys(REPORT_FAULTS, 0)
        now = state.clock()
        for name, node in state.nodes.items():
            if not node.count:
                continue  # no GPUs a report would measure
            fault = report_fault(
                node, state.reports.get(name), now=now, stale_after=state.stale_after
            )
            if fault is not None:
                counts[fault] += 1
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["reason"])
        for reason, count in counts.items():
            family.add_metric([reason], count)
        yield family


METRICS = web.AppKey("metrics", Metrics)


def make_app(extender: Extender, *, max_body: int = MAX_BODY_BYTES) -> web.Application:
    metrics = Metrics(extender)
    app = web.Application(client_max_size=max_body, middlewares=[_never_500])
    app[METRICS] = metrics

    def verb(name: str, answer: Answer, *, has_error: bool = True) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                # Filter and bind carry an Error field the scheduler logs; prioritize does not.
                message = f"request body over {max_body} bytes"
                response, outcome = _error(message, 200 if has_error else 413), "too-large"
            else:
                try:
                    response, outcome = await answer(body)
                except Exception as err:
                    # As the protocol says errors: filter and bind in their Error field,
                    # prioritize and preempt by the status alone. A 200 preempt answer
                    # kube-scheduler reads as "no node can be freed", dropping the Error.
                    response = _internal(request, err, 200 if has_error else 400)
                    outcome = "internal-error"
            metrics.requests.labels(name, outcome).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - started)
            return response

        return handle

    async def filter_(body: bytes) -> Answered:
        try:
            args = parse(ExtenderArgs, body)
        except NotJSON as err:
            return _error(str(err), 400), "not-json"
        except BadShape as err:
            bad = ExtenderFilterResult(NodeNames=[], Error=f"ExtenderArgs: {err}")
            return _model(bad), "bad-request"
        result = extender.filter(args)
        return _model(result), "error" if result.Error else "ok"

    async def prioritize(body: bytes) -> Answered:
        try:
            answer = extender.prioritize(parse(ExtenderArgs, body))
        except NotJSON as err:
            return _error(str(err), 400), "not-json"
        except (BadShape, CandidateError) as err:
            # The protocol's answer is a bare list: no room for an error but the status.
            return _error(f"ExtenderArgs: {err}", 400), "bad-request"
        return web.Response(body=answer, content_type=JSON), "ok"

    async def bind(body: bytes) -> Answered:
        try:
            args = parse(ExtenderBindingArgs, body)
        except NotJSON as err:
            return _error(str(err), 400), "not-json"
        except BadShape as err:
            bad = ExtenderBindingResult(Error=f"ExtenderBindingArgs: {err}")
            return _model(bad), "bad-request"
        result = await extender.bind(args)
        return _model(result), "refused" if result.Error else "ok"

    async def preempt(body: bytes) -> Answered:
        try:
            result = await extender.preempt(parse(ExtenderPreemptionArgs, body))
        except NotJSON as err:
            return _error(str(err), 400), "not-json"
        except (BadShape, PreemptionError) as err:
            # The result has no Error field: a non-200 status is the only way to say it.
            return _error(f"ExtenderPreemptionArgs: {err}", 400), "bad-request"
        return _model(result), "ok" if result.NodeNameToMetaVictims else "no-victims"

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if not extender.ready():
            return web.Response(text="caches not synced\n", status=503)
        if (why := extender.starting()) is not None:
            return web.Response(text=why + "\n", status=503)
        return web.Response(text="ok\n")

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def state(request: web.Request) -> web.Response:
        only = request.query.get("node")
        return web.json_response(state_view(extender, only), dumps=_dumps)

    app.router.add_post("/filter", verb("filter", filter_))
    app.router.add_post("/prioritize", verb("prioritize", prioritize, has_error=False))
    app.router.add_post("/bind", verb("bind", bind))
    app.router.add_post("/preempt", verb("preempt", preempt, has_error=False))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/state", state)
    return app


METRICS_RENDER_SECONDS = 1.0
"""The pod-network listener renders its page at most this often and serves the last
page in between."""


def metrics_app(
    metrics: Metrics, *, clock: Callable[[], float] = time.monotonic
) -> web.Application:
    """``/metrics`` alone, for a listener on the pod network (``--metrics-port``): the
    verbs stay on 127.0.0.1, since /bind binds with the ServiceAccount's rights and no
    authentication, and /state lists every node's accounting.

    The page is rendered on the event loop that answers filter and bind (34 ms at
    5,000 eight-GPU nodes), and any pod may reach this port where the NetworkPolicy
    component is not used: so it is rendered at most once per
    :data:`METRICS_RENDER_SECONDS`, however many scrapes come."""
    page = b""
    rendered = -float("inf")

    async def metrics_page(request: web.Request) -> web.Response:
        nonlocal page, rendered
        now = clock()
        if now - rendered >= METRICS_RENDER_SECONDS:
            page, rendered = generate_latest(metrics.registry), now
        return web.Response(body=page, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=4096, middlewares=[_never_500])
    app.router.add_get("/metrics", metrics_page)
    return app


def state_view(extender: Extender, only: str | None = None) -> dict[str, Any]:
    """The accounting as JSON: what ``/state`` serves and ``headroom top`` prints."""
    state = extender.state
    now = state.clock()
    state.refresh(now)
    names = [only] if only else sorted(state.nodes)
    nodes = {}
    for name in names:
        account = state.account(name, now)
        if account is not None:
            nodes[name] = dataclasses.asdict(account)
    return {
        "ready": extender.ready(),
        "marginBytes": state.margin,
        "staleAfterSeconds": state.stale_after,
        "assumed": {
            claim.key: sorted(holds)
            for holds in state.assumed.values()
            for claim, *_ in list(holds.values())[:1]
        },
        "nodes": nodes,
    }


@web.middleware
async def _never_500(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as err:
        return _internal(request, err, 200)


def _internal(request: web.Request, err: Exception, status: int) -> web.Response:
    log.exception("%s %s failed", request.method, request.path, exc_info=err)
    return _error(f"headroom extender internal error: {type(err).__name__}: {err}", status)


def _model(model: BaseModel) -> web.Response:
    return web.Response(body=model.__pydantic_serializer__.to_json(model), content_type=JSON)


def _error(message: str, status: int) -> web.Response:
    return web.Response(body=json.dumps({"Error": message}), status=status, content_type=JSON)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)
