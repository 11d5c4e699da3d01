"""One phase of the demo on a live cluster: create the workloads, watch them, clean up.

The agents' GPUNodeReports and the phase's pods and guard Events are polled a
few times a second (the agents write at most every ``--interval``, so polling
misses nothing); each new report is folded into a :class:`PhaseTimeline` at the
moment the agent measured it (``observedAt``), not when it was read.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from devcluster.scenario import WORKLOAD_LABEL, Object
from devcluster.timeline import GuardAction, PhaseTimeline, PodInfo
from headroom import names
from headroom.quantity import QuantityError, human_bytes, parse_bytes
from headroom.reports import parse_report

POLL_SECONDS = 0.5
PROGRESS_SECONDS = 3.0
GONE_TIMEOUT = 60.0

Progress = Callable[[str], None]


class DemoError(RuntimeError):
    """The demo could not run (as opposed to: it ran and the story did not happen)."""


@dataclass
class Apis:
    core: client.CoreV1Api
    apps: client.AppsV1Api
    custom: client.CustomObjectsApi

    @classmethod
    def of(cls, api: client.ApiClient) -> "Apis":
        return cls(client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api))

    def reports(self) -> list[Object]:
        return (
            raw(
                self.custom.list_cluster_custom_object,
                names.GROUP,
                names.VERSION,
                names.REPORT_PLURAL,
            ).get("items")
            or []
        )


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Object:
    """The wire JSON of a read (camelCase, as the apiserver sends it), not client models."""
    response = call(*args, _preload_content=False, **kwargs)
    body: Object = json.loads(response.data)
    return body


def run_phase(
    apis: Apis,
    phase: PhaseTimeline,
    *,
    namespace: Object,
    deployments: list[Object],
    duration: float,
    progress: Progress,
) -> PhaseTimeline:
    """Run the deployments in a fresh namespace for ``duration`` seconds, recording."""
    ns = namespace["metadata"]["name"]
    wait_namespace_gone(apis, ns, progress)
    # The client's typed models refuse plain JSON (e.g. integer resource amounts);
    # the apiserver takes it, so the dicts go as they are.
    apis.core.create_namespace(cast(Any, namespace))
    _wait_default_service_account(apis, ns)
    started = datetime.now(UTC)
    for deployment in deployments:
        apis.apps.create_namespaced_deployment(ns, cast(Any, deployment))
    progress(f"{phase.name}: created {', '.join(d['metadata']['name'] for d in deployments)}")
    recorder = _Recorder(apis, phase, ns, started)
    clock = time.monotonic()
    next_progress = clock + PROGRESS_SECONDS
    while (now := time.monotonic()) - clock < duration:
        recorder.poll()
        if now >= next_progress:
            progress(f"{phase.name} {now - clock:5.1f}s  {recorder.summary()}")
            next_progress = now + PROGRESS_SECONDS
        time.sleep(POLL_SECONDS)
    recorder.poll()
    recorder.finish()
    phase.duration = max(phase.duration, duration)
    return phase


def delete_namespace(apis: Apis, ns: str, progress: Progress) -> None:
    """Delete the phase's pods (their GPU memory with them), then the namespace.

    Gracefully: the node stops each pod and reports it stopped before it is removed.
    A forced deletion would leave the extender charging the pods for their grace
    period, as kubelet may still run them.
    """
    try:
        apis.apps.delete_collection_namespaced_deployment(ns)
        apis.core.delete_collection_namespaced_pod(ns)
        apis.core.delete_namespace(ns)
    except ApiException as err:
        if err.status != 404:
            raise
    deadline = time.monotonic() + GONE_TIMEOUT
    while raw(apis.core.list_namespaced_pod, ns).get("items"):
        if time.monotonic() > deadline:
            raise DemoError(f"the pods of namespace {ns} were not gone after {GONE_TIMEOUT:.0f}s")
        time.sleep(POLL_SECONDS)
    progress(f"deleted namespace {ns} and its pods")


def wait_namespace_gone(apis: Apis, ns: str, progress: Progress) -> None:
    try:
        apis.core.read_namespace(ns)
    except ApiException as err:
        if err.status == 404:
            return
        raise
    progress(f"namespace {ns} is left from an earlier run; deleting it")
    delete_namespace(apis, ns, progress)
    deadline = time.monotonic() + GONE_TIMEOUT
    while True:
        try:
            apis.core.read_namespace(ns)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise DemoError(f"namespace {ns} still terminating after {GONE_TIMEOUT:.0f}s")
        time.sleep(POLL_SECONDS)


def _wait_default_service_account(apis: Apis, ns: str) -> None:
    # The apiserver refuses pods until the namespace's "default" ServiceAccount exists.
    deadline = time.monotonic() + GONE_TIMEOUT
    while True:
        try:
            apis.core.read_namespaced_service_account("default", ns)
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


class _Recorder:
    """The polling state of one phase: pods seen, reports folded in, guard Events."""

    def __init__(self, apis: Apis, phase: PhaseTimeline, ns: str, started: datetime) -> None:
        self.apis, self.phase, self.ns, self.started = apis, phase, ns, started
        self.pods: dict[str, PodInfo] = {}
        self.pending: dict[str, str] = {}  # workload -> why its pod is not running
        self.seen_reports: set[tuple[str, str]] = set()
        self.guarded: dict[str, tuple[float, str]] = {}  # pod uid -> (t of Event, workload)
        self.live: set[str] = set()
        self.latest: dict[str, str] = {}

    def poll(self) -> None:
        self._poll_pods()
        self._poll_reports()
        self._poll_events()

    def _poll_pods(self) -> None:
        self.live = set()
        self.pending = {}
        for pod in raw(self.apis.core.list_namespaced_pod, self.ns).get("items") or []:
            meta, status = pod["metadata"], pod.get("status") or {}
            workload = (meta.get("labels") or {}).get(WORKLOAD_LABEL, "")
            if not workload:
                continue
            if not meta.get("deletionTimestamp"):
                self.live.add(meta["uid"])
            declared = _declared(meta.get("annotations") or {})
            node = (pod.get("spec") or {}).get("nodeName") or ""
            self.pods[meta["uid"]] = PodInfo(meta["uid"], meta["name"], workload, node, declared)
            if status.get("phase") != "Running":
                self.pending[workload] = _why_not_running(status)

    def _poll_reports(self) -> None:
        for obj in self.apis.reports():
            try:
                report = parse_report(obj)
            except ValidationError:
                continue  # the agent's problem; the extender reports it, the demo skips it
            key = (report.node_name, report.observed_at.isoformat())
            if key in self.seen_reports or report.observed_at < self.started:
                continue
            self.seen_reports.add(key)
            t = (report.observed_at - self.started).total_seconds()
            self.phase.observe(t, report, self.pods)
            for gpu in report.gpus:
                for usage in gpu.pods:
                    info = self.pods.get(usage.uid)
                    if info is not None:
                        refused = usage.starved_bytes or 0
                        state = f" STARVED {human_bytes(refused)}" if refused else ""
                        self.latest[info.workload] = (
                            f"{info.workload}@{report.node_name}/gpu{gpu.index} "
                            f"{human_bytes(usage.used_bytes)}{state}"
                        )

    def _poll_events(self) -> None:
        selector = f"reason={names.EVENT_REASON_OVER_MEMORY}"
        events = raw(self.apis.core.list_namespaced_event, self.ns, field_selector=selector)
        for event in events.get("items") or []:
            uid = str((event.get("involvedObject") or {}).get("uid") or "")
            info = self.pods.get(uid)
            if uid in self.guarded or info is None:
                continue
            when = _when(event.get("firstTimestamp") or event.get("eventTime"))
            self.guarded[uid] = ((when - self.started).total_seconds(), info.workload)

    def finish(self) -> None:
        for uid, (t, workload) in sorted(self.guarded.items(), key=lambda kv: kv[1]):
            evicted = uid not in self.live
            name = self.pods[uid].name
            self.phase.record_guard(GuardAction(t, workload, name, evicted=evicted))
        placed = {w for w, _ in self.phase.pods}
        for workload, why in self.pending.items():
            if workload not in placed:
                self.phase.unplaced[workload] = why

    def summary(self) -> str:
        parts = [self.latest[w] for w in sorted(self.latest)]
        parts += [f"{w}: {why}" for w, why in sorted(self.pending.items()) if w not in self.latest]
        if self.guarded:
            parts.append(f"guard acted on {len(self.guarded)} pod(s)")
        return " | ".join(parts) or "waiting for pods and agent reports"


def _declared(annotations: dict[str, str]) -> int | None:
    try:
        return parse_bytes(annotations[names.ANNOTATION_DECLARED_MEMORY])
    except (KeyError, QuantityError):
        return None


def _when(text: Any) -> datetime:
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return datetime.now(UTC)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _why_not_running(status: dict[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") != "True":
            return f"Pending: {condition.get('message') or condition.get('reason')}"
    return str(status.get("phase") or "not running")
