"""The agent's loop: every interval, measure, attribute, report, guard.

:class:`Agent` is one tick and the loop around it, over injected parts (probe,
reporter, guard, pod actions), so tests drive it without a cluster.
:func:`serve` wires the real parts: a pod informer limited to this node
(``spec.nodeName``), GPUSharingPolicy and Namespace informers for the guard
(a pod's policy is its namespace's label, never its own annotation), the node's
labels for the simulated backend, kubelet's PodResources socket for the nvml
one (which GPU each pod was given, :mod:`agent.allocations`) and for the
simulated one in host-process mode (:mod:`agent.simulated`), and the HTTP port.

Nothing here raises out of the loop: a failed tick is logged and the next one
runs on time, so the DaemonSet pod never crash-loops on a GPU or API problem.
"""

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from aiohttp import web
from kubernetes import client

from agent.allocations import Allocations, KubeletAllocations, with_allocations
from agent.attribution import Resolver, build_status
from agent.caches import NodeCache, PolicyCache
from agent.cgroups import container_of_pid
from agent.client import PodActions, ReportWriter
from agent.gpuspec import GPUSpec
from agent.guard import Guard, Namespace, Verdict, declarations
from agent.nvml import NvmlProbe
from agent.podresources import DEFAULT_SOCKET, PodResourcesClient
from agent.probe import BackendName, Probe, ProbeUnavailable, Snapshot
from agent.processes import main_processes
from agent.reporter import Reporter, WritePolicy
from agent.server import AgentMetrics, create_app
from agent.simulated import SimulatedProbe
from headroom import names
from headroom.policy import GPUSharingPolicy
from headroom.reports import SCHEMA_VERSION, ReportStatus, parse_report
from kube.informer import Informer
from serving.site import serve_plain

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
SimProcesses = Literal["none", "host"]
"""Simulated backend: ``none`` names pods directly (KWOK nodes run no process);
``host`` reports the real host pids of the pods' containers (a real node)."""


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    backend: BackendName = "nvml"
    interval_seconds: float = 5.0
    proc_root: Path = Path("/proc")
    sim_spec: GPUSpec | None = None
    sim_processes: SimProcesses = "none"
    write_policy: WritePolicy = field(default_factory=WritePolicy)
    grace: int = 2
    port: int = 0
    """HTTP port for /healthz /readyz /metrics; 0 serves none."""
    host: str = "0.0.0.0"
    """Address for that port: all interfaces in a Pod, 127.0.0.1 on a laptop."""
    nvml_retry_seconds: float = 60.0
    pod_resources_socket: str = DEFAULT_SOCKET
    """kubelet's PodResources socket, asked each tick which GPU each pod was given
    (nvml backend, or simulated with host processes; on a KWOK node the simulation
    decides that itself); "" asks nothing."""

    @property
    def asks_kubelet(self) -> bool:
        """Whether a kubelet with its device plugin runs on this node to be asked."""
        real = self.backend == "nvml" or self.sim_processes == "host"
        return real and bool(self.pod_resources_socket)


class Actions(Protocol):
    def record_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str
    ) -> None: ...

    def evict(self, namespace: str, name: str, uid: str, grace: int) -> bool: ...

    def delete(self, namespace: str, name: str, uid: str, grace: int) -> None: ...


class Agent:
    def __init__(
        self,
        *,
        node_name: str,
        probe: Probe,
        reporter: Reporter,
        guard: Guard,
        actions: Actions,
        pods: Callable[[], Mapping[str, Pod]],
        policies: Callable[[], Mapping[str, GPUSharingPolicy]] = dict,
        namespaces: Callable[[], Mapping[str, Namespace]] = dict,
        resolve: Resolver = lambda pid: None,
        allocations: Callable[[Mapping[str, Pod]], Awaitable[Allocations]] | None = None,
        unlisted: Callable[[], Mapping[str, int]] = dict,
        replicas: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        previous: ReportStatus | None = None,
    ) -> None:
        """``unlisted`` and ``replicas``: per GPU, what kubelet's last answer said
        (:class:`agent.allocations.KubeletAllocations`), read after ``allocations``.
        ``previous``: the node's report as stored when the agent (re)started
        (:func:`stored_report`), whose figures the first ticks carry for a GPU NVML
        cannot read, as later ticks carry the last tick's."""
        self._node_name = node_name
        self._probe = probe
        self.reporter = reporter
        self._guard = guard
        self._actions = actions
        self._pods = pods
        self._policies = policies
        self._namespaces = namespaces
        self._resolve = resolve
        self._allocations = allocations
        self._unlisted = unlisted
        self._replicas = replicas
        self.metrics = metrics or AgentMetrics()
        self._clock = clock
        self.last: ReportStatus | None = None
        self._stored = (
            previous if previous is not None and previous.node_name == node_name else None
        )
        self.last_tick_at: float | None = None
        """When (monotonic) the last tick finished."""
        self.ticking_since: float | None = None
        """When (monotonic) :meth:`run` started its first tick."""
        self._failure_reason: str | None = None

    async def tick(self) -> ReportStatus:
        # Before any read: a report dated after a slow one (NVML hung on a GPU, a
        # slow kubelet) would pass figures read long ago as fresh to the extender.
        observed_at = self._clock()
        pods = {str((p.get("metadata") or {}).get("uid")): p for p in self._pods().values()}
        snapshot: Snapshot | None = None
        failure: ProbeUnavailable | None = None
        # Asked first: the simulated backend on a real node places pods where kubelet did.
        allocations = await self._allocations(pods) if self._allocations is not None else {}
        try:
            if self._probe.blocking:
                snapshot = await asyncio.to_thread(self._probe.snapshot)
            else:
                snapshot = self._probe.snapshot()
        except ProbeUnavailable as err:
            failure = err
        if snapshot is not None:
            snapshot = with_allocations(snapshot, allocations, self._unlisted(), self._replicas())
        self._note_availability(failure)
        status = build_status(
            node_name=self._node_name,
            backend=self._probe.name,
            observed_at=observed_at,
            snapshot=snapshot,
            failure=failure,
            pods=pods,
            resolve=self._resolve,
            # A restarted agent has no last tick: a GPU NVML fails to read (or every
            # GPU, NVML down) would be written with zero figures over the ones the
            # stored report carries, and an extender restarted since would read an
            # empty GPU (agent.attribution).
            previous=self.last if self.last is not None else self._stored,
            # Rounded up: the report says the agent rewrites it at least this often, and
            # the CRD takes whole seconds from 1 (0.4 s rounded was 0: no report built).
            heartbeat_seconds=math.ceil(self.reporter.policy.heartbeat_seconds),
        )
        self.last = status
        self._observe(status, failure is None)
        errors = self.reporter.errors
        if await self.reporter.offer(status, declarations(pods)):
            self.metrics.report_writes.labels("ok").inc()
        elif self.reporter.errors > errors:
            self.metrics.report_writes.labels("error").inc()
        if snapshot is not None:
            for verdict in self._guard.observe(status, pods, self._policies(), self._namespaces()):
                await self._act(verdict)
        self.last_tick_at = time.monotonic()
        return status

    def stalled(self, limit_seconds: float) -> bool:
        """No tick has finished for ``limit_seconds``: since the last one, or since the
        first one started (NVML hung on the very first read is a stall too; the guard
        is off while it lasts). Before :meth:`run` starts (the pod cache syncing from
        a slow apiserver) nothing is stalled."""
        since = self.last_tick_at if self.last_tick_at is not None else self.ticking_since
        return since is not None and time.monotonic() - since >= limit_seconds

    async def run(self, stop: asyncio.Event, interval_seconds: float) -> None:
        if self.ticking_since is None:
            self.ticking_since = time.monotonic()
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # a bug or an unforeseen API shape: log, keep measuring
                log.exception("tick failed")
            remaining = max(interval_seconds - (time.monotonic() - started), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=remaining)
        self._probe.close()

    def _note_availability(self, failure: ProbeUnavailable | None) -> None:
        """One log line per change, however many ticks it lasts."""
        reason = failure.reason if failure else None
        if reason == self._failure_reason:
            return
        if failure is not None:
            log.error(
                "%s backend unavailable (%s): %s -- reporting %s=False and retrying",
                self._probe.name,
                failure.reason,
                failure.message,
                "NVMLAvailable",
            )
        else:
            log.info("%s backend measuring", self._probe.name)
        self._failure_reason = reason

    def _observe(self, status: ReportStatus, available: bool) -> None:
        self.metrics.ticks.inc()
        self.metrics.probe_available.set(1 if available else 0)
        self.metrics.gpus_unread.set(sum(1 for gpu in status.gpus if gpu.error))
        for gpu in status.gpus:
            self.metrics.gpu_used.labels(str(gpu.index), gpu.uuid).set(gpu.used_bytes)
            self.metrics.gpu_total.labels(str(gpu.index), gpu.uuid).set(gpu.total_bytes)

    async def _act(self, verdict: Verdict) -> None:
        where = f"{verdict.namespace}/{verdict.name}"
        try:
            if verdict.kind == "event":
                log.warning("pod %s %s", where, verdict.message)
                await asyncio.to_thread(
                    self._actions.record_event,
                    verdict.namespace,
                    verdict.name,
                    verdict.uid,
                    names.EVENT_REASON_OVER_MEMORY,
                    verdict.message,
                )
                self.metrics.guard_actions.labels("event").inc()
                return
            evicted = await asyncio.to_thread(
                self._actions.evict, verdict.namespace, verdict.name, verdict.uid, verdict.grace
            )
            if not evicted:
                # A PodDisruptionBudget refused: the tenant may write one over their own
                # pod, and would so switch the guard off. The namespace's policy says
                # evict, so the pod is deleted, PDB or not.
                log.warning(
                    "eviction of pod %s refused by a PodDisruptionBudget; deleting it: "
                    "its namespace's policy is guard: evict",
                    where,
                )
                self.metrics.guard_actions.labels("evict-refused").inc()
                await asyncio.to_thread(
                    self._actions.delete,
                    verdict.namespace,
                    verdict.name,
                    verdict.uid,
                    verdict.grace,
                )
                log.warning("deleted pod %s: %s", where, verdict.message)
                self.metrics.guard_actions.labels("delete").inc()
                return
        except Exception as err:  # the API is down or refused: next episode tries again
            log.warning("guard %s on pod %s failed: %s", verdict.kind, where, err)
            self.metrics.guard_actions.labels("error").inc()
            if verdict.kind == "evict":
                self._guard.eviction_refused(verdict.uid)
            else:
                self._guard.event_failed(verdict.uid)
            return
        log.warning("evicted pod %s: %s", where, verdict.message)
        self.metrics.guard_actions.labels("evict").inc()


async def serve(config: AgentConfig, api: client.ApiClient, stop: asyncio.Event) -> None:
    """Run the agent for ``config.node_name`` until ``stop`` is set."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pod_informer = Informer(
        core.list_pod_for_all_namespaces,
        name="pods",
        field_selector=f"spec.nodeName={config.node_name}",
    )
    policy_cache = PolicyCache()
    policy_informer = Informer(
        functools.partial(
            custom.list_cluster_custom_object,
            names.GROUP,
            names.VERSION,
            names.POLICY_PLURAL,
        ),
        name="policies",
        handler=policy_cache.on_event,
    )
    # Cluster-scoped, so keyed by name; the guard reads each one's policy label.
    namespace_informer = Informer(core.list_namespace, name="namespaces")
    tasks: list[asyncio.Task[None]] = []
    waits = [pod_informer.synced]
    kubelet = None
    if config.asks_kubelet:
        # Bounded well inside a tick: a stuck kubelet delays the report, never skips it.
        timeout = min(2.0, config.interval_seconds / 2)
        kubelet = KubeletAllocations(
            PodResourcesClient(config.pod_resources_socket, timeout_seconds=timeout)
        )
    probe: Probe
    if config.backend == "simulated":
        node_cache = NodeCache(core, config.node_name)
        if config.sim_spec is None:  # GPUs from the node's labels
            tasks.append(asyncio.create_task(node_cache.run(stop)))
            waits.append(node_cache.tried)
        probe = SimulatedProbe(
            config.node_name,
            pods=lambda: list(pod_informer.items.values()),
            node=lambda: node_cache.node,
            spec=config.sim_spec,
            # Scans /proc on the event loop, where the pod cache is safe to read:
            # about 0.1 ms a process (9 ms for 90 on the 2-core dev VM), mostly the
            # kernel writing each cgroup file; fine for a test node every 2 s.
            host_processes=(
                functools.partial(main_processes, config.proc_root)
                if config.sim_processes == "host"
                else None
            ),
            allocations=(lambda: kubelet.latest) if kubelet is not None else dict,
        )
    else:
        probe = NvmlProbe(retry_seconds=config.nvml_retry_seconds)
    writer = ReportWriter(api)
    agent = Agent(
        node_name=config.node_name,
        probe=probe,
        reporter=Reporter(writer, config.write_policy),
        guard=Guard(config.grace),
        actions=PodActions(api, config.node_name),
        pods=lambda: pod_informer.items,
        policies=lambda: policy_cache.policies,
        namespaces=lambda: namespace_informer.items,
        resolve=functools.partial(container_of_pid, proc_root=config.proc_root),
        allocations=kubelet.read if kubelet is not None else None,
        unlisted=(lambda: kubelet.unlisted) if kubelet is not None else dict,
        replicas=(lambda: kubelet.replicas) if kubelet is not None else dict,
        previous=await asyncio.to_thread(stored_report, writer, config.node_name),
    )
    pod_informer.start()
    policy_informer.start()
    namespace_informer.start()
    runner = await _start_http(agent, pod_informer, config) if config.port else None
    try:
        # The first report waits for the pod list (without it every process
        # would read as unattributed) and, simulated, for the node's labels.
        for event in waits:
            await _wait(event, stop)
        log.info(
            "agent for node %s: %s backend%s, every %.1fs",
            config.node_name,
            probe.name,
            " (host processes)" if config.sim_processes == "host" else "",
            config.interval_seconds,
        )
        await agent.run(stop, config.interval_seconds)
    finally:
        pod_informer.stop()
        policy_informer.stop()
        namespace_informer.stop()
        for task in tasks:
            task.cancel()
        if kubelet is not None:
            await kubelet.close()
        if runner is not None:
            await runner.cleanup()


def stored_report(writer: ReportWriter, node_name: str) -> ReportStatus | None:
    """The node's GPUNodeReport as stored now, if one is there and readable: what a
    restarted agent's first ticks carry for GPUs NVML cannot read. Never fails."""
    try:
        obj = writer.read(node_name)
        if obj is None:
            return None
        report = parse_report(obj)
    except Exception as err:  # the API down, a report of an older shape: start empty
        log.warning("cannot read the stored GPUNodeReport of %s: %s", node_name, err)
        return None
    if report.schema_version != SCHEMA_VERSION or report.node_name != node_name:
        return None
    return report


async def _wait(event: asyncio.Event, stop: asyncio.Event) -> None:
    synced = asyncio.create_task(event.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({synced, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (synced, stopped):
        task.cancel()


async def _start_http(agent: Agent, pods: Informer, config: AgentConfig) -> web.AppRunner:
    stall = 3 * config.interval_seconds + 30

    def healthy() -> bool:
        return not agent.stalled(stall)

    def ready() -> bool:
        return pods.synced.is_set() and agent.last is not None

    # Any pod can reach the port (without the networkpolicy component): its
    # connections are capped, per client too.
    app = create_app(agent.metrics, healthy=healthy, ready=ready)
    runner, _ = await serve_plain(
        app, config.host, config.port, component="agent", registry=agent.metrics.registry
    )
    log.info("serving /healthz /readyz /metrics on %s:%d", config.host, config.port)
    return runner
