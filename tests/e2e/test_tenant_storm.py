"""Many tenants at once onto 8-GPU servers where memory, not slots, runs out first.

The other storms here cannot over-commit a GPU whatever the extender does:
8Gi pods on four replicas of a 40 GiB GPU run out of slots first, and on a
one-GPU node kube-scheduler's own count of ``headroom.dev/gpu-memory`` is the
GPU's. This one can. Four KWOK servers, each with eight A100-40GB of eight
time-slicing replicas (64 slots, 316 GiB), and each with its simulated agent,
which hands every pod a GPU as NVIDIA's device plugin does (the GPU holding
the fewest pods, whatever their memory). Then tenants in many policy
namespaces create pods of mixed sizes, from 3 to 20 GiB, all at once through
the webhook, about 1.2 times what the GPUs hold: only the extender's per-GPU
accounting (declared memory, and the device plugin's choice bounded for pods
not yet located) stands between them and an over-committed GPU.

The verdict is read from where the agents put the pods and from each pod's
immutable ``headroom.dev/gpu-memory``, never from Headroom's own state: no GPU
holds more declared memory than it has less the margin, and no pod was
refused memory it asked for (the simulated backend's ``starvedBytes``, what a
real workload would see as CUDA out-of-memory). And once every bound pod is
located, no pod waits that a server has room for by the device plugin's own
rule (:meth:`Snapshot.largest_fit`): pods refused while others were not yet
located are retried, and the extender charges no more than that rule needs.
That rule, not the extender, is what leaves room unused: with 3-20 GiB pods
the plugin balances pods, not memory, so a server's next pod may land on its
fullest GPU. ``HEADROOM_TENANT_STORM_NODES``, ``_TENANTS`` and ``_PODS`` size it.

The same storm is then run again with a fault struck while it is bound: the
extender frozen past kube-scheduler's httpTimeout with binds in flight, and
the extender killed and started again (both at the storm's first bind, every
pod created while headroom-scheduler was stopped, since a storm binds what
fits in a second or two); one server's agent stalled until its report is
stale, and a quarter of the tenants deleting their pods (once
:data:`FAULT_AFTER` pods are bound). On one-GPU nodes kube-scheduler's own count of
``headroom.dev/gpu-memory`` backs the extender up through such faults; here the
extender alone holds the line. Each test checks that its fault took effect, and
a watcher reads the verdict every few seconds during the storm as well as at
its end.
"""

import datetime
import itertools
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from devcluster import nodes
from devcluster.cluster import Cluster
from devcluster.kubectl import wait_until
from headroom import names
from headroom.claims import parse_claim
from tests.e2e.workloads import GIB, MIB, eventually, extender_state

NODES = int(os.environ.get("HEADROOM_TENANT_STORM_NODES", "4"))
TENANTS = int(os.environ.get("HEADROOM_TENANT_STORM_TENANTS", "40"))
PODS = int(os.environ.get("HEADROOM_TENANT_STORM_PODS", "160"))
GPUS_PER_NODE = 8
REPLICAS = 8
A100_MIB = 40960
SIZES_GIB = (3, 5, 7, 9, 12, 15, 20)
"""Declared per pod, in turn: 10.1 GiB on average, so 160 pods ask 1.28 times what
32 GPUs hold, and 160 < 256 slots: memory runs out first."""
LABEL = "headroom.dev/e2e-tenant-storm"
TAINT = "headroom.dev/e2e-tenant-storm"
CREATORS = 8
"""Tenants creating their pods at the same time (each a kubectl of its own)."""
FAULT_AFTER = 20
"""Pods bound when a fault strikes: the storm is under way, most of it still to bind
(about 100 of the 160 pods fit)."""
FREEZE_SECONDS = 7.0
"""Longer than the extender's httpTimeout (5 s): what is in flight then times out."""
SCHEDULER = "headroom-scheduler"
APISERVER_STALL = 2.0
"""Seconds the apiserver is stopped before the extender freezes."""
_runs = itertools.count()
"""Each test's servers and namespaces are named afresh: the last test's are still
going away (namespaces Terminating, pods the extender still charges)."""


@pytest.fixture
def servers(cluster: Cluster) -> Iterator[list[str]]:
    template = next(spec for spec in nodes.load() if spec.name == "a100-shared-0")
    labels = {
        **template.labels,
        names.LABEL_COUNT: str(GPUS_PER_NODE),
        names.LABEL_REPLICAS: str(REPLICAS),
        "nvidia.com/device-plugin.config": f"slice-{REPLICAS}",
        LABEL: "true",
    }
    capacity = {
        **template.capacity,
        names.GPU_SHARED: str(GPUS_PER_NODE * REPLICAS),
        "cpu": "256",
        "memory": "2Ti",
        "pods": "250",
    }
    added = []
    run = next(_runs)
    try:
        for i in range(NODES):
            spec = nodes.NodeSpec(
                name=f"tenant-storm-{run}-{i}",
                labels={**labels, names.LABEL_MEMORY_MIB: str(A100_MIB)},
                capacity=capacity,
                taints=[nodes.Taint(key=TAINT, value="true", effect="NoSchedule")],
            )
            cluster.add_node(spec)
            added.append(spec.name)

        def reported() -> bool:
            listed = cluster.kubectl_json("get", names.REPORT_PLURAL)["items"]
            return {r["metadata"]["name"] for r in listed} >= set(added)

        eventually("a GPUNodeReport for every server", reported, timeout=60)
        yield added
    finally:
        for name in added:
            cluster.remove_node(name)


@pytest.fixture
def tenants(cluster: Cluster) -> Iterator[list[str]]:
    run = f"{os.getpid()}-{next(_runs)}"
    spaces = [f"tenant-{i:03d}-{run}" for i in range(TENANTS)]
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {names.LABEL_POLICY: "gpu-shared"}},
            }
            for ns in spaces
        ]
    )
    try:
        # Pods are refused until each namespace's "default" ServiceAccount exists.
        eventually(
            f"ServiceAccount default in {TENANTS} namespaces",
            lambda: len(_accounts(cluster, spaces)) == TENANTS,
            timeout=max(60, TENANTS / 5),
        )
        yield spaces
    finally:
        for ns in spaces:
            cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false", check=False)
        eventually(
            "the tenants' pods gone",
            lambda: not _storm_pods(cluster, spaces),
            timeout=max(180, PODS / 2),
        )
        cluster.kubectl("delete", "namespace", *spaces, "--wait=false", check=False)


def test_tenants_at_once_on_eight_gpu_servers_over_commit_no_gpu(
    cluster: Cluster, servers: list[str], tenants: list[str]
) -> None:
    storm = Storm(cluster, servers, tenants)
    storm.run()
    storm.check()
    print(f"\ntenant storm: {storm.last.summary()}")  # the figures, under pytest -s


def test_extender_frozen_mid_storm_over_commits_no_gpu(
    cluster: Cluster, servers: list[str], tenants: list[str]
) -> None:
    """The extender stopped (SIGSTOP) past kube-scheduler's httpTimeout with binds in
    flight, then thawed: they time out, kube-scheduler retries their pods (maybe
    elsewhere) while the thawed extender still carries out the old binds (issue 7).
    A storm binds what fits in a second or two, so the fault is timed, not hoped
    for: headroom-scheduler is held until every pod exists; at its first bind the
    apiserver is stalled for :data:`APISERVER_STALL` seconds, while kube-scheduler,
    its filters answered from the extender's cache, sends binds that wait on it;
    the extender freezes with them in flight, the apiserver resumes and stores
    their bindings, and the extender answers them only when thawed, long after
    kube-scheduler gave up on them."""
    extender = cluster.components["extender"]
    apiserver = cluster.components["kube-apiserver"]
    before = len(_extender_errors(cluster))

    def freeze(storm: Storm) -> None:
        assert extender.pid is not None
        assert apiserver.pid is not None
        os.kill(apiserver.pid, signal.SIGSTOP)
        try:
            time.sleep(APISERVER_STALL)
            os.kill(extender.pid, signal.SIGSTOP)
        finally:
            os.kill(apiserver.pid, signal.SIGCONT)
        try:
            time.sleep(FREEZE_SECONDS)
        finally:
            os.kill(extender.pid, signal.SIGCONT)

    storm = Storm(cluster, servers, tenants)
    storm.run(freeze, at_first_bind=True)
    failed = _extender_errors(cluster)[before:]
    timed_out = [
        line for line in failed if "/bind" in line and ("Timeout" in line or "deadline" in line)
    ]
    assert timed_out, "no bind timed out:\n" + "\n".join(failed[-20:])
    assert storm.bound_after_fault(), "no pod was bound after the freeze"
    storm.check()
    print(
        f"\nfrozen: {len(timed_out)} binds of {len(failed)} requests failed; {storm.last.summary()}"
    )


def test_extender_killed_and_restarted_mid_storm_over_commits_no_gpu(
    cluster: Cluster, servers: list[str], tenants: list[str]
) -> None:
    """The extender killed (SIGKILL: no holds handed on, binds it had begun may land
    after it) at the storm's first bind, with every pod waiting, and started again:
    the new one knows no holds and no departures, and must charge every pod it
    cannot place where it may be."""
    extender = cluster.components["extender"]
    before = _extender_errors(cluster)
    pids = []

    def kill(storm: Storm) -> None:
        assert extender.pid is not None
        pids.append(extender.pid)
        os.kill(extender.pid, signal.SIGKILL)
        eventually("the extender gone", lambda: not extender.alive(), timeout=10)
        time.sleep(2)  # kube-scheduler's requests find nobody there
        cluster.start("extender")
        pids.append(extender.pid)

    storm = Storm(cluster, servers, tenants)
    storm.run(kill, at_first_bind=True)
    assert pids[0] != pids[1], pids
    refused = _extender_errors(cluster)[len(before) :]
    assert refused, "kube-scheduler saw no request to the killed extender fail"
    assert storm.bound_after_fault(), "no pod was bound by the restarted extender"
    storm.check()
    binds = sum("/bind" in line for line in refused)
    print(f"\nkilled: {binds} binds of {len(refused)} requests failed; {storm.last.summary()}")


def test_agent_stalled_mid_storm_over_commits_no_gpu(
    cluster: Cluster, servers: list[str], tenants: list[str]
) -> None:
    """One server's agent stalls (SIGSTOP) mid-storm: pods bound there pile up
    unlocated behind a report that still looks fresh, then the report turns stale
    (here dated back, rather than waiting the 90 s it takes), and the agent resumes,
    locating them all at once. The extender must charge them where the device plugin
    may have put them throughout, and everything on every GPU while the report is stale."""
    node = servers[0]
    agent = cluster.components[f"agent-{node}"]
    seen: dict[str, Any] = {}

    def stall(storm: Storm) -> None:
        assert agent.pid is not None
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            time.sleep(12)  # fresh, but blind to the pods bound since
            seen["lagging"] = _node_state(cluster, node)
            report = cluster.kubectl_json("get", names.REPORT_PLURAL, node)
            old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
            report["status"]["observedAt"] = old.isoformat().replace("+00:00", "Z")
            report["metadata"].pop("managedFields", None)
            report["metadata"].pop("resourceVersion", None)
            cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(report))
            eventually(
                f"the extender to read {node}'s report stale",
                lambda: _node_state(cluster, node)["source"] != "report",
                timeout=30,
            )
            seen["stale"] = _node_state(cluster, node)
            time.sleep(8)
        finally:
            os.kill(agent.pid, signal.SIGCONT)

    storm = Storm(cluster, servers, tenants)
    storm.run(stall)
    assert seen["lagging"]["source"] == "report", seen["lagging"]["note"]
    unlocated = {
        pod["uid"] for gpu in seen["lagging"]["gpus"] for pod in gpu["pods"] if not pod["located"]
    }
    assert unlocated, f"no pod was bound to {node} while its agent stalled"
    assert seen["stale"]["source"] == "stale-report", seen["stale"]["note"]
    storm.check()
    print(f"\nstalled: {len(unlocated)} pods unlocated there; {storm.last.summary()}")


def test_tenants_deleting_their_pods_mid_storm_over_commit_no_gpu(
    cluster: Cluster, servers: list[str], tenants: list[str]
) -> None:
    """A quarter of the tenants delete all their pods while the storm is bound: bound
    pods leave GPUs kubelet frees on its own time, pods being bound vanish under their
    binds, and the pods still waiting take the room that leaves."""
    leaving = tenants[: len(tenants) // 4]

    def delete(storm: Storm) -> None:
        storm.wait_created()  # none of theirs created after the deletion
        snapshot = storm.snapshot()
        storm.left_bound = sum(1 for p in snapshot.bound() if p["metadata"]["namespace"] in leaving)
        with ThreadPoolExecutor(CREATORS) as pool:
            list(
                pool.map(
                    lambda ns: cluster.kubectl(
                        "delete", "pods", "-l", f"{LABEL}=true", "-n", ns, "--wait=false"
                    ),
                    leaving,
                )
            )

    storm = Storm(cluster, servers, tenants)
    storm.expected = PODS - sum(1 for i in range(PODS) if tenants[i % len(tenants)] in leaving)
    storm.run(delete)
    assert storm.left_bound, "no bound pod was among those deleted"
    assert not {p["metadata"]["namespace"] for p in storm.last.pods} & set(leaving)
    assert storm.bound_after_fault(), "no pod was bound after the others left"
    storm.check()
    print(f"\ndeleted {storm.left_bound} bound pods; {storm.last.summary()}")


class Storm:
    """The tenants' pods created at once, an optional fault struck once
    :data:`FAULT_AFTER` are bound, and the wait until it has all settled; a watcher
    reads a :class:`Snapshot` every few seconds throughout, and keeps the first
    over-committed GPU or starved pod it sees."""

    def __init__(self, cluster: Cluster, servers: list[str], tenants: list[str]) -> None:
        self.cluster = cluster
        self.servers = servers
        self.tenants = tenants
        margin = int(extender_state(cluster)["marginBytes"])
        self.room = A100_MIB * MIB - margin
        self.expected = PODS
        """Pods there once the storm settled (fewer where a fault deletes some)."""
        self.left_bound = 0
        """Bound pods a fault deleted."""
        self.struck_at: str | None = None
        """When the fault ended (RFC 3339, the apiserver's clock as conditions carry it)."""
        self.last = self.snapshot()
        self._created: Future[None] = Future()
        self.seen: list[str] = []
        """What the watcher saw go wrong, at the moment it saw it."""

    def snapshot(self) -> "Snapshot":
        reports = [
            r for r in self.cluster.kubectl_json("get", names.REPORT_PLURAL)["items"]
            if r["metadata"]["name"] in self.servers
        ]  # fmt: skip
        pods = _storm_pods(self.cluster, self.tenants)
        return Snapshot(pods, reports, self.room, self.expected)

    def run(
        self, fault: Callable[["Storm"], None] | None = None, *, at_first_bind: bool = False
    ) -> None:
        """The storm, and ``fault`` once :data:`FAULT_AFTER` pods are bound; or, with
        ``at_first_bind``, headroom-scheduler stopped until every pod exists and
        ``fault`` struck the moment the extender has answered its first bind, with
        nearly all the binds still to come."""
        specs = [_pod(self.tenants[i % len(self.tenants)], i) for i in range(PODS)]
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(done,), daemon=True)
        watcher.start()
        try:
            if at_first_bind:
                assert fault is not None
                binds = _binds(self.cluster)
                self.cluster.stop(SCHEDULER)
                try:
                    _create_at_once(self.cluster, specs)
                    self._created.set_result(None)
                finally:
                    self.cluster.start(SCHEDULER)
                wait_until(
                    "the extender's first bind of the storm",
                    lambda: _binds(self.cluster) > binds,
                    timeout=120,
                    interval=0.02,
                )
                fault(self)
                self.struck_at = _now()
            else:
                with ThreadPoolExecutor(1) as pool:
                    created = self._created = pool.submit(_create_at_once, self.cluster, specs)
                    if fault is not None:
                        eventually(
                            f"{FAULT_AFTER} pods bound",
                            lambda: len(self.snapshot().bound()) >= FAULT_AFTER,
                            timeout=120,
                            interval=1,
                        )
                        fault(self)
                        self.struck_at = _now()
                    created.result()
            self._settle()
        finally:
            done.set()
            watcher.join()

    def wait_created(self) -> None:
        """Until every pod of the storm is created (from a fault)."""
        self._created.result()

    def _watch(self, done: threading.Event) -> None:
        while not done.wait(3):
            try:
                snapshot = self.snapshot()
            except Exception:  # a kubectl refused under load: the next read will do
                continue
            wrong = snapshot.over_committed() + snapshot.starved()
            if wrong and not self.seen:
                self.seen = [*wrong, snapshot.layout()]

    def _settle(self) -> None:
        def settled() -> bool:
            self.last = self.snapshot()
            return self.last.settled()

        eventually(
            "every pod bound and located, or refused",
            settled,
            timeout=max(240, PODS),
            interval=2,
            explain=lambda: f"{self.last.progress()}\n{self.last.layout()}",
        )

        # A pod refused while the others were unlocated (each then charged where the
        # device plugin may yet put it) is retried once they are located, and waits
        # only where no server has room for it by the device plugin's own rule.
        def none_fits() -> bool:
            self.last = self.snapshot()
            return self.last.settled() and not self.last.fitting()

        eventually(
            "no pod waiting that a server has room for",
            none_fits,
            timeout=90,
            interval=2,
            explain=lambda: f"waiting pods that fit: {self.last.fitting()}\n{self.last.layout()}",
        )

    def check(self) -> None:
        last = self.last
        over = last.over_committed()
        assert not over, f"over-committed GPUs: {over}\n{last.layout()}"
        assert not last.starved(), f"pods refused memory they asked for: {last.starved()}"
        assert not self.seen, "during the storm: " + "\n".join(self.seen)
        assert last.waiting(), "the storm was meant to ask for more than the GPUs hold"

    def bound_after_fault(self) -> list[str]:
        """The pods bound after the fault ended."""
        assert self.struck_at is not None
        return [
            p["metadata"]["name"]
            for p in self.last.bound()
            for c in p["status"].get("conditions", [])
            if c["type"] == "PodScheduled"
            and c["status"] == "True"
            and c.get("lastTransitionTime", "") > self.struck_at
        ]


class Snapshot:
    """The storm's pods and the servers' reports, read at one moment."""

    def __init__(
        self,
        pods: list[dict[str, Any]],
        reports: list[dict[str, Any]],
        room: int,
        expected: int = PODS,
    ):
        self.pods = pods
        self.room = room
        self.expected = expected
        self.declared = {p["metadata"]["uid"]: parse_claim(p).declared or 0 for p in pods}
        self.gpus: dict[str, list[list[dict[str, Any]]]] = {
            r["metadata"]["name"]: [
                [pod for pod in gpu.get("pods", []) if pod.get("allocated")]
                for gpu in sorted(r.get("status", {}).get("gpus", []), key=lambda g: g["index"])
            ]
            for r in reports
        }

    def bound(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"].get("nodeName")]

    def waiting(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if not p["spec"].get("nodeName")]

    def settled(self) -> bool:
        """Every pod exists, each bound one Running and located on a GPU by its
        agent, each unbound one refused at least once."""
        if len(self.pods) != self.expected or any(
            p["status"].get("phase") != "Running" for p in self.bound()
        ):
            return False
        located = {pod["uid"] for gpus in self.gpus.values() for held in gpus for pod in held}
        if any(p["metadata"]["uid"] not in located for p in self.bound()):
            return False
        return all(_refused(p) for p in self.waiting())

    def progress(self) -> str:
        located = {pod["uid"] for gpus in self.gpus.values() for held in gpus for pod in held}
        bound = self.bound()
        return (
            f"{len(self.pods)} pods: {len(bound)} bound, "
            f"{sum(p['status'].get('phase') == 'Running' for p in bound)} Running, "
            f"{sum(p['metadata']['uid'] in located for p in bound)} located; "
            f"{sum(not _refused(p) for p in self.waiting())} unbound and not refused yet; "
            f"over-committed: {self.over_committed() or 'none'}; "
            f"starved: {self.starved() or 'none'}"
        )

    def summary(self) -> str:
        servers = len(self.gpus)
        gpus = sum(len(held) for held in self.gpus.values())
        declared = sum(sum(pods) for node in self.gpus for pods in self.held(node))
        return (
            f"{servers} servers, {gpus} GPUs; {len(self.bound())} of {len(self.pods)} pods "
            f"bound, {declared / GIB:.0f} of {gpus * self.room / GIB:.0f} GiB "
            f"({declared / (gpus * self.room):.0%}); waiting pods' smallest "
            f"{min(self.declared[p['metadata']['uid']] for p in self.waiting()) / GIB:g} GiB, "
            f"largest any server takes {max(map(self.largest_fit, self.gpus)) / GIB:.1f} GiB"
        )

    def held(self, node: str) -> list[list[int]]:
        """Per GPU of ``node``, its pods' declarations."""
        return [[self.declared.get(p["uid"], 0) for p in held] for held in self.gpus[node]]

    def largest_fit(self, node: str) -> int:
        """The largest declaration a new one-replica pod may have on ``node``, by the
        device plugin's distributed policy: it gets a GPU with the fewest replicas
        allocated, any of them on a tie, and a located pod may have left a GPU
        (kubelet frees its replica before any report shows it) -- so the GPU with
        the least room among those that could then hold the fewest."""
        held = self.held(node)
        counts = [len(pods) for pods in held]
        largest = self.room
        for i, pods in enumerate(held):
            others = min((c for k, c in enumerate(counts) if k != i), default=len(pods))
            smallest = sorted(pods)
            for gone in range(len(pods) + 1):
                if len(pods) - gone <= others and len(pods) - gone < REPLICAS:
                    free = self.room - sum(pods) + sum(smallest[:gone])
                    largest = min(largest, free)
        return largest

    def fitting(self) -> list[str]:
        """Waiting pods some server has room for."""
        best = max(self.largest_fit(node) for node in self.gpus)
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']} "
            f"({self.declared[p['metadata']['uid']] / GIB:g} GiB)"
            for p in self.waiting()
            if self.declared[p["metadata"]["uid"]] <= best
        ]

    def over_committed(self) -> list[str]:
        return [
            f"{node} GPU {i}: {sum(pods) / GIB:.1f} GiB declared"
            for node in sorted(self.gpus)
            for i, pods in enumerate(self.held(node))
            if sum(pods) > self.room
        ]

    def starved(self) -> list[str]:
        return [
            f"{pod['namespace']}/{pod['name']}"
            for gpus in self.gpus.values()
            for held in gpus
            for pod in held
            if pod.get("starvedBytes")
        ]

    def layout(self) -> str:
        """Per GPU, its pods' declarations (GiB); per server, the largest pod it takes;
        the waiting pods' declarations."""
        lines = []
        for node in sorted(self.gpus):
            lines.append(f"  {node}: takes a pod of at most {self.largest_fit(node) / GIB:.1f} GiB")
            for i, pods in enumerate(self.held(node)):
                sizes = sorted(size // GIB for size in pods)
                lines.append(f"    GPU {i}: {sum(sizes)} GiB in {sizes}")
        waiting = sorted(self.declared[p["metadata"]["uid"]] // GIB for p in self.waiting())
        lines.append(f"  waiting (GiB): {waiting}")
        return "\n".join(lines)


def _pod(namespace: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"storm-{i:04d}",
            "namespace": namespace,
            "labels": {LABEL: "true"},
            "annotations": {names.ANNOTATION_GPU_MEMORY: f"{SIZES_GIB[i % len(SIZES_GIB)]}Gi"},
        },
        "spec": {
            "nodeSelector": {LABEL: "true"},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/cuda-app:1",
                    "resources": {"limits": {names.GPU: "1"}},
                }
            ],
        },
    }


def _create_at_once(cluster: Cluster, specs: list[dict[str, Any]]) -> None:
    """``specs`` created by :data:`CREATORS` kubectl processes at once, through the
    webhook; a pod refused fails the test (kubectl exits non-zero)."""
    documents = [yaml.safe_dump_all(specs[i::CREATORS]) for i in range(CREATORS)]
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(lambda text: cluster.kubectl("create", "-f", "-", input=text), documents))


def _storm_pods(cluster: Cluster, spaces: list[str]) -> list[dict[str, Any]]:
    listed = cluster.kubectl_json("get", "pods", "-A", "-l", f"{LABEL}=true")["items"]
    ours = set(spaces)
    return [p for p in listed if p["metadata"]["namespace"] in ours]


def _accounts(cluster: Cluster, spaces: list[str]) -> set[str]:
    listed = cluster.kubectl_json(
        "get", "serviceaccounts", "-A", "--field-selector", "metadata.name=default"
    )["items"]
    return {sa["metadata"]["namespace"] for sa in listed} & set(spaces)


def _refused(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def _binds(cluster: Cluster) -> int:
    """Binds the extender has answered since it started (its ``/metrics``)."""
    url = f"http://127.0.0.1:{cluster.ports['extender']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("headroom_extender_requests_total{") and 'verb="bind"' in line
    )


def _extender_errors(cluster: Cluster) -> list[str]:
    """kube-scheduler's log lines about requests to the extender that failed."""
    log = cluster.components["headroom-scheduler"].log
    with open(log, errors="replace") as lines:
        url = f"127.0.0.1:{cluster.ports['extender']}/"
        return [line.rstrip() for line in lines if url in line]


def _node_state(cluster: Cluster, node: str) -> dict[str, Any]:
    """The extender's account of ``node``."""
    account: dict[str, Any] = extender_state(cluster)["nodes"][node]
    return account


def _now() -> str:
    """Now, as the apiserver writes a condition's time (to the second)."""
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")
