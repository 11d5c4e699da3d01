"""Benchmark (not a test): the extender's and the webhook's memory at 20,000 pods and 5,000 nodes.

Each case runs in a fresh Python process, which imports what the component's
command imports (cli.main and its service), builds its API clients as the
service does, and builds the component's real caches (kube.informer.Informer
with the component's own handlers and store policy, extender.state.ClusterState
and its capacity advertiser, or the webhook's ClusterCache) and feeds them a
re-list as the apiserver would send it, through the informer's own paging and
parsing (kube.informer: pages of about PAGE_BYTES of JSON): objects shaped
like real ones (managedFields, container images, env, status conditions; GFD
labels and an image list on nodes). No apiserver is needed: the figure is the
component's own memory.
The process then reports its resident set (VmRSS) and its peak (VmHWM), the
figure a container's memory limit kills on, against the limit shipped in
manifests/base, read from there (extender 512Mi, webhook 256Mi). The goal (issue 8) is a peak
under 25% of the limit.

The *floor* in the same run is the same process after its imports and a
re-list whose objects it drops (the pages in flight); the *whole* case keeps
every object whole in the informer's store and lists in one unpaged
response, as Headroom did before (issue 8 measured ~27 KiB per pod and a
crash loop at 16-18k pods).

Run: ``.venv/bin/python bench/memory_bench.py [--pods 20000] [--nodes 5000]``.
Prints a table, then one JSON object on its last line.
"""

import argparse
import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIB = 2**20
CONTAINERS = {
    "extender": ("manifests/base/scheduler/deployment.yaml", "extender"),
    "webhook": ("manifests/base/webhook/deployment.yaml", "webhook"),
}
"""Where each component's container, and its memory limit, is shipped."""


def shipped_limits(root: Path = ROOT) -> dict[str, int]:
    """Each component's container memory limit as manifests/base sets it, in bytes."""
    import yaml

    from headroom.quantity import parse_bytes

    limits = {}
    for component, (path, name) in CONTAINERS.items():
        document = yaml.safe_load((root / path).read_text())
        containers = document["spec"]["template"]["spec"]["containers"]
        (container,) = [c for c in containers if c["name"] == name]
        limits[component] = parse_bytes(str(container["resources"]["limits"]["memory"]))
    return limits


GPU_POD_EVERY = 4
"""One pod in four asks for a shared GPU; the rest are ordinary CPU pods."""


def _managed_fields(manager: str) -> list[dict[str, Any]]:
    fields: dict[str, Any] = {f"f:field{i}": {".": {}, f"f:sub{i}": {}} for i in range(40)}
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-24T07:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": fields},
        },
        {
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-24T07:00:05Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {f"f:condition{i}": {} for i in range(12)}},
            "subresource": "status",
        },
    ]


def pod(i: int, nodes: int) -> dict[str, Any]:
    gpu = i % GPU_POD_EVERY == 0
    limits: dict[str, str] = {"cpu": "2", "memory": "4Gi"}
    annotations = {"kubectl.kubernetes.io/restartedAt": "2026-11-24T07:00:00Z"}
    if gpu:
        limits |= {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "8Gi"}
        annotations |= {"headroom.dev/mode": "shared", "headroom.dev/declared-memory": "8Gi"}
    namespace = f"tenant-{i % 500}"
    container = {
        "name": "main",
        "image": f"registry.example.com/team-{i % 50}/trainer:v1.{i % 9}.3",
        "command": ["python", "-m", "train", "--config", "/etc/train/config.yaml"],
        "env": [{"name": f"VAR_{k}", "value": f"value-{k}-{i}"} for k in range(12)],
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": [
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io"}
        ],
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }
    return {
        "metadata": {
            "name": f"job-{i}-abcde",
            "generateName": f"job-{i}-",
            "namespace": namespace,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-11-24T07:00:00Z",
            "labels": {"app": f"job-{i % 200}", "pod-template-hash": "7d9f8c6b5"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"job-{i % 200}-7d9f8c6b5",
                    "uid": f"11111111-0000-4000-8000-{i % 200:012d}",
                    "controller": True,
                }
            ],
            "managedFields": _managed_fields("kube-controller-manager"),
        },
        "spec": {
            "containers": [container],
            "nodeName": f"node-{i % nodes}",
            "schedulerName": "headroom-scheduler" if gpu else "default-scheduler",
            "serviceAccountName": "default",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "priority": 0,
            "restartPolicy": "Always",
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "startTime": "2026-11-24T07:00:01Z",
            "qosClass": "Guaranteed",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-11-24T07:00:02Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": container["image"],
                    "imageID": "registry.example.com/trainer@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "state": {"running": {"startedAt": "2026-11-24T07:00:03Z"}},
                }
            ],
        },
    }


def node(i: int) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": f"node-{i}",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.product": "A100-SXM4-40GB-SHARED",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/mig.capable": "true",
        **{f"feature.node.kubernetes.io/cpu-cpuid.FEATURE{k}": "true" for k in range(40)},
    }
    capacity = {"cpu": "128", "memory": "1056Gi", "pods": "110", "nvidia.com/gpu.shared": "32"}
    return {
        "metadata": {
            "name": f"node-{i}",
            "uid": f"22222222-0000-4000-8000-{i:012d}",
            "resourceVersion": str(200000 + i),
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": _managed_fields("kubelet"),
        },
        "spec": {"podCIDR": f"10.{i % 256}.0.0/24"},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": t, "status": "False", "reason": f"Kubelet{t}", "message": "ok " * 10}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ],
            "images": [
                {
                    "names": [
                        f"registry.example.com/image-{k}@sha256:" + "ef" * 32,
                        f"registry.example.com/image-{k}:v{k}",
                    ],
                    "sizeBytes": 10**9 + k,
                }
                for k in range(30)
            ],
            "nodeInfo": {"kubeletVersion": "v1.34.4", "containerRuntimeVersion": "containerd://2"},
        },
    }


def report(i: int) -> dict[str, Any]:
    from headroom.reports import GPUUsage, ReportStatus, report_object

    gpus = [
        GPUUsage(index=g, uuid=f"GPU-{i}-{g}", product="NVIDIA A100-SXM4-40GB",
                 total_bytes=40 * 2**30, used_bytes=2**30, free_bytes=39 * 2**30)
        for g in range(8)
    ]  # fmt: skip
    observed = datetime(2026, 11, 24, 7, tzinfo=UTC)
    status = ReportStatus(node_name=f"node-{i}", backend="nvml", observed_at=observed, gpus=gpus)
    return report_object(status)


def rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in bytes."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found["VmRSS"], found["VmHWM"]


class _Listing:
    """A :class:`kube.informer.Source` serving ``count`` objects from ``make``, as the
    apiserver pages a list: each page's JSON is built when asked for, as it arrives
    from the network, and the informer's own ``_relist`` parses, hands over and
    drops it. ``paged=False``: one response with everything, as before issue 8.
    """

    def __init__(self, make: Any, count: int, *, paged: bool = True) -> None:
        self.make = make
        self.count = count
        self.paged = paged
        self.limits: list[int] = []

    async def list(self, *, limit: int, token: str | None) -> bytes:
        # As a read from the network would, this yields to the loop: what the
        # handlers started for the last page (the advertiser's patches) runs.
        await asyncio.sleep(0)
        start = int(token or 0)
        end = min(self.count, start + limit) if self.paged else self.count
        self.limits.append(end - start)
        items = b",".join(json.dumps(self.make(i)).encode() for i in range(start, end))
        meta: dict[str, str] = {"resourceVersion": "1"}
        if end < self.count:
            meta["continue"] = str(end)
        return b'{"metadata":' + json.dumps(meta).encode() + b',"items":[' + items + b"]}"

    def watch(self, *, version: str) -> Any:
        raise NotImplementedError("the benchmark lists only")


async def _feed(informer: Any) -> None:
    """One re-list, through the informer's own paging and parsing."""
    await informer._relist()


async def run_case(component: str, mode: str, pods: int, nodes: int) -> dict[str, Any]:
    # Each process imports what its component's command imports (``headroom extender``
    # and ``headroom webhook`` start in cli.main), no more: the floor counts them.
    import cli.main  # noqa: F401

    if component == "extender":
        import extender.service  # noqa: F401
    else:
        import webhook.service  # noqa: F401
    from kube.informer import Informer, identity

    whole = mode == "whole"
    keep = None if whole else identity

    def informer(make: Any, count: int, name: str, handler: Any = None) -> Informer:
        return Informer(
            _Listing(make, count, paged=not whole), name=name, handler=handler, keep=keep
        )

    base_rss, _ = rss()
    clients = _clients(component)
    try:
        return await _fill(component, mode, pods, nodes, informer, base_rss)
    finally:
        for each in clients:
            if hasattr(each, "close"):
                await each.close()


def _clients(component: str) -> list[Any]:
    """The component's API clients, built as its service builds them: what building
    them imports or allocates counts (the official client's CoreV1Api alone, which
    the extender used to build, imported ~250 model modules: 21 MiB)."""
    from kube.config import Credentials
    from kube.rest import Rest

    nowhere = Credentials(server="http://127.0.0.1:9")
    if component == "extender":
        from extender.binding import ApiCalls, api_binder, api_reader
        from extender.cache import WATCH_CONNECTIONS
        from extender.capacity import api_patcher
        from extender.preemption import api_recorder
        from extender.requeue import api_stamper
        from kube.informer import LIST_TIMEOUT_SECONDS

        calls = ApiCalls(nowhere)
        watches = Rest(nowhere, timeout=LIST_TIMEOUT_SECONDS, connections=WATCH_CONNECTIONS)
        return [calls, watches, api_binder(calls), api_reader(calls), api_patcher(calls),
                api_stamper(calls), api_recorder(calls)]  # fmt: skip
    from webhook.service import API_CONNECTIONS, EVICTION_READ_TIMEOUT

    return [Rest(nowhere, timeout=EVICTION_READ_TIMEOUT, connections=API_CONNECTIONS)]


async def _no_patch(name: str, body: dict[str, Any]) -> None:
    """The advertiser's patches, as if the apiserver took each at once."""


async def _fill(
    component: str, mode: str, pods: int, nodes: int, informer: Any, base_rss: int
) -> dict[str, Any]:
    if component == "extender":
        from extender.capacity import CapacityAdvertiser
        from extender.preemption import Budgets
        from extender.state import ClusterState
    else:
        from webhook.cache import ClusterCache
    whole = mode == "whole"
    if mode == "floor":
        # The largest pages the slim cases parse, parsed and dropped as they do.
        if component == "extender":
            await _feed(informer(lambda i: pod(i, nodes), 1000, "pods"))
        await _feed(informer(node, 1000, "nodes"))
        current, peak = rss()
        return {"rss": current, "hwm": peak, "base": base_rss, "held": 0, "pages": {}}
    if component == "extender":
        state = ClusterState(margin=512 * MIB, stale_after=90.0)
        advertiser = CapacityAdvertiser(_no_patch, 512 * MIB)
        advertiser.on_node = _keep_whole(advertiser) if whole else advertiser.on_node  # type: ignore[method-assign]
        budgets = Budgets()

        def on_node(kind: str, obj: dict[str, Any]) -> None:
            state.on_node(kind, obj)
            advertiser.on_node(kind, obj)

        informers = [
            informer(node, nodes, "nodes", on_node),
            informer(report, nodes, "reports", state.on_report),
            informer(lambda i: pod(i, nodes), pods, "pods", state.on_pod),
            informer(lambda i: {}, 0, "pdbs", budgets.on_event),
        ]
        for each in informers:
            await _feed(each)
            await asyncio.sleep(0)  # what the handlers scheduled runs, as between pages
        state.prepare(state.clock())
        held = len(state.pods)
    else:
        cache = ClusterCache(watch_nodes=True)

        def namespace(i: int) -> dict[str, Any]:
            return {
                "metadata": {
                    "name": f"tenant-{i}",
                    "uid": f"33333333-0000-4000-8000-{i:012d}",
                    "labels": {"headroom.dev/policy": "gpu-shared", "team": f"t{i}"},
                    "managedFields": _managed_fields("kubectl"),
                },
                "status": {"phase": "Active"},
            }

        informers = [
            informer(namespace, 500, "namespaces", cache.on_namespace),
            informer(node, nodes, "nodes", cache.on_node),
        ]
        for each in informers:
            await _feed(each)
        held = sum(len(each.uids) for each in informers)
    current, peak = rss()
    # The largest page each list came in.
    pages = {each.name: max(cast(_Listing, each._source).limits, default=0) for each in informers}
    return {"rss": current, "hwm": peak, "base": base_rss, "held": held, "pages": pages}


def _keep_whole(advertiser: Any) -> Any:
    """The advertiser as before issue 8: every node kept whole."""

    def on_node(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            advertiser._latest.pop(name, None)
        else:
            advertiser._latest[name] = obj

    return on_node


def child(component: str, mode: str, pods: int, nodes: int) -> None:
    import gc

    result = asyncio.run(run_case(component, mode, pods, nodes))
    gc.collect()
    print(json.dumps(result))


def measure(component: str, mode: str, pods: int, nodes: int) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", component, mode, "--pods", str(pods),
            "--nodes", str(nodes)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pods", type=int, default=20000, help="pods, one in four shared GPU (default 20000)"
    )
    parser.add_argument(
        "--nodes", type=int, default=5000, help="eight-GPU nodes, with reports (default 5000)"
    )
    parser.add_argument("--child", nargs=2, metavar=("COMPONENT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        component, mode = args.child
        child(component, mode, args.pods, args.nodes)
        return
    summary: dict[str, Any] = {"pods": args.pods, "nodes": args.nodes}
    header = ("component", "mode", "RSS MiB", "peak MiB", "limit", "peak/limit")
    print("{:<10} {:<6} {:>8} {:>9} {:>6} {:>10}".format(*header))
    limits = shipped_limits()  # here, not in the measured children
    for component, limit in limits.items():
        for mode in ("floor", "slim", "whole"):
            print(f"  measuring {component} {mode} ...", file=sys.stderr, flush=True)
            r = measure(component, mode, args.pods, args.nodes)
            share = r["hwm"] / limit
            print(
                f"{component:<10} {mode:<6} {r['rss'] / MIB:>8.0f} {r['hwm'] / MIB:>9.0f} "
                f"{limit // MIB:>5}M {share:>10.2f}"
            )
            summary[f"{component}_{mode}_peak_mib"] = round(r["hwm"] / MIB, 1)
            summary[f"{component}_{mode}_peak_over_limit"] = round(share, 3)
            if mode == "slim":
                summary[f"{component}_largest_pages"] = r["pages"]
    for component in limits:
        floor = summary[f"{component}_floor_peak_mib"]
        slim = summary[f"{component}_slim_peak_mib"] - floor
        whole = summary[f"{component}_whole_peak_mib"] - floor
        summary[f"{component}_cache_mib"] = round(slim, 1)
        summary[f"{component}_whole_over_slim"] = round(whole / slim, 2) if slim > 0 else None
    summary["extender_goal_met"] = summary["extender_slim_peak_over_limit"] <= 0.25
    summary["webhook_goal_met"] = summary["webhook_slim_peak_over_limit"] <= 0.25
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
