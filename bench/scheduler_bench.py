"""Benchmark (not a test): a scheduling storm through the stock kube-scheduler and Headroom.

Starts its own local cluster (devcluster) in its own state dir, with one CPU
node from the seeds' file and no GPU agents, then adds ``--nodes`` KWOK GPU
nodes through the API, each with ``--gpus-per-node`` time-sliced A100-40GB
GPUs (``--replicas`` per GPU, the GFD labels and ``nvidia.com/gpu.shared``
capacity the device plugin would give them). Then, in the same run:

1. **stock**, ``--rounds`` times: Headroom not installed yet (installed
   already with ``--floor-beside-headroom``, an experiment). The stock
   kube-scheduler is stopped, ``--pods`` pods asking ``nvidia.com/gpu.shared: 1``
   are created, the scheduler is started again, and the bench times, from that
   restart, until every pod that fits by slots is bound; then deletes them.
   This is the floor: it counts slots only.
2. **headroom**, ``--rounds`` times: Headroom is installed (manifests,
   webhook, extender, headroom-scheduler), a namespace is labelled with the
   ``gpu-shared`` policy, headroom-scheduler is stopped, the same number of
   pods asking ``nvidia.com/gpu: 1`` and declaring ``--memory`` are created
   through the webhook, the scheduler is started, and the bench times until
   every pod that fits by memory is bound (or nothing moved for ``--stall``
   seconds).

Each binding is timed by a pod watch as it arrives (:class:`BindWatch`), and
the round with the median rate is reported for each scheduler (every round's
rate is in the JSON). Both schedulers run with client rate limits far above
what they reach (:data:`UNTHROTTLED`), so the floor is kube-scheduler's work,
not its rate limiter. ``--without prioritize`` / ``--without bind`` are
experiments: they leave that verb out of headroom-scheduler's configuration,
to measure what each round trip costs. ``--nodes-to-score PERCENT`` is a
tuning experiment: headroom-scheduler's ``percentageOfNodesToScore``.
``--floor-beside-headroom`` is another: the floor's rounds run with Headroom
installed and idle beside them, as the floor in a Headroom cluster would.
``--placement spread`` is an experiment too: the bench namespace's policy
places pods on the emptiest GPU that fits rather than the fullest (the shipped
``gpu-shared`` binpacks), to measure what binpacking costs kube-scheduler,
which passes every full node on its way to the feasible ones it looks for.

"Fits by memory" is the bound a perfect packer reaches: per GPU
``min(replicas, floor((memory - margin) / declared))`` pods. The over-commit
check is computed from the pods actually bound (never from Headroom's own
state): these nodes run no agent and no device plugin, so each node's bound
pods are dealt out to its GPUs as the NVIDIA device plugin's ``distributed``
policy would, in bind order (:func:`overcommitted`), and each GPU's Σ declared
is held against its memory - margin; pods against the node's slots.
kube-scheduler itself caps a node at its slots and at its advertised
``headroom.dev/gpu-memory``: where those caps already keep every GPU within
its memory (1-GPU nodes; 8Gi pods with 4 replicas on any node), the check
cannot find anything, and ``overcommit_possible`` in the JSON is false. It
tests the extender's per-GPU accounting on multi-GPU nodes whose memory binds
before their slots, e.g. ``--gpus-per-node 8 --replicas 8``.

Prints a table, then one JSON object on its last line. Run:
``.venv/bin/python bench/scheduler_bench.py --nodes 300 --gpus-per-node 1 --pods 1000``.
"""

import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

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


class BindWatch:
    """When each pod of a namespace was first seen bound, from one pod watch.

    A watch rather than polling a list: listing 1,000 pods took about 1.2 s a
    round here (kubectl and the apiserver encoding them), so a poll could only
    say a storm of 4-6 s ended somewhere within a second, and its own load fell
    on the schedulers it timed. The watch (the extender's own reader,
    :class:`kube.informer.Resource`, on a loop in a thread) starts at the
    resourceVersion of a list taken before the scheduler resumes, so no binding
    is missed, and each is stamped with ``time.monotonic()`` as it arrives.
    """

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.kubeconfig = str(cluster.kubeconfig)
        self.namespace = namespace
        self.bound_at: dict[str, float] = {}
        self.changed = threading.Condition()
        self.failure: BaseException | None = None
        self.listed = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=f"watch {namespace}", daemon=True)
        self.thread.start()
        self.listed.wait()
        if self.failure is not None:
            raise RuntimeError(f"listing pods in {namespace} failed") from self.failure

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._watch())
        except BaseException as err:  # the bench reports it rather than hang
            self.failure = err
        finally:
            self.listed.set()
            with self.changed:
                self.changed.notify_all()

    async def _watch(self) -> None:
        from kube.config import credentials
        from kube.informer import Resource
        from kube.rest import Rest

        rest = Rest(credentials(self.kubeconfig), timeout=60)
        try:
            pods = Resource(rest, f"/api/v1/namespaces/{self.namespace}/pods")
            body = json.loads(await pods.list(limit=100_000, token=None))
            now = time.monotonic()
            for item in body["items"]:
                self._seen(item, now)
            version = body["metadata"]["resourceVersion"]
            self.listed.set()
            while True:  # a watch window ends on the server's timeout: go on from there
                async for event in pods.watch(version=version):
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"pod watch failed: {event.get('object')}")
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    self._seen(obj, time.monotonic())
        finally:
            await rest.close()

    def _seen(self, obj: dict[str, Any], now: float) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and (obj.get("spec") or {}).get("nodeName") and name not in self.bound_at:
            with self.changed:
                self.bound_at[name] = now
                self.changed.notify_all()

    def wait(self, target: int, stall: float, started: float) -> tuple[int, float, float]:
        """Until ``target`` pods are bound or no new binding came for ``stall`` s.

        (bound, seconds from ``started`` to the first binding, to the last)."""
        last_count, last_change, reported = -1, time.monotonic(), started
        with self.changed:
            while True:
                if self.failure is not None:
                    raise RuntimeError(f"pod watch of {self.namespace} failed") from self.failure
                count = len(self.bound_at)
                now = time.monotonic()
                if count != last_count:
                    last_count, last_change = count, now
                if now - reported >= 1.0 or count >= target:
                    elapsed = now - started
                    _progress(f"{self.namespace}: {count}/{target} bound after {elapsed:.1f}s")
                    reported = now
                if count >= target or now - last_change > stall:
                    break
                self.changed.wait(timeout=0.5)
        self.loop.call_soon_threadsafe(_cancel_all, self.loop)
        self.thread.join(timeout=10)
        times = sorted(self.bound_at.values())
        if not times:
            return 0, 0.0, 0.0
        return len(times), max(0.0, times[0] - started), times[-1] - started


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


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


def overcommit_possible(gpus: int, replicas: int, memory: int, margin: int) -> bool:
    """Whether a GPU can be over-committed at all past kube-scheduler's own node checks.

    kube-scheduler admits at most a node's ``nvidia.com/gpu.shared`` slots and its
    advertised ``headroom.dev/gpu-memory`` (Σ over its GPUs of memory - margin) of
    pods. Dealt out as :func:`overcommitted` deals them, the busiest GPU then holds
    ``ceil(most / gpus)``. Where that fits the GPU (always on a 1-GPU node; with 8Gi
    pods and 4 replicas on any node), ``overcommitted_gpus`` is 0 whatever the
    extender does, and says nothing about its per-GPU accounting.
    """
    per_gpu = A100_MIB * MIB - margin
    most = min(gpus * replicas, gpus * per_gpu // memory)
    busiest = -(-most // gpus)
    return busiest * memory > per_gpu


def clear(cluster: Cluster, namespace: str) -> None:
    """Delete every pod of ``namespace`` and wait until the apiserver has none left.

    Gracefully: KWOK reports each pod stopped, as kubelet does, before it removes
    it. A forced deletion shows the pod's containers still running, and the
    extender keeps charging such a pod for its grace period (kubelet may still run
    it), so the next round would find the nodes charged. Not ``kubectl delete
    --wait``: with 1,000 pods it sometimes waited out its whole timeout on pods
    that were long gone.
    """
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--wait=false", timeout=360,
    )  # fmt: skip
    wait_until(
        f"every pod of {namespace} deleted",
        lambda: not cluster.kubectl_json("get", "pods", "-n", namespace)["items"],
        timeout=300,
        interval=1,
    )


def create_namespace(
    cluster: Cluster, name: str, policy: str | None = None, *, exempt: bool = False
) -> None:
    """A namespace (labelled with ``policy``, or exempt from Headroom's admission
    policies), once pods can be created in it."""
    cluster.kubectl("create", "namespace", name)
    if policy:
        cluster.kubectl("label", "namespace", name, f"{names.LABEL_POLICY}={policy}")
    if exempt:
        cluster.kubectl("label", "namespace", name, f"{names.LABEL_EXEMPT}=true")
    wait_until(
        f"ServiceAccount default in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
    )


UNTHROTTLED = {"qps": 5000, "burst": 10000}
"""Client rate limits for both schedulers in the bench, far above what they reach.

The local cluster gives every scheduler 200 qps with a burst of 400
(devcluster.controlplane): 1,000 binds then take at least 3 s however fast
the scheduler is, and the stock floor measured exactly that, 333 pods/s from
first binding to last in either shape. Headroom's binds go out through the
extender's own client and were never held to it. So the bench lifts the limit
for both, and the floor is what kube-scheduler does, not its rate limiter.
"""


VERBS = ("prioritize", "bind")
"""Extender verbs ``--without`` may leave out of headroom-scheduler's configuration."""


def spread_policy(cluster: Cluster) -> str:
    """A copy of the shipped ``gpu-shared`` policy that spreads; its name, once the
    webhook admits pods by it (server-side dry runs until one is annotated so)."""
    shipped = cluster.kubectl_json("get", "gpusharingpolicy", "gpu-shared")
    name = "bench-spread"
    cluster.kubectl.apply([{
        "apiVersion": shipped["apiVersion"], "kind": shipped["kind"],
        "metadata": {"name": name}, "spec": {**shipped["spec"], "placement": "spread"},
    }])  # fmt: skip
    create_namespace(cluster, "bench-probe", policy=name)
    probe = pod("bench-probe", "probe", headroom=True, memory="1Gi")

    def spreads() -> bool:
        done = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        if done.returncode:
            return False
        annotations = json.loads(done.stdout)["metadata"].get("annotations", {})
        return bool(annotations.get(names.ANNOTATION_PLACEMENT) == "spread")

    wait_until(f"the webhook to admit pods by policy {name}", spreads, timeout=60, interval=1)
    return name


def configure(
    cluster: Cluster,
    scheduler: str,
    without: tuple[str, ...] = (),
    nodes_to_score: int | None = None,
) -> None:
    """Raise ``scheduler``'s client rate limits (:data:`UNTHROTTLED`), drop the
    extender verbs ``without`` from its configuration file, and set its
    ``percentageOfNodesToScore`` if ``nodes_to_score``; it reads the file when it
    next starts."""
    path = cluster.state.config / f"{scheduler}.yaml"
    document = yaml.safe_load(path.read_text())
    document.setdefault("clientConnection", {}).update(UNTHROTTLED)
    if nodes_to_score is not None:
        document["percentageOfNodesToScore"] = nodes_to_score
    for extender in document.get("extenders") or []:
        for verb in without:
            extender.pop(f"{verb}Verb", None)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def cpu_seconds(cluster: Cluster) -> dict[str, float]:
    """Component -> CPU seconds (user + system) its process group has used so far.

    Read from /proc (Linux), children a process has waited for included; a
    process that has exited is not counted, so a scheduler restarted for a
    round counts from its start. On a machine whose cores the storm saturates,
    the rate follows the CPU each pod costs; this says which process spends it.
    """
    groups = {c.pid: name for name, c in cluster.components.items() if c.pid}
    used = dict.fromkeys(groups.values(), 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # exited while we looked
            continue
        # After "pid (comm)": state ppid pgrp ... utime stime cutime cstime (fields 3,
        # 4, 5, 14-17 of proc_pid_stat(5)).
        name = groups.get(int(fields[2]))
        if name is not None:
            used[name] += sum(int(f) for f in fields[11:15]) / tick
    return used


def phase(
    cluster: Cluster, label: str, namespace: str, scheduler: str, objects: list[dict[str, Any]],
    target: int, stall: float, without: tuple[str, ...] = (), nodes_to_score: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    cluster.stop(scheduler)
    configure(cluster, scheduler, without, nodes_to_score)
    create_s = create_pods(cluster, objects)
    _progress(f"{label}: {len(objects)} pods created in {create_s:.1f}s; starting {scheduler}")
    # Timed from the restart: process start and lease acquisition count for both
    # schedulers alike, and pods bind while start() still waits for readiness.
    watch = BindWatch(cluster, namespace)
    before = cpu_seconds(cluster)
    started = time.monotonic()
    cluster.start(scheduler)
    count, first, last = watch.wait(target, stall, started)
    after = cpu_seconds(cluster)
    cpu = {name: round(used - before.get(name, 0.0), 2) for name, used in after.items()}
    cpu = {name: used for name, used in sorted(cpu.items()) if used > 0}
    steady = last - first
    return {
        "bound": count,
        "seconds": round(last, 2),
        "pods_per_s": round(count / last, 2) if last else 0.0,
        "first_bind_s": round(first, 2),
        # From the first binding to the last: the scheduling rate without the
        # process start and lease acquisition that both schedulers pay alike.
        "steady_pods_per_s": round((count - 1) / steady, 2) if steady > 0 else 0.0,
        "create_s": round(create_s, 2),
        "cpu_s": cpu,
        "cpu_ms_per_pod": round(1000 * sum(cpu.values()) / count, 2) if count else 0.0,
    }


def run(args: argparse.Namespace, state_dir: Path) -> dict[str, Any]:
    memory = parse_bytes(args.memory)
    margin = DEFAULT_MARGIN_BYTES
    node_file = state_dir.parent / "bench-nodes.yaml"
    node_file.write_text(CPU_NODE_FILE)
    cluster = up(node_file, state_dir, headroom=False, build=False, progress=_progress)
    add_nodes(cluster, args.nodes, args.gpus_per_node, args.replicas)
    _progress(f"{args.nodes} nodes x {args.gpus_per_node} GPUs ready")

    specs = nodes.load(node_file)
    if args.floor_beside_headroom:
        components.install(cluster, specs, _progress)
    slot_bound = min(args.pods, args.nodes * args.gpus_per_node * args.replicas)
    create_namespace(cluster, "bench-stock", exempt=args.floor_beside_headroom)
    stock_objects = [
        pod("bench-stock", f"p-{i:05d}", headroom=False, memory=args.memory)
        for i in range(args.pods)
    ]
    stock_rounds = []
    for round_ in range(args.rounds):
        label = f"stock {round_ + 1}/{args.rounds}"
        stock_rounds.append(
            phase(cluster, label, "bench-stock", "kube-scheduler", stock_objects, slot_bound,
                  args.stall)
        )  # fmt: skip
        clear(cluster, "bench-stock")
        if args.floor_beside_headroom:
            # Charged whole GPUs (they declare nothing) until the extender sees them go.
            wait_until(
                "the extender to see the floor's pods deleted",
                lambda: _assumed_and_charged(cluster) == 0,
                timeout=120,
                interval=1,
            )

    if not args.floor_beside_headroom:
        components.install(cluster, specs, _progress)
    policy = "gpu-shared" if args.placement == "binpack" else spread_policy(cluster)
    create_namespace(cluster, "bench-headroom", policy=policy)
    # The gpu-shared policy selects time-sliced nodes and tolerates the GPU taint: the
    # bench nodes carry the label and no taint, so every one of them is a candidate.
    fits = min(args.pods, fit_bound(args.nodes, args.gpus_per_node, args.replicas, memory, margin))
    headroom_objects = [
        pod("bench-headroom", f"p-{i:05d}", headroom=True, memory=args.memory)
        for i in range(args.pods)
    ]
    headroom_rounds = []
    for round_ in range(args.rounds):
        label = f"headroom {round_ + 1}/{args.rounds}"
        result = phase(
            cluster, label, "bench-headroom", "headroom-scheduler", headroom_objects, fits,
            args.stall, tuple(args.without), args.nodes_to_score,
        )  # fmt: skip
        bound = bound_pods(cluster, "bench-headroom")
        result["overcommitted_gpus"], result["over_slots_nodes"] = overcommitted(
            bound, args.gpus_per_node, args.replicas, margin
        )
        headroom_rounds.append(result)
        if round_ + 1 < args.rounds:
            clear(cluster, "bench-headroom")
            # The extender learns of the deletions through its watch: until it has
            # seen them all, the next round's pods would find the nodes still charged.
            wait_until(
                "the extender to see the bench pods deleted",
                lambda: _assumed_and_charged(cluster) == 0,
                timeout=120,
                interval=1,
            )

    stock = _median_round(stock_rounds)
    headroom = _median_round(headroom_rounds)
    ratio = headroom["pods_per_s"] / stock["pods_per_s"] if stock["pods_per_s"] else 0.0
    steady = (
        headroom["steady_pods_per_s"] / stock["steady_pods_per_s"]
        if stock["steady_pods_per_s"]
        else 0.0
    )
    bound_least = min(r["bound"] for r in headroom_rounds)
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "replicas": args.replicas,
        "pods": args.pods,
        "memory": args.memory,
        "rounds": args.rounds,
        "without": list(args.without),
        "nodes_to_score": args.nodes_to_score,
        "placement": args.placement,
        "floor_beside_headroom": args.floor_beside_headroom,
        "stock_bound": min(r["bound"] for r in stock_rounds),
        "stock_seconds": stock["seconds"],
        "stock_pods_per_s": stock["pods_per_s"],
        "headroom_bound": bound_least,
        "headroom_seconds": headroom["seconds"],
        "headroom_pods_per_s": headroom["pods_per_s"],
        "headroom_create_s": headroom["create_s"],
        "stock_create_s": stock["create_s"],
        "stock_first_bind_s": stock["first_bind_s"],
        "headroom_first_bind_s": headroom["first_bind_s"],
        "stock_steady_pods_per_s": stock["steady_pods_per_s"],
        "headroom_steady_pods_per_s": headroom["steady_pods_per_s"],
        "ratio": round(ratio, 3),
        "steady_ratio": round(steady, 3),
        "bound": bound_least,
        "fit_bound": fits,
        "fit_fraction": round(bound_least / fits, 3) if fits else 0.0,
        "overcommitted_gpus": max(r["overcommitted_gpus"] for r in headroom_rounds),
        # False: kube-scheduler's slots and node-level memory alone keep every GPU
        # within its memory in this shape, so the 0 above tests nothing of Headroom's.
        "overcommit_possible": overcommit_possible(
            args.gpus_per_node, args.replicas, memory, margin
        ),
        "over_slots_nodes": max(r["over_slots_nodes"] for r in headroom_rounds),
        # CPU the whole cluster spent per bound pod, in the median round: the cost
        # a CPU-bound machine turns into the rate, less noisy than the rate.
        "stock_cpu_ms_per_pod": stock["cpu_ms_per_pod"],
        "headroom_cpu_ms_per_pod": headroom["cpu_ms_per_pod"],
        "cpu_ratio": round(headroom["cpu_ms_per_pod"] / stock["cpu_ms_per_pod"], 3)
        if stock["cpu_ms_per_pod"]
        else 0.0,
        "stock_cpu_s": stock["cpu_s"],
        "headroom_cpu_s": headroom["cpu_s"],
        "stock_rounds_pods_per_s": [r["pods_per_s"] for r in stock_rounds],
        "headroom_rounds_pods_per_s": [r["pods_per_s"] for r in headroom_rounds],
        "load_average": os.getloadavg()[0],
    }


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median rate (the lower middle one of an even count)."""
    ordered = sorted(rounds, key=lambda r: r["pods_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def _assumed_and_charged(cluster: Cluster) -> int:
    """What the extender's ``/state`` still charges (:func:`charged`)."""
    url = f"http://127.0.0.1:{cluster.state.port('extender')}/state"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return charged(json.load(answer))


def charged(state: dict[str, Any]) -> int:
    """Pods the extender still holds or charges on a GPU, plus the bytes it charges.

    The pods too, not only the declared bytes: a pod that declares nothing (the
    floor's pods in an exempt namespace) is charged its whole GPU with 0 declared.
    """
    gpus = [gpu for node in state["nodes"].values() for gpu in node["gpus"]]
    pods = sum(len(gpu["pods"]) for gpu in gpus)
    return len(state["assumed"]) + pods + sum(int(gpu["accounted"]) for gpu in gpus)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300, help="KWOK GPU nodes (default 300)")
    parser.add_argument(
        "--gpus-per-node", type=int, default=1, help="A100-40GB GPUs per node (default 1)"
    )
    parser.add_argument("--replicas", type=int, default=4, help="time-slicing replicas per GPU")
    parser.add_argument(
        "--pods", type=int, default=1000, help="pods per storm, for each scheduler (default 1000)"
    )
    parser.add_argument("--memory", default="8Gi", help="GPU memory each pod declares")
    parser.add_argument(
        "--stall", type=float, default=60.0, help="give up after this long with no new binding"
    )
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="storms per scheduler; the median round is reported (each is in the JSON)",
    )  # fmt: skip
    parser.add_argument(
        "--without", action="append", default=[], choices=VERBS, metavar="VERB",
        help="an experiment, not a configuration to run: leave this extender verb out of "
        "headroom-scheduler's configuration (prioritize: kube-scheduler's scores alone; "
        "bind: kube-scheduler binds, and the extender's race guard is gone); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--nodes-to-score", type=int, metavar="PERCENT",
        help="a tuning experiment: headroom-scheduler's percentageOfNodesToScore (default: "
        "kube-scheduler's adaptive one, as shipped; it finds at least 100 feasible nodes "
        "whatever the percentage, and the extender chooses among those)",
    )  # fmt: skip
    parser.add_argument(
        "--placement", choices=("binpack", "spread"), default="binpack",
        help="an experiment: the bench namespace's policy places pods on the fullest GPU "
        "that fits (binpack, the shipped gpu-shared policy) or the emptiest (spread, a copy)",
    )  # fmt: skip
    parser.add_argument(
        "--floor-beside-headroom", action="store_true",
        help="an experiment: install Headroom before the stock rounds, so the floor runs in "
        "the same cluster as Headroom's, its idle extender and headroom-scheduler watching "
        "its pods (which run in a namespace labelled headroom.dev/exempt=true: Headroom's "
        "admission policies refuse shared replicas without a declaration elsewhere)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    return parser


def main() -> int:
    args = arguments().parse_args()
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
        f"{'' if result['overcommit_possible'] else ' (cannot be otherwise in this shape)'}\n"
        f"first binding to last: stock {result['stock_steady_pods_per_s']} pods/s, "
        f"headroom {result['headroom_steady_pods_per_s']} pods/s; "
        f"ratio {result['steady_ratio']}\n"
        f"CPU per pod: stock {result['stock_cpu_ms_per_pod']} ms {result['stock_cpu_s']}, "
        f"headroom {result['headroom_cpu_ms_per_pod']} ms {result['headroom_cpu_s']}; "
        f"ratio {result['cpu_ratio']}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
