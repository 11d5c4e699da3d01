"""Benchmark (not a test): a scheduling storm through the stock kube-scheduler and Headroom.

Starts its own local cluster (devcluster) in its own state dir, with one CPU
node from the seeds' file and no GPU agents, then adds ``--nodes`` KWOK GPU
nodes through the API, each with ``--gpus-per-node`` time-sliced A100-40GB
GPUs (``--replicas`` per GPU, the GFD labels and ``nvidia.com/gpu.shared``
capacity the device plugin would give them). Then, in the same run:

1. **stock**: Headroom not installed yet. The stock kube-scheduler is
   stopped, ``--pods`` pods asking ``nvidia.com/gpu.shared: 1`` are created,
   the scheduler is started again, and the bench times, from that restart, until
   every pod that fits by slots is bound. This is the floor: it counts slots only.
2. **headroom**: Headroom is installed (manifests, webhook, extender,
   headroom-scheduler), a namespace is labelled with the ``gpu-shared``
   policy, headroom-scheduler is stopped, the same number of pods asking
   ``nvidia.com/gpu: 1`` and declaring ``--memory`` are created through the
   webhook, the scheduler is started, and the bench times until every pod
   that fits by memory is bound (or nothing moved for ``--stall`` seconds).

"Fits by memory" is the bound a perfect packer reaches: per GPU
``min(replicas, floor((memory - margin) / declared))`` pods. The over-commit
check is computed from the pods actually bound (never from Headroom's own
state): per node, Σ declared of its bound pods against Σ over its GPUs of
(memory - margin), and pods against slots. With one GPU per node this is the
per-GPU check; with several, the node-level sum is the part that can be
checked without an agent locating pods (these nodes run none).

Prints a table, then one JSON object on its last line. Run:
``.venv/bin/python bench/scheduler_bench.py --nodes 300 --gpus-per-node 1 --pods 1000``.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devcluster import components, nodes
from devcluster.cluster import Cluster, down, up
from devcluster.kubectl import wait_until
from headroom import names
from headroom.accounting import DEFAULT_MARGIN_BYTES
from headroom.quantity import parse_bytes

MIB = 2**20
A100_MIB = 40960
CPU_NODE_FILE = """
nodes:
- name: cpu-0
  labels: {node-role.kubernetes.io/worker: "true"}
  capacity: {cpu: "16", memory: 64Gi, pods: "110"}
"""
CREATE_THREADS = 16


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def gpu_node(name: str, gpus: int, replicas: int) -> dict[str, Any]:
    spec = nodes.NodeSpec(
        name=name,
        labels={
            names.LABEL_PRODUCT: "NVIDIA-A100-PCIE-40GB-SHARED",
            names.LABEL_MEMORY_MIB: str(A100_MIB),
            names.LABEL_COUNT: str(gpus),
            names.LABEL_REPLICAS: str(replicas),
            names.LABEL_SHARING_STRATEGY: "time-slicing",
            "nvidia.com/gpu.present": "true",
        },
        capacity={
            "cpu": "128",
            "memory": "1Ti",
            "pods": str(max(110, gpus * replicas + 10)),
            names.GPU_SHARED: str(gpus * replicas),
        },
    )
    return spec.to_object()


def add_nodes(cluster: Cluster, count: int, gpus: int, replicas: int) -> list[str]:
    node_names = [f"bench-{i:04d}" for i in range(count)]
    for start in range(0, count, 100):
        cluster.apply([gpu_node(n, gpus, replicas) for n in node_names[start : start + 100]])

    def ready() -> bool:
        listed = cluster.kubectl_json("get", "nodes", "-l", "nvidia.com/gpu.present=true")
        up_ = sum(
            1
            for node in listed["items"]
            for c in node.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        )
        return up_ >= count

    wait_until(f"{count} GPU nodes Ready", ready, timeout=300, interval=2)
    return node_names


def pod(namespace: str, name: str, *, headroom: bool, memory: str) -> dict[str, Any]:
    resources = {names.GPU: "1"} if headroom else {names.GPU_SHARED: "1"}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"bench": "1"}}
    if headroom:
        metadata["annotations"] = {names.ANNOTATION_GPU_MEMORY: memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {
                        "requests": {"cpu": "10m", **resources},
                        "limits": resources,
                    },
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_pods(cluster: Cluster, objects: list[dict[str, Any]]) -> float:
    """Create ``objects`` with CREATE_THREADS kubectl-free API calls at once; seconds taken."""
    from kubernetes import client

    from kube.config import api_client

    api = client.CoreV1Api(api_client(str(cluster.kubeconfig)))
    api.api_client.configuration.connection_pool_maxsize = CREATE_THREADS
    started = time.monotonic()

    def create(obj: dict[str, Any]) -> None:
        # The client accepts plain dicts (it serialises either); its stubs say V1Pod.
        api.create_namespaced_pod(obj["metadata"]["namespace"], obj, _preload_content=False)  # type: ignore[arg-type]

    with concurrent.futures.ThreadPoolExecutor(CREATE_THREADS) as pool:
        for future in concurrent.futures.as_completed([pool.submit(create, o) for o in objects]):
            future.result()
    return time.monotonic() - started


def bound_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return [p for p in items if p["spec"].get("nodeName")]


def wait_bound(
    cluster: Cluster, namespace: str, target: int, stall: float, started: float
) -> tuple[int, float]:
    """Poll until ``target`` pods are bound or nothing moved for ``stall`` s.

    (bound, seconds from ``started`` to the last new binding seen)."""
    last_change, last_count, last_time = started, -1, started
    while True:
        count = len(bound_pods(cluster, namespace))
        now = time.monotonic()
        if count != last_count:
            last_change, last_count, last_time = now, count, now
            _progress(f"{namespace}: {count}/{target} bound after {now - started:.1f}s")
        if count >= target or now - last_change > stall:
            return last_count, last_time - started
        time.sleep(0.5)


def declared(p: dict[str, Any]) -> int:
    """Σ headroom.dev/gpu-memory over containers, else the webhook's annotation, else 0."""
    total = 0
    for container in p["spec"].get("containers", []):
        value = (container.get("resources", {}).get("limits") or {}).get(names.GPU_MEMORY)
        if value:
            total += parse_bytes(value)
    if total:
        return total
    annotation = (p["metadata"].get("annotations") or {}).get(names.ANNOTATION_DECLARED_MEMORY)
    return parse_bytes(annotation) if annotation else 0


def overcommitted(
    bound: list[dict[str, Any]], gpus: int, replicas: int, margin: int
) -> tuple[int, int]:
    """(GPUs over their memory, nodes over their slots), from the bound pods alone.

    KWOK nodes have no device plugin, so each node's pods are given GPUs as the
    NVIDIA device plugin's default ``distributed`` policy would (headroom.spread),
    in the order they were bound: each to a GPU with the fewest pods, the lowest
    index on a tie.
    """
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in bound:
        by_node[p["spec"]["nodeName"]].append(p)
    limit = A100_MIB * MIB - margin
    over_memory = over_slots = 0
    for pods in by_node.values():
        pods.sort(key=lambda p: (_scheduled_at(p), p["metadata"]["name"]))
        count = [0] * gpus
        memory = [0] * gpus
        for p in pods:
            gpu = min(range(gpus), key=lambda g: (count[g], g))
            count[gpu] += 1
            memory[gpu] += declared(p)
        over_memory += sum(1 for used in memory if used > limit)
        over_slots += len(pods) > gpus * replicas
    return over_memory, over_slots


def _scheduled_at(p: dict[str, Any]) -> str:
    for condition in p.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return str(condition.get("lastTransitionTime", ""))
    return ""


def fit_bound(node_count: int, gpus: int, replicas: int, memory: int, margin: int) -> int:
    per_gpu = min(replicas, (A100_MIB * MIB - margin) // memory)
    return node_count * gpus * per_gpu


def clear(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
        "--wait=true", "--timeout=300s", timeout=360,
    )  # fmt: skip


def create_namespace(cluster: Cluster, name: str, policy: str | None = None) -> None:
    """A namespace (labelled with ``policy``), once pods can be created in it."""
    cluster.kubectl("create", "namespace", name)
    if policy:
        cluster.kubectl("label", "namespace", name, f"{names.LABEL_POLICY}={policy}")
    wait_until(
        f"ServiceAccount default in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
    )


def phase(
    cluster: Cluster, label: str, namespace: str, scheduler: str, objects: list[dict[str, Any]],
    target: int, stall: float,
) -> dict[str, Any]:  # fmt: skip
    cluster.stop(scheduler)
    create_s = create_pods(cluster, objects)
    _progress(f"{label}: {len(objects)} pods created in {create_s:.1f}s; starting {scheduler}")
    # Timed from the restart: process start and lease acquisition count for both
    # schedulers alike, and pods bind while start() still waits for readiness.
    started = time.monotonic()
    cluster.start(scheduler)
    count, seconds = wait_bound(cluster, namespace, target, stall, started)
    return {
        "bound": count,
        "seconds": round(seconds, 2),
        "pods_per_s": round(count / seconds, 2) if seconds else 0.0,
        "create_s": round(create_s, 2),
    }


def run(args: argparse.Namespace, state_dir: Path) -> dict[str, Any]:
    memory = parse_bytes(args.memory)
    margin = DEFAULT_MARGIN_BYTES
    node_file = state_dir.parent / "bench-nodes.yaml"
    node_file.write_text(CPU_NODE_FILE)
    cluster = up(node_file, state_dir, headroom=False, build=False, progress=_progress)
    add_nodes(cluster, args.nodes, args.gpus_per_node, args.replicas)
    _progress(f"{args.nodes} nodes x {args.gpus_per_node} GPUs ready")

    slot_bound = min(args.pods, args.nodes * args.gpus_per_node * args.replicas)
    create_namespace(cluster, "bench-stock")
    stock_objects = [
        pod("bench-stock", f"p-{i:05d}", headroom=False, memory=args.memory)
        for i in range(args.pods)
    ]
    stock = phase(
        cluster, "stock", "bench-stock", "kube-scheduler", stock_objects, slot_bound, args.stall
    )
    clear(cluster, "bench-stock")

    specs = nodes.load(node_file)
    components.install(cluster, specs, _progress)
    create_namespace(cluster, "bench-headroom", policy="gpu-shared")
    # The gpu-shared policy selects time-sliced nodes and tolerates the GPU taint: the
    # bench nodes carry the label and no taint, so every one of them is a candidate.
    fits = min(args.pods, fit_bound(args.nodes, args.gpus_per_node, args.replicas, memory, margin))
    headroom_objects = [
        pod("bench-headroom", f"p-{i:05d}", headroom=True, memory=args.memory)
        for i in range(args.pods)
    ]
    headroom = phase(
        cluster, "headroom", "bench-headroom", "headroom-scheduler", headroom_objects, fits,
        args.stall,
    )  # fmt: skip
    bound = bound_pods(cluster, "bench-headroom")
    over_memory, over_slots = overcommitted(bound, args.gpus_per_node, args.replicas, margin)
    ratio = headroom["pods_per_s"] / stock["pods_per_s"] if stock["pods_per_s"] else 0.0
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "replicas": args.replicas,
        "pods": args.pods,
        "memory": args.memory,
        "stock_bound": stock["bound"],
        "stock_seconds": stock["seconds"],
        "stock_pods_per_s": stock["pods_per_s"],
        "headroom_bound": headroom["bound"],
        "headroom_seconds": headroom["seconds"],
        "headroom_pods_per_s": headroom["pods_per_s"],
        "headroom_create_s": headroom["create_s"],
        "stock_create_s": stock["create_s"],
        "ratio": round(ratio, 3),
        "bound": headroom["bound"],
        "fit_bound": fits,
        "fit_fraction": round(headroom["bound"] / fits, 3) if fits else 0.0,
        "overcommitted_gpus": over_memory,
        "over_slots_nodes": over_slots,
        "load_average": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--gpus-per-node", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=4, help="time-slicing replicas per GPU")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--memory", default="8Gi", help="GPU memory each pod declares")
    parser.add_argument(
        "--stall", type=float, default=60.0, help="give up after this long with no new binding"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="headroom-bench-"))
    state_dir = workdir / "cluster"
    try:
        result = run(args, state_dir)
    finally:
        if args.keep:
            _progress(f"cluster left running in {state_dir}")
        else:
            down(state_dir, progress=_progress)
    print(
        f"stock:    {result['stock_bound']} bound in {result['stock_seconds']}s "
        f"({result['stock_pods_per_s']} pods/s)\n"
        f"headroom: {result['headroom_bound']}/{result['fit_bound']} that fit bound in "
        f"{result['headroom_seconds']}s ({result['headroom_pods_per_s']} pods/s); "
        f"ratio {result['ratio']}; over-committed GPUs {result['overcommitted_gpus']}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
