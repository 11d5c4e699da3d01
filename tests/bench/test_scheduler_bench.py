"""The scheduler storm's own logic: what it changes in a scheduler's configuration, and
which round it reports. The storm itself is a benchmark (bench/scheduler_bench.py)."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from devcluster import controlplane
from devcluster.components import extender_configuration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scheduler_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scheduler_bench"] = module
    spec.loader.exec_module(module)
    return module


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
