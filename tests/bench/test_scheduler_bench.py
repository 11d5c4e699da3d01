"""The scheduler storm's own logic: what it changes in a scheduler's configuration, and
which round it reports. The storm itself is a benchmark (bench/scheduler_bench.py)."""

import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from devcluster import controlplane
from devcluster.components import extender_configuration
from tests.bench import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("scheduler_bench")


def headroom_scheduler(tmp_path: Path) -> tuple[Any, Path]:
    """A cluster stand-in holding the headroom-scheduler configuration devcluster writes."""
    document = controlplane.scheduler_configuration(
        tmp_path / "kubeconfig",
        scheduler_name="headroom-scheduler",
        lease=("headroom-system", "headroom-scheduler"),
        extender=extender_configuration(8888, []),
    )
    path = tmp_path / "headroom-scheduler.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return SimpleNamespace(state=SimpleNamespace(config=tmp_path)), path


def test_the_floor_is_not_held_to_the_local_clusters_client_limits(
    bench: ModuleType, tmp_path: Path
) -> None:
    cluster, path = headroom_scheduler(tmp_path)
    assert yaml.safe_load(path.read_text())["clientConnection"]["qps"] == controlplane.CLIENT_QPS

    bench.configure(cluster, "headroom-scheduler")

    document = yaml.safe_load(path.read_text())
    assert document["clientConnection"]["qps"] == bench.UNTHROTTLED["qps"] > controlplane.CLIENT_QPS
    assert document["clientConnection"]["burst"] == bench.UNTHROTTLED["burst"]
    assert document["clientConnection"]["kubeconfig"] == str(tmp_path / "kubeconfig")
    extender = document["extenders"][0]
    assert (extender["prioritizeVerb"], extender["bindVerb"]) == ("prioritize", "bind")
    # As shipped: kube-scheduler's adaptive share of nodes unless the run asks for one.
    assert "percentageOfNodesToScore" not in document


def test_nodes_to_score_sets_only_that_schedulers_percentage(
    bench: ModuleType, tmp_path: Path
) -> None:
    cluster, path = headroom_scheduler(tmp_path)

    bench.configure(cluster, "headroom-scheduler", nodes_to_score=10)

    document = yaml.safe_load(path.read_text())
    assert document["percentageOfNodesToScore"] == 10
    assert document["extenders"][0]["bindVerb"] == "bind"


def test_without_leaves_only_the_named_verbs_out(bench: ModuleType, tmp_path: Path) -> None:
    cluster, path = headroom_scheduler(tmp_path)

    bench.configure(cluster, "headroom-scheduler", ("prioritize", "bind"))

    extender = yaml.safe_load(path.read_text())["extenders"][0]
    assert "prioritizeVerb" not in extender
    assert "bindVerb" not in extender
    assert (extender["filterVerb"], extender["preemptVerb"]) == ("filter", "preempt")
    assert extender["nodeCacheCapable"] is True


def test_the_median_round_is_reported_with_its_own_figures(bench: ModuleType) -> None:
    rounds = [
        {"pods_per_s": 300.0, "seconds": 3.3},
        {"pods_per_s": 250.0, "seconds": 4.0},
        {"pods_per_s": 410.0, "seconds": 2.4},
    ]
    assert bench._median_round(rounds) == {"pods_per_s": 300.0, "seconds": 3.3}
    # An even count reports the slower middle round, never a flattering average.
    assert bench._median_round(rounds[:2])["pods_per_s"] == 250.0


def test_cpu_is_counted_per_component_over_its_whole_process_group(bench: ModuleType) -> None:
    # A component whose work is done by a child it started, as a shell wrapper's is.
    work = "sum(i * i for i in range(10_000_000))"
    wrapper = (
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {work!r}]); "
        "print('done', flush=True)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", f"{wrapper}; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as leader:
        try:
            assert leader.stdout is not None
            assert leader.stdout.readline().strip() == "done"
            cluster = SimpleNamespace(
                components={
                    "busy": SimpleNamespace(pid=leader.pid),
                    "stopped": SimpleNamespace(pid=None),
                }
            )
            # The child has exited, its CPU reaped into the leader's: still counted.
            used = bench.cpu_seconds(cluster)
            assert set(used) == {"busy"}
            assert used["busy"] > 0.3, used  # the child's work, not the leader's start
        finally:
            leader.kill()


def bound_pod(name: str, node: str, memory: str, scheduled: str = "2026-11-27T07:00:00Z") -> Any:
    """A pod as ``kubectl get pods`` lists it once the webhook declared ``memory`` and it bound."""
    return {
        "metadata": {"name": name, "namespace": "bench-headroom"},
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"limits": {"headroom.dev/gpu-memory": memory}}}],
        },
        "status": {"conditions": [{"type": "PodScheduled", "lastTransitionTime": scheduled}]},
    }


def test_overcommit_is_counted_per_gpu_not_per_node(bench: ModuleType) -> None:
    margin = bench.DEFAULT_MARGIN_BYTES
    # A 1-GPU node holding five 8Gi pods: 40 GiB declared on a GPU that has 40 GiB less
    # the margin, and five pods in four slots.
    one = [bound_pod(f"p-{i}", "n", "8Gi") for i in range(5)]
    assert bench.overcommitted(one, 1, 4, margin) == (1, 1)
    # An 8-GPU node holding 33: dealt out one by one, one GPU gets five.
    eight = [bound_pod(f"p-{i:02d}", "n", "8Gi") for i in range(33)]
    assert bench.overcommitted(eight, 8, 4, margin) == (1, 1)
    assert bench.overcommitted(eight[:32], 8, 4, margin) == (0, 0)
    # 41 GiB on a 2-GPU node is far below the node's 79 GiB, but the device plugin gives
    # the third pod the first GPU again (fewest pods, lowest index): 40 GiB there.
    uneven = [
        bound_pod("a", "n", "20Gi", "2026-11-27T07:00:01Z"),
        bound_pod("b", "n", "1Gi", "2026-11-27T07:00:02Z"),
        bound_pod("c", "n", "20Gi", "2026-11-27T07:00:03Z"),
    ]
    assert bench.overcommitted(uneven, 2, 4, margin) == (1, 0)


def test_fit_bound_is_the_perfect_packers(bench: ModuleType) -> None:
    margin = bench.DEFAULT_MARGIN_BYTES
    gib = 2**30
    # 40 GiB less 512 MiB holds four 8Gi pods: 32 per 8-GPU node, 4 per 1-GPU node.
    assert bench.fit_bound(100, 8, 4, 8 * gib, margin) == 3200
    assert bench.fit_bound(300, 1, 4, 8 * gib, margin) == 1200
    assert bench.fit_bound(1, 8, 8, 8 * gib, margin) == 32  # memory bounds, not slots
    assert bench.fit_bound(1, 8, 4, 10 * gib, margin) == 24
    assert bench.fit_bound(1, 1, 2, 8 * gib, margin) == 2  # slots bound


def test_the_json_says_whether_the_overcommit_check_can_fire(bench: ModuleType) -> None:
    """kube-scheduler itself caps a node at its slots and at its advertised
    headroom.dev/gpu-memory. Where those caps, dealt out per GPU, already keep every GPU
    within its memory, ``overcommitted_gpus`` is 0 whatever the extender does: the JSON
    says so rather than let a 0 pass for evidence."""
    margin = bench.DEFAULT_MARGIN_BYTES
    gib = 2**30

    def worst(gpus: int, replicas: int, memory: str) -> int:
        # The most GPUs over their memory among the pod counts kube-scheduler admits.
        declared = bench.parse_bytes(memory)
        room = gpus * (bench.A100_MIB * bench.MIB - margin)
        admitted = min(gpus * replicas, room // declared)
        pods = [bound_pod(f"p-{i:03d}", "n", memory) for i in range(admitted)]
        over: int = bench.overcommitted(pods, gpus, replicas, margin)[0]
        return over

    for gpus, replicas, memory in [(1, 4, "8Gi"), (8, 4, "8Gi"), (1, 8, "8Gi"), (8, 8, "8Gi"),
                                   (8, 4, "10Gi"), (8, 16, "6Gi"), (2, 3, "13Gi")]:  # fmt: skip
        possible = bench.overcommit_possible(gpus, replicas, bench.parse_bytes(memory), margin)
        assert possible == (worst(gpus, replicas, memory) > 0), (gpus, replicas, memory)
    # The shapes the README reports (replicas 4, 8Gi): slots bound every GPU first.
    assert not bench.overcommit_possible(1, 4, 8 * gib, margin)
    assert not bench.overcommit_possible(8, 4, 8 * gib, margin)
    # Only on a multi-GPU node whose memory binds before its slots does the extender's
    # per-GPU accounting alone stand between the pods and an over-committed GPU.
    assert bench.overcommit_possible(8, 8, 8 * gib, margin)


def test_every_flag_is_documented(bench: ModuleType) -> None:
    parser = bench.arguments()
    for action in parser._actions:
        assert action.help, action.option_strings


def test_a_pod_charged_with_nothing_declared_still_counts_as_charged(bench: ModuleType) -> None:
    """The floor's pods declare nothing and are charged their whole GPU: the wait between
    rounds must not take them for gone because the declared bytes are 0."""
    gpu = {"declared": 0, "accounted": 40 * 2**30, "pods": ["bench-stock/p-00001"]}
    idle = {"declared": 0, "accounted": 0, "pods": []}
    state: dict[str, Any] = {"assumed": {}, "nodes": {"a": {"gpus": [gpu]}, "b": {"gpus": [idle]}}}
    assert bench.charged(state) > 0

    gpu.update(accounted=0, pods=[])
    assert bench.charged(state) == 0
    state["assumed"] = {"bench-headroom/p-00002": ["a"]}
    assert bench.charged(state) == 1
