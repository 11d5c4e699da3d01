"""Benchmark (not a test): the real kube-scheduler's memory at 20,000 pods and 5,000 nodes.

headroom-scheduler's pod runs the upstream kube-scheduler (v1.34.4, the
``kube-scheduler`` container of manifests/base/scheduler/deployment.yaml)
beside the extender. bench/memory_bench.py measures the extender and the
webhook; this measures the kube-scheduler container against its limit, read
from that manifest (2Gi, with GOMEMLIMIT 1600MiB; it was 512Mi, under what
5,000 nodes alone take), as a scheduler restart or failover meets a full
cluster: it lists and caches every Node and every assigned Pod (of any
scheduler), plus the CSINodes, ReplicaSets and namespaces its plugins watch.

It starts its own etcd and kube-apiserver (devcluster.controlplane, in a
temporary state dir; no controller manager, kubelet or KWOK: nothing changes
the objects once made), then runs the real kube-scheduler binary with the
KubeSchedulerConfiguration of manifests/base/scheduler/configmap.yaml as
shipped (profile ``headroom-scheduler``, the extender entry, leader
election), plus ``clientConnection.kubeconfig`` (an admin identity), since it
runs outside a pod, and longer lease timings (below). The extender is not
running: kube-scheduler calls it only to schedule a pod asking a managed
resource, and keeps nothing of it in its cache.

The objects, made through the API with many requests at once, are shaped like
a real cluster's: ``--nodes`` eight-GPU time-sliced A100 nodes (GFD and NFD
labels, ``nvidia.com/gpu.shared: 32`` and ``headroom.dev/gpu-memory`` in
capacity and allocatable, 50 images in status as kubelet reports them,
conditions, addresses, nodeInfo) with a CSINode each; pods of ReplicaSets
(eight pods each, in 100 tenant namespaces) with ``spec.nodeName`` preset, so
kube-scheduler caches them as assigned, one ReplicaSet in four asking
``nvidia.com/gpu.shared: 1`` and ``headroom.dev/gpu-memory: 8Gi`` as the
webhook mutates them (schedulerName headroom-scheduler, Headroom's
annotations); a few env vars, a probe, resources, labels, ownerReferences;
then a Running status (conditions, IPs, a container status) as kubelet would
write it, so managedFields hold two managers, as real pods' do.

Each point is a fresh kube-scheduler process, started once the objects
exist (as after a restart or a failover), timed until its cache holds them all
(its ``scheduler_cache_size`` metric) and it is idle; then, after ``--settle``
seconds, its resident set (VmRSS) and peak (VmHWM, the figure a container's
memory limit kills on) are read from /proc/<pid>/status. The points, in one
run against the same apiserver:

* *floor*: no nodes and no pods;
* *nodes*: the ``--nodes`` nodes, no pods (the per-node cost);
* one per ``--pods`` count (default 20,000; ``--pods 20000 50000`` for the
  slope), more pods added between points.

At the node and pod points it then schedules ``--probes`` CPU pods (no managed
resource, so the absent extender is not asked; the first cycle snapshots every
node) and reads again. At the pod points it then restarts the apiserver, as a
control-plane upgrade does: the scheduler's reflectors list everything again
while they still hold the old objects (checked: its client receives again what
its first lists took), and the peak is read once it is idle. The lease timings
are lengthened for this (kube-scheduler exits when it cannot renew its lease
for 10 s; the bench has one apiserver, production has several). Last, a heap
profile with ``gc=1`` forces a collection, and ``go_memstats_heap_alloc_bytes``
after it is the *live* heap: what a GOMEMLIMIT could squeeze the heap down to.
It is read once more pod has been scheduled after the relist: until its next
cycle, the scheduler's snapshot of the nodes holds the objects of the first
list, and the live heap both lists (``live_heap_before_next_cycle_mib``).

Run: ``.venv/bin/python bench/scheduler_memory_bench.py [--nodes 5000] [--pods 20000 50000]``
(needs the control-plane binaries of tests/e2e/controlplane/build.sh; with
``--pods 20000 50000`` it takes about ten minutes on two cores). Prints a
table, then one JSON object on its last line.
"""

import argparse
import asyncio
import itertools
import json
import os
import shutil
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devcluster import binaries, controlplane  # noqa: E402
from devcluster.process import Component  # noqa: E402
from devcluster.state import ClusterState  # noqa: E402
from headroom import names  # noqa: E402
from headroom.accounting import DEFAULT_MARGIN_BYTES  # noqa: E402
from headroom.quantity import format_bytes, parse_bytes  # noqa: E402
from kube.config import credentials  # noqa: E402
from kube.rest import ApiError, Rest, Unreachable  # noqa: E402

MIB = 2**20
DEPLOYMENT = ROOT / "manifests" / "base" / "scheduler" / "deployment.yaml"
CONFIGMAP = ROOT / "manifests" / "base" / "scheduler" / "configmap.yaml"
CONTAINER = "kube-scheduler"

NAMESPACES = 100
PODS_PER_OWNER = 8
GPU_OWNER_EVERY = 4
"""One ReplicaSet in four asks for a shared GPU: with 8 pods each and 5,000
nodes, each node gets one GPU pod in every four of its pods."""
GPUS_PER_NODE = 8
REPLICAS = 4
A100_BYTES = 40 * 2**30
IMAGES_PER_NODE = 50
"""kubelet's --node-status-max-images default."""
IMAGE_POOL = 200
PROBE_NAMESPACE = "bench-probe"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
CONCURRENCY = 32
RELIST_WAIT = 180.0
"""Seconds to wait for the scheduler to list again after the apiserver restarts."""
MERGE_PATCH = "application/merge-patch+json"
NOW = "2026-11-24T07:00:00Z"


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _shipped_container(root: Path) -> dict[str, Any]:
    deployment = yaml.safe_load((root / DEPLOYMENT.relative_to(ROOT)).read_text())
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == CONTAINER]
    return dict(container)


def shipped_env(root: Path = ROOT) -> dict[str, str]:
    """The kube-scheduler container's env as shipped (its GOMEMLIMIT)."""
    env = _shipped_container(root).get("env", [])
    return {str(e["name"]): str(e["value"]) for e in env if "value" in e}


def shipped(root: Path = ROOT) -> tuple[dict[str, Any], int, int]:
    """(KubeSchedulerConfiguration, memory request, memory limit in bytes) as shipped."""
    configmap = yaml.safe_load((root / CONFIGMAP.relative_to(ROOT)).read_text())
    configuration: dict[str, Any] = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    memory = _shipped_container(root)["resources"]
    request = parse_bytes(str(memory["requests"]["memory"]))
    limit = parse_bytes(str(memory["limits"]["memory"]))
    return configuration, request, limit


# --- the objects ---------------------------------------------------------------------------


def _image(k: int) -> dict[str, Any]:
    repo = f"nvcr.io/nvidia/team-{k % 20}/image-{k}"
    digest = f"{k:064x}"
    return {
        "names": [f"{repo}@sha256:{digest}", f"{repo}:v{k % 7}.{k % 13}.0-cuda12.4"],
        "sizeBytes": 200_000_000 + k * 37_000_000,
    }


def node(i: int, images: int = IMAGES_PER_NODE) -> dict[str, Any]:
    name = f"gpu-node-{i:05d}"
    ip = f"172.16.{i // 250}.{i % 250 + 1}"
    memory = format_bytes(GPUS_PER_NODE * (A100_BYTES - DEFAULT_MARGIN_BYTES))
    gfd = {
        names.LABEL_COUNT: str(GPUS_PER_NODE),
        names.LABEL_MEMORY_MIB: str(A100_BYTES // MIB),
        names.LABEL_PRODUCT: "NVIDIA-A100-SXM4-40GB-SHARED",
        names.LABEL_REPLICAS: str(REPLICAS),
        names.LABEL_SHARING_STRATEGY: "time-slicing",
        names.LABEL_MIG_CAPABLE: "true",
        names.LABEL_MIG_STRATEGY: "none",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.machine": "DGX-A100",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gfd.timestamp": "1732431600",
        **{f"nvidia.com/gpu.deploy.{c}": "true" for c in
           ("container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
            "driver", "gpu-feature-discovery", "node-status-exporter", "operator-validator")},
    }  # fmt: skip
    nfd = {f"feature.node.kubernetes.io/cpu-cpuid.FEATURE{k}": "true" for k in range(40)}
    nfd |= {
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-1063-nvidia",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abcd'[i % 4]}",
        **gfd,
        **nfd,
    }
    capacity = {
        "cpu": "96",
        "memory": "1152Gi",
        "ephemeral-storage": "7500Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": "110",
        names.GPU_SHARED: str(GPUS_PER_NODE * REPLICAS),
        names.GPU_MEMORY: memory,
    }
    allocatable = capacity | {"cpu": "95500m", "memory": "1150Gi", "ephemeral-storage": "7000Gi"}
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "has sufficient memory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "is posting ready status"),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "nfd.node.kubernetes.io/feature-labels": ",".join(sorted(nfd)),
                "nfd.node.kubernetes.io/extended-resources": "",
            },
        },
        "spec": {
            "podCIDR": f"10.{64 + i // 256}.{i % 256}.0/24",
            "podCIDRs": [f"10.{64 + i // 256}.{i % 256}.0/24"],
            "providerID": f"aws:///us-east-1{'abcd'[i % 4]}/i-{i:017x}",
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": f"kubelet {m}",
                    "lastHeartbeatTime": NOW,
                    "lastTransitionTime": NOW,
                }
                for t, s, r, m in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}",
                "systemUUID": f"ec2{i:05x}-0000-4000-8000-{i:012x}",
                "bootID": f"{i:08x}-1111-4000-8000-{i:012x}",
                "kernelVersion": "5.15.0-1063-nvidia",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.34.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [_image((i * 7 + k * 3) % IMAGE_POOL) for k in range(images)],
            "runtimeHandlers": [
                {"name": h, "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}}
                for h in ("nvidia", "runc", "")
            ],
        },
    }


def csinode(i: int) -> dict[str, Any]:
    """kubelet makes one per node; kube-scheduler caches them (NodeVolumeLimits)."""
    name = f"gpu-node-{i:05d}"
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": name},
        "spec": {"drivers": []},
    }


def _owner(o: int) -> tuple[str, str, bool]:
    """(namespace, ReplicaSet name, asks a shared GPU) of owner ``o``."""
    return f"tenant-{o % NAMESPACES}", f"svc-{o:05d}-7d9f8c6b5", o % GPU_OWNER_EVERY == 0


def _template(o: int) -> dict[str, Any]:
    namespace, _, gpu = _owner(o)
    limits: dict[str, str] = {"cpu": "2", "memory": "4Gi"}
    annotations = {"kubectl.kubernetes.io/restartedAt": NOW, "prometheus.io/scrape": "true"}
    if gpu:
        limits |= {names.GPU_SHARED: "1", names.GPU_MEMORY: "8Gi"}
        annotations |= {
            names.ANNOTATION_GPU_MEMORY: "8Gi",
            names.ANNOTATION_POLICY: "gpu-shared",
            names.ANNOTATION_MODE: "shared",
            names.ANNOTATION_DECLARED_MEMORY: "8Gi",
            names.ANNOTATION_PLACEMENT: "binpack",
        }
    env: list[dict[str, Any]] = [
        {"name": f"APP_SETTING_{k}", "value": f"value-{k}-{o}"} for k in range(6)
    ]
    env += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    container = {
        "name": "main",
        "image": f"registry.example.com/{namespace}/svc-{o % 50}:v1.{o % 9}.3",
        "command": ["python", "-m", "service"],
        "args": ["--config", "/etc/app/config.yaml", "--port", "8080"],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": env,
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": f"svc-{o:05d}-config"}}],
        "terminationGracePeriodSeconds": 30,
    }
    if gpu:
        spec["schedulerName"] = names.HEADROOM_SCHEDULER
        toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        spec["tolerations"] = [toleration]
    labels = {"app": f"svc-{o:05d}", "team": f"team-{o % 50}", "pod-template-hash": "7d9f8c6b5"}
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def replicaset(o: int) -> dict[str, Any]:
    namespace, name, _ = _owner(o)
    template = _template(o)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": {
            "replicas": PODS_PER_OWNER,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }


def pod(i: int, nodes: int, owner_uid: str) -> dict[str, Any]:
    o = i // PODS_PER_OWNER
    namespace, owner, _ = _owner(o)
    template = _template(o)
    metadata = dict(template["metadata"])
    metadata |= {
        "name": f"{owner}-{i:06d}",
        "generateName": f"{owner}-",
        "namespace": namespace,
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner_uid,
             "controller": True, "blockOwnerDeletion": True}
        ],
    }  # fmt: skip
    spec = dict(template["spec"]) | {"nodeName": f"gpu-node-{i % nodes:05d}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pod_status(i: int, nodes: int) -> dict[str, Any]:
    """What kubelet writes once the pod runs (qosClass stays as the apiserver set it)."""
    n = i % nodes
    o = i // PODS_PER_OWNER
    namespace, _, _ = _owner(o)
    host = f"172.16.{n // 250}.{n % 250 + 1}"
    ip = f"10.{64 + n // 256}.{n % 256}.{(i // nodes) % 250 + 2}"
    conditions = (
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    )
    image = f"registry.example.com/{namespace}/svc-{o % 50}:v1.{o % 9}.3"
    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": NOW}
                for t in conditions
            ],
            "hostIP": host,
            "hostIPs": [{"ip": host}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": NOW,
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": image,
                    "imageID": f"registry.example.com/svc@sha256:{i:064x}",
                    "containerID": f"containerd://{i:064x}",
                    "state": {"running": {"startedAt": NOW}},
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/app", "readOnly": True},
                    ],
                }
            ],
        }
    }


def probe_pod(name: str) -> dict[str, Any]:
    """A CPU pod for headroom-scheduler to place: no managed resource, so the extender
    (not running) is not asked; it tolerates every taint (the apiserver's
    TaintNodesByCondition gives new nodes ``not-ready``, and no controller lifts it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": PROBE_NAMESPACE, "labels": {"probe": "1"}},
        "spec": {
            "schedulerName": names.HEADROOM_SCHEDULER,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/probe:v1",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }


# --- the API --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None
    content_type: str = "application/json"


async def _send(rest: Rest, call: Call) -> Any:
    """The answer's JSON; retried on overload or a lost connection; a create that
    finds its object made by a try whose answer was lost counts as done."""
    for attempt in range(6):
        try:
            answer = await rest.request(
                call.method, call.path, call.body, content_type=call.content_type
            )
        except Unreachable:
            if attempt == 5:
                raise
            await asyncio.sleep(0.5 * 2**attempt)
            continue
        if answer.status == 409 and call.method == "POST" and attempt > 0:
            return None
        if answer.status == 429 or answer.status >= 500:
            if attempt == 5:
                answer.check()
            await asyncio.sleep(0.5 * 2**attempt)
            continue
        return answer.check().json()
    raise AssertionError("unreachable")


async def _run_all(rest: Rest, jobs: Iterator[Any], what: str, total: int) -> float:
    """Run ``jobs`` (coroutine factories) CONCURRENCY at a time; seconds taken."""
    started = time.monotonic()
    done = 0
    last = started

    async def worker() -> None:
        nonlocal done, last
        for job in jobs:  # one shared iterator: each job is taken once
            await job()
            done += 1
            now = time.monotonic()
            if now - last >= 10:
                last = now
                _progress(f"{what}: {done}/{total} after {now - started:.0f}s")

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.monotonic() - started


class Api:
    """Creates the objects, with kube.rest on an event loop of its own."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.loop = asyncio.new_event_loop()
        self.rest = self.loop.run_until_complete(self._client())
        self.owner_uids: dict[int, str] = {}

    async def _client(self) -> Rest:
        return Rest(credentials(str(self.kubeconfig)), timeout=120, connections=CONCURRENCY)

    def close(self) -> None:
        self.loop.run_until_complete(self.rest.close())
        self.loop.close()

    def send(self, call: Call) -> Any:
        return self.loop.run_until_complete(_send(self.rest, call))

    def run(self, calls: list[Call], what: str) -> float:
        async def go() -> float:
            def jobs() -> Iterator[Any]:
                for call in calls:
                    yield lambda call=call: _send(self.rest, call)

            return await _run_all(self.rest, jobs(), what, len(calls))

        return self.loop.run_until_complete(go())

    def namespaces(self) -> float:
        """The tenant namespaces, the lease's and the probes', each with its
        ``default`` ServiceAccount (the controller manager that makes it is not running)."""
        wanted = [f"tenant-{k}" for k in range(NAMESPACES)] + ["headroom-system", PROBE_NAMESPACE]
        took = self.run(
            [Call("POST", "/api/v1/namespaces", {"metadata": {"name": n}}) for n in wanted],
            "namespaces",
        )
        account = {"metadata": {"name": "default"}}
        calls = [Call("POST", f"/api/v1/namespaces/{n}/serviceaccounts", account) for n in wanted]
        return took + self.run(calls, "service accounts")

    def nodes(self, count: int, images: int) -> float:
        calls = [Call("POST", "/api/v1/nodes", node(i, images)) for i in range(count)]
        calls += [
            Call("POST", "/apis/storage.k8s.io/v1/csinodes", csinode(i)) for i in range(count)
        ]
        return self.run(calls, "nodes and CSINodes")

    def pods(self, start: int, end: int, nodes: int) -> float:
        """Pods ``start..end-1``, their ReplicaSets first, each pod then given its status."""
        owners = range(start // PODS_PER_OWNER, (end - 1) // PODS_PER_OWNER + 1)
        new = [o for o in owners if o not in self.owner_uids]

        async def make_owner(o: int) -> None:
            namespace = _owner(o)[0]
            path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
            made = await _send(self.rest, Call("POST", path, replicaset(o)))
            if made is None:  # made by a retried request: read its uid
                made = await _send(self.rest, Call("GET", f"{path}/{_owner(o)[1]}"))
            self.owner_uids[o] = made["metadata"]["uid"]

        async def make_pod(i: int) -> None:
            body = pod(i, nodes, self.owner_uids[i // PODS_PER_OWNER])
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            await _send(self.rest, Call("POST", f"/api/v1/namespaces/{namespace}/pods", body))
            status = Call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                          pod_status(i, nodes), MERGE_PATCH)  # fmt: skip
            await _send(self.rest, status)

        async def go() -> float:
            owner_jobs = (lambda o=o: make_owner(o) for o in new)
            took = await _run_all(self.rest, owner_jobs, "replicasets", len(new))
            pod_jobs = (lambda i=i: make_pod(i) for i in range(start, end))
            return took + await _run_all(self.rest, pod_jobs, "pods", end - start)

        return self.loop.run_until_complete(go())

    def bound(self, label: str) -> int:
        path = f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods?labelSelector=point%3D{label}"
        items = self.send(Call("GET", path))["items"]
        return sum(1 for p in items if p["spec"].get("nodeName"))

    def probes(self, label: str, count: int) -> float:
        bodies = [probe_pod(f"probe-{label}-{k}") for k in range(count)]
        for body in bodies:
            body["metadata"]["labels"]["point"] = label
        path = f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods"
        return self.run([Call("POST", path, b) for b in bodies], "probe pods")

    def release_lease(self, namespace: str, name: str) -> None:
        """The stopped scheduler's lease, so the next takes it at once rather than in 15 s."""
        try:
            self.send(Call("DELETE", LEASE.format(namespace=namespace, name=name)))
        except ApiError as err:
            if err.status != 404:
                raise


# --- kube-scheduler -------------------------------------------------------------------------


def memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of process ``pid``, in bytes."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            found[key] = int(value.split()[0]) * 1024
    return found


def fetch(url: str, pki: Path) -> str:
    """GET ``url`` with the admin certificate (authorized by kube-scheduler's delegated
    authorization, as by the apiserver); the serving certificate is not checked."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen(url, timeout=120, context=context) as response:
        return bytes(response.read()).decode(errors="replace")


def samples(text: str, *prefixes: str) -> dict[str, float]:
    """The Prometheus samples of ``text`` whose names start with ``prefixes``."""
    found = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def cache_size(metrics: dict[str, float], kind: str) -> int | None:
    value = metrics.get(f'scheduler_cache_size{{type="{kind}"}}')
    return None if value is None else int(value)


def holds(cached: int | None, wanted: int) -> bool:
    """The cache reports (the metric appears once the cache runs) at least ``wanted``."""
    return cached is not None and cached >= wanted


@dataclass
class Point:
    """One kube-scheduler process's figures; memory readings are /proc status dicts."""

    label: str
    nodes: int
    pods: int
    sync_s: float = 0.0
    synced: dict[str, int] = field(default_factory=dict)
    heap_inuse: float = 0.0
    probes: int = 0
    probe_s: float = 0.0
    scheduled: dict[str, int] = field(default_factory=dict)
    listed: float = 0.0
    """Bytes the first lists took (protobuf, as kube-scheduler asks for them)."""
    relisted: bool | None = None
    relisted_bytes: float = 0.0
    relist_s: float = 0.0
    relist: dict[str, int] = field(default_factory=dict)
    live_heap: float | None = None
    """After the last step and a scheduling cycle."""
    live_two_lists: float | None = None
    """Right after the relist, before a scheduling cycle."""

    def peak(self) -> int:
        """The highest VmHWM read, whatever the step."""
        return max(m.get("VmHWM", 0) for m in (self.synced, self.scheduled, self.relist))


class Scheduler:
    """kube-scheduler processes with the shipped configuration, one per point."""

    def __init__(
        self,
        state: ClusterState,
        bins: Path,
        configuration: dict[str, Any],
        apiserver: Component,
        settle: float,
        timeout: float,
        gomemlimit: str | None = None,
    ) -> None:
        self.state = state
        self.gomemlimit = gomemlimit
        self.bins = bins
        self.configuration = configuration
        self.lease = configuration["leaderElection"]
        self.apiserver = apiserver
        self.settle = settle
        self.timeout = timeout
        self.running: Component | None = None

    def measure(self, api: Api, point: Point, probes: int, relist: bool) -> None:
        api.release_lease(self.lease["resourceNamespace"], self.lease["resourceName"])
        name = f"headroom-scheduler-{point.label}"
        component = controlplane.scheduler(
            self.state,
            self.bins,
            name=name,
            config=self.state.admin_kubeconfig,
            configuration=self.configuration,
        )
        if self.gomemlimit and self.gomemlimit != "off":
            component.env = {"GOMEMLIMIT": self.gomemlimit}
        started = time.monotonic()
        component.start()
        self.running = component
        try:
            component.wait_ready(120)
            assert component.pid is not None
            url = f"https://127.0.0.1:{self.state.port(name)}"
            metrics = self._synced(component, url, point, started)
            point.sync_s = time.monotonic() - started
            _progress(f"{point.label}: cache synced after {point.sync_s:.1f}s")
            wait_idle(component.pid, self.timeout)
            point.listed = received(fetch(f"{url}/metrics", self.state.pki))
            time.sleep(self.settle)
            point.synced = memory(component.pid)
            metrics = samples(fetch(f"{url}/metrics", self.state.pki), "go_memstats_heap_inuse")
            point.heap_inuse = metrics.get("go_memstats_heap_inuse_bytes", 0.0)
            if probes:
                point.probe_s = self._schedule(api, component, point.label, probes)
                point.probes = probes
                time.sleep(self.settle)
                point.scheduled = memory(component.pid)
            if relist:
                self._relist(component, url, point)
                # Until its next cycle, the scheduler's snapshot of the nodes still
                # holds the objects of before the relist: the live heap holds both.
                point.live_two_lists = self._live(url)
                if probes:
                    self._schedule(api, component, f"{point.label}-again", 1)
                    point.probes += 1
            point.live_heap = self._live(url)
        finally:
            component.stop()
            self.running = None

    def _synced(
        self, component: Component, url: str, point: Point, started: float
    ) -> dict[str, float]:
        """Until the scheduler's cache holds the point's nodes and pods (its metric is
        refreshed every second)."""
        while True:
            try:
                metrics = samples(fetch(f"{url}/metrics", self.state.pki), "scheduler_cache_size")
            except urllib.error.HTTPError:
                metrics = {}  # 401/403 until it has read the apiserver's client CA
            nodes, pods = cache_size(metrics, "nodes"), cache_size(metrics, "pods")
            if holds(nodes, point.nodes) and holds(pods, point.pods):
                return metrics
            if time.monotonic() - started > self.timeout:
                raise TimeoutError(
                    f"{component.name}: cache {nodes} nodes, {pods} pods after "
                    f"{self.timeout:.0f}s; want {point.nodes}, {point.pods}"
                )
            if not component.alive():
                raise RuntimeError(f"{component.name} died:\n{component.log_tail()}")
            time.sleep(0.25)

    def _schedule(self, api: Api, component: Component, label: str, count: int) -> float:
        """Schedule ``count`` probe pods (the first cycle snapshots every node); seconds
        until all are bound."""
        began = time.monotonic()
        api.probes(label, count)
        while api.bound(label) < count:
            if time.monotonic() - began > self.timeout:
                raise TimeoutError(f"{component.name}: probe pods not bound")
            if not component.alive():
                raise RuntimeError(f"{component.name} died:\n{component.log_tail()}")
            time.sleep(0.5)
        return time.monotonic() - began

    def _live(self, url: str) -> float | None:
        """The live heap: a heap profile with gc=1 runs a collection first."""
        fetch(f"{url}/debug/pprof/heap?gc=1", self.state.pki)
        metrics = samples(fetch(f"{url}/metrics", self.state.pki), "go_memstats_heap_alloc")
        return metrics.get("go_memstats_heap_alloc_bytes")

    def _relist(self, component: Component, url: str, point: Point) -> None:
        """Restart the apiserver, as an upgrade does: the new one's watch cache starts
        past the scheduler's resourceVersions, so its reflectors list everything again
        while the old objects are still held. Seen in the scheduler's own client
        metrics: once it has received again at least 90% of the bytes its first lists
        took, it is left until idle (decoded, replaced, handled)."""
        assert component.pid is not None
        before = received(fetch(f"{url}/metrics", self.state.pki))
        began = time.monotonic()
        self.apiserver.stop()
        self.apiserver.start()
        self.apiserver.wait_ready(120)
        point.relisted = False
        while time.monotonic() - began < RELIST_WAIT:
            if not component.alive():
                raise RuntimeError(f"{component.name} died:\n{component.log_tail()}")
            again = received(fetch(f"{url}/metrics", self.state.pki)) - before
            if again >= 0.9 * point.listed:
                point.relisted = True
                point.relisted_bytes = again
                break
            time.sleep(0.5)
        point.relist_s = time.monotonic() - began
        wait_idle(component.pid, self.timeout)
        self._synced(component, url, point, time.monotonic())
        time.sleep(self.settle)
        point.relist = memory(component.pid)


def received(metrics: str) -> float:
    """Bytes kube-scheduler's client has received in answers to GETs (lists, lease
    reads; a watch's stream is not counted)."""
    found = samples(metrics, "rest_client_response_size_bytes_sum")
    return sum(value for key, value in found.items() if 'verb="GET"' in key)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, timeout: float, window: float = 3.0, busy: float = 0.3) -> None:
    """Until ``pid`` used less than ``busy`` s of CPU in ``window`` s (its lease renewals
    and metrics take far less)."""
    deadline = time.monotonic() + timeout
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(window)
        now = cpu_seconds(pid)
        if now - before < busy:
            return
        before = now
    raise TimeoutError(f"process {pid} still busy after {timeout:.0f}s")


# --- the run --------------------------------------------------------------------------------


def start_apiserver(state: ClusterState, bins: Path) -> list[Component]:
    state.make_dirs()
    controlplane.prepare_pki(state)
    started = []
    for make in (controlplane.etcd, controlplane.apiserver):
        component = make(state, bins)
        state.components[component.name] = component
        component.start()
        started.append(component)
        component.wait_ready(120, _progress)
    state.save()
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000, help="eight-GPU nodes (default 5000)")
    parser.add_argument(
        "--pods", type=int, nargs="*", default=[20000],
        help="assigned pods at each point, one in four shared GPU (default 20000)",
    )  # fmt: skip
    parser.add_argument(
        "--images", type=int, default=IMAGES_PER_NODE, help="images in each node's status"
    )
    parser.add_argument(
        "--probes", type=int, default=20, help="CPU pods scheduled after each sync (default 20)"
    )
    parser.add_argument(
        "--no-relist", action="store_true", help="skip the apiserver restart at each pod point"
    )
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds between a step and reading it"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds a sync may take (default 600)"
    )
    parser.add_argument(
        "--gomemlimit",
        default=shipped_env().get("GOMEMLIMIT"),
        help="GOMEMLIMIT for kube-scheduler (default: the shipped container's; 'off': none)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs, etcd)")
    args = parser.parse_args()
    configuration, request, limit = shipped()
    bins = binaries.bin_dir()
    absent = binaries.missing(bins)
    if absent:
        sys.exit(f"missing {', '.join(absent)} in {bins}: run {binaries.BUILD_SCRIPT}")
    directory = Path(tempfile.mkdtemp(prefix="headroom-sched-mem-"))
    state = ClusterState(directory)
    configuration = running_configuration(configuration, state.admin_kubeconfig)
    components: list[Component] = []
    scheduler: Scheduler | None = None
    api: Api | None = None
    points: list[Point] = []
    timings: dict[str, float] = {}
    try:
        components = start_apiserver(state, bins)
        api = Api(state.admin_kubeconfig)
        scheduler = Scheduler(
            state, bins, configuration, components[-1], args.settle, args.timeout, args.gomemlimit
        )
        timings["namespaces_s"] = api.namespaces()
        probed = 0

        def measure(point: Point, probes: int, relist: bool) -> None:
            nonlocal probed
            _progress(f"measuring {point.label}: {point.nodes} nodes, {point.pods} pods")
            assert scheduler is not None
            assert api is not None
            scheduler.measure(api, point, probes, relist)
            probed += point.probes
            points.append(point)

        measure(Point("floor", 0, 0), 0, False)
        _progress(f"creating {args.nodes} nodes and their CSINodes")
        timings["nodes_s"] = api.nodes(args.nodes, args.images)
        measure(Point("nodes", args.nodes, 0), args.probes, False)
        made = 0
        for target in sorted(args.pods):
            _progress(f"creating pods {made}..{target - 1}")
            timings[f"pods_{target}_s"] = api.pods(made, target, args.nodes)
            made = target
            measure(
                Point(f"pods-{target}", args.nodes, made + probed), args.probes, not args.no_relist
            )
    finally:
        if scheduler is not None and scheduler.running is not None:
            scheduler.running.stop()
        if api is not None:
            api.close()
        for component in reversed(components):
            component.stop()
        if args.keep:
            _progress(f"state and logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    report(points, timings, request, limit, args)


def running_configuration(shipped: dict[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """The shipped configuration, run outside a pod: the admin kubeconfig instead of
    the ServiceAccount's, and longer lease timings so that the bench's restart of its
    only apiserver does not end the leader (kube-scheduler exits when it loses its
    lease; with several apiservers, as in production, it would not). Neither changes
    what the scheduler caches."""
    configuration = dict(shipped)
    configuration["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    configuration["leaderElection"] = dict(shipped["leaderElection"]) | {
        "leaseDuration": "120s",
        "renewDeadline": "100s",
        "retryPeriod": "2s",
    }
    return configuration


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def report(
    points: list[Point],
    timings: dict[str, float],
    request: int,
    limit: int,
    args: argparse.Namespace,
) -> None:
    floor = points[0].peak()
    header = ("point", "nodes", "pods", "sync s", "RSS MiB", "peak MiB", "+sched", "+relist",
              "live MiB", "max/limit", "max/floor")  # fmt: skip
    row = "{:<12} {:>6} {:>6} {:>7} {:>8} {:>9} {:>7} {:>8} {:>9} {:>10} {:>10}"
    print(row.format(*header))
    summary: dict[str, Any] = {
        "nodes": args.nodes,
        "images_per_node": args.images,
        "gomemlimit": args.gomemlimit,
        "limit_mib": limit // MIB,
        "request_mib": request // MIB,
        "create_s": {key: round(value, 1) for key, value in timings.items()},
        "points": {},
    }

    def hwm(reading: dict[str, int]) -> str:
        return f"{reading['VmHWM'] / MIB:.0f}" if reading else "-"

    for p in points:
        live = f"{p.live_heap / MIB:.0f}" if p.live_heap is not None else "-"
        print(
            row.format(
                p.label, p.nodes, p.pods, f"{p.sync_s:.1f}", f"{p.synced['VmRSS'] / MIB:.0f}",
                hwm(p.synced), hwm(p.scheduled), hwm(p.relist), live,
                f"{p.peak() / limit:.2f}", f"{p.peak() / floor:.1f}",
            )
        )  # fmt: skip
        entry: dict[str, Any] = {
            "nodes": p.nodes,
            "pods": p.pods,
            "sync_s": round(p.sync_s, 1),
            "listed_mib": _mib(p.listed),
            "synced": {key: _mib(value) for key, value in p.synced.items()},
            "heap_inuse_mib": _mib(p.heap_inuse),
            "live_heap_mib": _mib(p.live_heap),
            "peak_mib": _mib(p.peak()),
            "peak_over_limit": round(p.peak() / limit, 3),
            "peak_over_floor": round(p.peak() / floor, 2),
        }
        if p.probes:
            entry["probes"] = p.probes
            entry["probe_s"] = round(p.probe_s, 1)
            entry["after_scheduling"] = {key: _mib(v) for key, v in p.scheduled.items()}
        if p.relisted is not None:
            entry["relisted"] = p.relisted
            entry["relist_s"] = round(p.relist_s, 1)
            entry["relisted_mib"] = _mib(p.relisted_bytes)
            entry["live_heap_before_next_cycle_mib"] = _mib(p.live_two_lists)
            entry["after_relist"] = {key: _mib(v) for key, v in p.relist.items()}
        summary["points"][p.label] = entry
    by_label = {p.label: p for p in points}
    if "nodes" in by_label and args.nodes:
        nodes = by_label["nodes"]
        per_node = (nodes.synced["VmHWM"] - points[0].synced["VmHWM"]) / args.nodes * 1000
        summary["synced_peak_mib_per_1000_nodes"] = round(per_node / MIB, 1)
        if nodes.live_heap is not None and points[0].live_heap is not None:
            live = (nodes.live_heap - points[0].live_heap) / args.nodes * 1000
            summary["live_heap_mib_per_1000_nodes"] = round(live / MIB, 1)
    steps = [by_label.get("nodes"), *(p for p in points if p.label.startswith("pods-"))]
    peaks, lives = [], []
    for before, after in itertools.pairwise(steps):
        if before is None or after is None or after.pods <= before.pods:
            continue
        count = (after.pods - before.pods) / 1000
        peaks.append(round((after.synced["VmHWM"] - before.synced["VmHWM"]) / count / MIB, 1))
        if after.live_heap is not None and before.live_heap is not None:
            lives.append(round((after.live_heap - before.live_heap) / count / MIB, 1))
    if peaks:
        summary["synced_peak_mib_per_1000_pods"] = peaks
        summary["live_heap_mib_per_1000_pods"] = lives
    summary["max_peak_mib"] = _mib(max(p.peak() for p in points))
    summary["max_peak_over_limit"] = round(max(p.peak() for p in points) / limit, 3)
    summary["fits_limit"] = max(p.peak() for p in points) < limit
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
