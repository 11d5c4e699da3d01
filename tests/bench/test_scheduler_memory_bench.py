"""The kube-scheduler memory benchmark runs the shipped configuration against the
shipped limit, on objects shaped as it says. The measurement itself is a benchmark
(bench/scheduler_memory_bench.py: it starts etcd, an apiserver and kube-scheduler)."""

import shutil
from collections import Counter
from pathlib import Path
from types import ModuleType

import yaml

from headroom import names
from tests.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


def load() -> ModuleType:
    return load_bench("scheduler_memory_bench")


def test_the_configuration_and_limit_are_the_shipped_ones(tmp_path: Path) -> None:
    bench = load()
    configuration, request, limit = bench.shipped()
    assert [p["schedulerName"] for p in configuration["profiles"]] == ["headroom-scheduler"]
    assert configuration["extenders"][0]["managedResources"]
    assert 0 < request <= limit  # read from the kube-scheduler container, checked below

    # Run outside a pod, only the client's kubeconfig and the lease timings differ.
    running = bench.running_configuration(configuration, tmp_path / "admin.kubeconfig")
    assert running["clientConnection"] == {"kubeconfig": str(tmp_path / "admin.kubeconfig")}
    assert {k: v for k, v in running.items() if k != "clientConnection"} | {
        "leaderElection": configuration["leaderElection"]
    } == configuration
    assert running["leaderElection"]["resourceName"] == "headroom-scheduler"

    # A limit changed in the manifests is the limit the figures are held against.
    for path in (bench.DEPLOYMENT, bench.CONFIGMAP):
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
    deployment = tmp_path / bench.DEPLOYMENT.relative_to(ROOT)
    document = yaml.safe_load(deployment.read_text())
    for container in document["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "kube-scheduler":
            container["resources"]["limits"]["memory"] = "3Gi"
    deployment.write_text(yaml.safe_dump(document))
    assert bench.shipped(tmp_path)[2] == 3072 * MIB


def test_the_shipped_gomemlimit_is_measured_and_leaves_room_under_the_limit() -> None:
    """Go's runtime collects harder as the heap nears GOMEMLIMIT; the container's limit
    kills. The relist peak measured with 1600MiB was 1,625 MiB: 0.79 of 2Gi."""
    bench = load()
    gomemlimit = bench.shipped_env()["GOMEMLIMIT"]
    assert gomemlimit.endswith("MiB")
    _, request, limit = bench.shipped()
    assert request <= int(gomemlimit.removesuffix("MiB")) * MIB <= 0.8 * limit


def test_pods_are_assigned_and_one_in_four_asks_a_shared_gpu() -> None:
    bench = load()
    nodes, pods = 5000, 20000
    gpu_per_node: Counter[str] = Counter()
    for i in range(pods):
        if bench._owner(i // bench.PODS_PER_OWNER)[2]:
            gpu_per_node[f"gpu-node-{i % nodes:05d}"] += 1
    # Each node gets one GPU pod in its four.
    assert len(gpu_per_node) == nodes
    assert set(gpu_per_node.values()) == {1}

    gpu = bench.pod(0, nodes, "uid-0")
    cpu = bench.pod(bench.PODS_PER_OWNER, nodes, "uid-1")
    assert gpu["spec"]["nodeName"] == "gpu-node-00000"
    assert gpu["spec"]["schedulerName"] == names.HEADROOM_SCHEDULER
    limits = gpu["spec"]["containers"][0]["resources"]["limits"]
    assert limits[names.GPU_SHARED] == "1"
    assert limits[names.GPU_MEMORY] == "8Gi"
    assert gpu["metadata"]["ownerReferences"][0]["uid"] == "uid-0"
    assert "schedulerName" not in cpu["spec"]
    assert names.GPU_SHARED not in cpu["spec"]["containers"][0]["resources"]["limits"]
    # The ReplicaSet's selector matches its pods, as the apiserver requires.
    replicaset = bench.replicaset(0)
    assert (
        replicaset["spec"]["selector"]["matchLabels"].items() <= gpu["metadata"]["labels"].items()
    )


def test_nodes_advertise_shared_gpus_and_gpu_memory() -> None:
    bench = load()
    node = bench.node(7, images=50)
    capacity = node["status"]["capacity"]
    assert capacity[names.GPU_SHARED] == "32"
    assert capacity[names.GPU_MEMORY] == "316Gi"  # 8 x (40Gi - the 512Mi margin)
    assert node["status"]["allocatable"][names.GPU_MEMORY] == "316Gi"
    assert node["metadata"]["labels"][names.LABEL_COUNT] == "8"
    assert len(node["status"]["images"]) == 50
    assert len(bench.node(7, images=10)["status"]["images"]) == 10


def test_it_reads_the_bytes_its_lists_received() -> None:
    bench = load()
    metrics = "\n".join(
        [
            "# HELP rest_client_response_size_bytes Response size in bytes.",
            'rest_client_response_size_bytes_sum{host="127.0.0.1:6443",verb="GET"} 2048',
            'rest_client_response_size_bytes_sum{host="127.0.0.1:6443",verb="POST"} 100',
            'rest_client_response_size_bytes_count{host="127.0.0.1:6443",verb="GET"} 3',
        ]
    )
    assert bench.received(metrics) == 2048
    assert (
        bench.cache_size(bench.samples('scheduler_cache_size{type="pods"} 12', "sched"), "pods")
        == 12
    )
