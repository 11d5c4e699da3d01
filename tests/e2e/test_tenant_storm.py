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
"""

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from devcluster import nodes
from devcluster.cluster import Cluster
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
    try:
        for i in range(NODES):
            spec = nodes.NodeSpec(
                name=f"tenant-storm-{i}",
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
    run = os.getpid()
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
    margin = int(extender_state(cluster)["marginBytes"])
    room = A100_MIB * MIB - margin
    _create_at_once(cluster, [_pod(tenants[i % len(tenants)], i) for i in range(PODS)])

    def snapshot() -> Snapshot:
        reports = [
            r for r in cluster.kubectl_json("get", names.REPORT_PLURAL)["items"]
            if r["metadata"]["name"] in servers
        ]  # fmt: skip
        return Snapshot(_storm_pods(cluster, tenants), reports, room)

    last = snapshot()

    def settled() -> bool:
        nonlocal last
        last = snapshot()
        return last.settled()

    eventually(
        "every pod bound and located, or refused",
        settled,
        timeout=max(240, PODS),
        interval=2,
        explain=lambda: f"{last.progress()}\n{last.layout()}",
    )

    # A pod refused while the others were unlocated (each then charged where the
    # device plugin may yet put it) is retried once they are located, and waits
    # only where no server has room for it by the device plugin's own rule.
    def none_fits() -> bool:
        nonlocal last
        last = snapshot()
        return last.settled() and not last.fitting()

    eventually(
        "no pod waiting that a server has room for",
        none_fits,
        timeout=90,
        interval=2,
        explain=lambda: f"waiting pods that fit: {last.fitting()}\n{last.layout()}",
    )
    over = last.over_committed()
    assert not over, f"over-committed GPUs: {over}\n{last.layout()}"
    assert not last.starved(), f"pods refused memory they asked for: {last.starved()}"
    assert last.waiting(), "the storm was meant to ask for more than the GPUs hold"
    print(f"\ntenant storm: {last.summary()}")  # the figures, under pytest -s


class Snapshot:
    """The storm's pods and the servers' reports, read at one moment."""

    def __init__(self, pods: list[dict[str, Any]], reports: list[dict[str, Any]], room: int):
        self.pods = pods
        self.room = room
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
        if len(self.pods) < PODS or any(
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
