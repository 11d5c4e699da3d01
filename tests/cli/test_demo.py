"""`headroom demo`'s pure parts: timelines from report JSON, the verdict, the table, the plot.

The reports are built as the agent writes them (camelCase wire JSON through
``parse_report``), so these tests also pin the demo to the report model.
"""

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

from agent.usage import parse_usage
from cli.main import build_parser, main
from devcluster import demo, scenario
from devcluster.demo import DemoError, describe_node, kwok_nodes, pick_node
from devcluster.demo_plot import write_plot
from devcluster.outcome import Expectation, render_table, stand_ins, starved, verdict
from devcluster.phase import Apis
from devcluster.timeline import GPUKey, GuardAction, PhaseTimeline, PodInfo, is_full
from headroom.names import (
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_SIMULATED_USAGE,
    GPU,
    GPU_SHARED,
    LABEL_MEMORY_MIB,
    LABEL_POLICY,
    LABEL_PRODUCT,
    LABEL_SHARING_STRATEGY,
)
from headroom.policy import parse_policy
from headroom.reports import parse_report

GIB = 2**30
TOTAL = 40 * GIB
EXPECT = Expectation(workloads=("inference", "notebook", "simulation"), leaker="notebook")


def report(node: str, t: float, pods: Mapping[str, tuple[int, int | None]]) -> dict[str, Any]:
    """A GPUNodeReport object: one 40 GiB GPU holding ``pods`` (uid -> used, starvedBytes)."""
    used = sum(u for u, _ in pods.values())
    pod_json: list[dict[str, Any]] = []
    for uid, (pod_used, refused) in pods.items():
        entry: dict[str, Any] = {
            "uid": uid,
            "namespace": "demo",
            "name": uid,
            "usedBytes": pod_used,
        }
        if refused is not None:
            entry["starvedBytes"] = refused
        pod_json.append(entry)
    gpu = {
        "index": 0,
        "uuid": f"GPU-{node}",
        "product": "NVIDIA-A100-PCIE-40GB-SHARED",
        "totalBytes": TOTAL,
        "usedBytes": used,
        "freeBytes": TOTAL - used,
        "pods": pod_json,
    }
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "GPUNodeReport",
        "metadata": {"name": node},
        "status": {
            "schemaVersion": 1,
            "nodeName": node,
            "backend": "simulated",
            "observedAt": f"2025-01-01T00:00:{int(t):02d}Z",
            "gpus": [gpu],
        },
    }


def pods(declared: dict[str, int] | None = None) -> dict[str, PodInfo]:
    declared = declared or {}
    return {
        w: PodInfo(uid=w, name=f"{w}-abc", workload=w, declared_bytes=declared.get(w))
        for w in ("simulation", "inference", "notebook")
    }


def before_phase(*, reported: bool) -> PhaseTimeline:
    """Stock time-slicing: the notebook leaks 4 GiB/s and starves the others at t=7."""
    phase = PhaseTimeline("before", "stock time-slicing")
    for t in range(12):
        notebook = min(2 * GIB + 4 * GIB * t, TOTAL - 10 * GIB)
        full = notebook + 10 * GIB >= TOTAL
        refused = (2 * GIB if full else 0) if reported else None
        sample = {
            "simulation": (8 * GIB, refused),
            "inference": (2 * GIB, refused),
            "notebook": (notebook, 0 if reported else None),
        }
        phase.observe(float(t), parse_report(report("a100-0", t, sample)), pods())
    return phase


def after_phase(*, evict: bool = True, leak_unchecked: bool = False) -> PhaseTimeline:
    """Headroom: the notebook declares 8 GiB, goes over at t=3, the guard evicts it at t=4."""
    phase = PhaseTimeline("after", "Headroom")
    info = pods({"simulation": 10 * GIB, "inference": 10 * GIB, "notebook": 8 * GIB})
    info["notebook-2"] = PodInfo("notebook-2", "notebook-def", "notebook", declared_bytes=8 * GIB)
    for t in range(12):
        replaced = t >= 5 and not leak_unchecked
        since = t - 5 if replaced else t  # the Deployment's replacement pod starts over
        notebook = min(2 * GIB + 2 * GIB * since, 20 * GIB)
        sample = {"simulation": (9 * GIB, 0), "inference": (10 * GIB, 0)}
        sample["notebook-2" if replaced else "notebook"] = (notebook, 0)
        phase.observe(float(t), parse_report(report("a100-1", t, sample)), info)
    if evict:
        phase.record_guard(GuardAction(4.0, "notebook", "notebook-abc", evicted=True))
    return phase


@pytest.mark.parametrize("reported", [True, False])
def test_before_starves_the_others_from_reports_or_a_full_gpu(reported: bool) -> None:
    phase = before_phase(reported=reported)
    assert starved(phase) == {"simulation": 7.0, "inference": 7.0}
    gpu = phase.gpus[GPUKey("a100-0", 0)]
    assert gpu.full_at == 7.0
    assert gpu.peak_bytes == TOTAL
    notebook = phase.pods[("notebook", GPUKey("a100-0", 0))]
    assert notebook.peak_bytes == 30 * GIB
    assert notebook.starved_at is None


def test_the_story_passes_the_verdict() -> None:
    assert verdict(before_phase(reported=True), after_phase(), EXPECT) == []


def test_verdict_fails_when_after_still_starves_a_pod() -> None:
    after = after_phase()
    key = GPUKey("a100-1", 0)
    starving = report("a100-1", 12, {"simulation": (9 * GIB, 1 * GIB), "notebook": (31 * GIB, 0)})
    after.observe(12.0, parse_report(starving), pods({"notebook": 8 * GIB}))
    problems = verdict(before_phase(reported=True), after, EXPECT)
    assert "after: simulation was OOM-starved at 12.0s despite Headroom" in problems
    assert f"after: {key} ran out of memory at 12.0s" in problems


def test_verdict_fails_when_before_starves_nobody_or_the_guard_never_acts() -> None:
    quiet = PhaseTimeline("before", "stock time-slicing")
    for t in range(3):
        sample = dict.fromkeys(("simulation", "inference", "notebook"), (2 * GIB, 0))
        quiet.observe(float(t), parse_report(report("a100-0", t, sample)), pods())
    problems = verdict(quiet, after_phase(evict=False), EXPECT)
    assert any(p.startswith("before: no pod was OOM-starved") for p in problems)
    assert "after: the guard never evicted notebook, the pod over its declaration" in problems


def test_verdict_names_a_workload_that_never_reached_a_gpu() -> None:
    after = after_phase()
    del after.pods[("inference", GPUKey("a100-1", 0))]
    after.unplaced["inference"] = "Pending: 0/5 nodes are available"
    problems = verdict(before_phase(reported=True), after, EXPECT)
    assert problems == ["after: inference never ran on a GPU (Pending: 0/5 nodes are available)"]


def test_pods_of_other_namespaces_count_only_in_the_gpu_total() -> None:
    phase = PhaseTimeline("after", "Headroom")
    sample = {"simulation": (4 * GIB, 0), "stranger": (6 * GIB, 0)}
    phase.observe(1.0, parse_report(report("a100-1", 1, sample)), pods())
    assert [w for w, _ in phase.pods] == ["simulation"]
    assert phase.gpus[GPUKey("a100-1", 0)].peak_bytes == 10 * GIB


def test_a_gpu_without_demo_pods_is_not_tracked() -> None:
    phase = PhaseTimeline("after", "Headroom")
    phase.observe(1.0, parse_report(report("t4", 1, {"stranger": (1 * GIB, 0)})), pods())
    assert phase.gpus == {}


def test_full_means_less_than_one_percent_free() -> None:
    assert is_full(TOTAL, TOTAL - 100 * 2**20)
    assert not is_full(TOTAL, TOTAL - 1 * GIB)


def test_table_shows_placement_declared_observed_and_who_starved() -> None:
    table = render_table([before_phase(reported=True), after_phase()])
    lines = table.splitlines()
    assert lines[0] == "BEFORE: stock time-slicing (11s observed)"
    row = next(line for line in lines if "a100-0/gpu0" in line and "simulation" in line)
    assert row.split()[:5] == ["a100-0/gpu0", "simulation", "1", "-", "8.0"]
    assert "OOM-starved from 7.0s" in row
    assert "  OOM-starved: inference at 7.0s, simulation at 7.0s" in lines
    assert any("a100-0/gpu0" in line and "FULL from 7.0s" in line for line in lines)
    after_at = lines.index("AFTER: Headroom (11s observed)")
    notebook = next(line for line in lines[after_at:] if "notebook" in line)
    assert "8.0 GiB" in notebook
    assert notebook.split()[2] == "2"  # the evicted pod and its replacement
    assert "14.0 GiB" in notebook  # the replacement leaks too: 2 GiB + 2 GiB/s for 6s
    assert "over declared from 4.0s, evicted by guard x1" in notebook
    assert lines[-1] == "  OOM-starved: none"


def test_table_lists_a_workload_that_was_never_placed() -> None:
    after = after_phase()
    after.unplaced["ghost"] = "Pending"
    assert "(none)" in render_table([after]).split("ghost")[0].splitlines()[-1]


def test_plot_is_a_png_with_both_phases(tmp_path: Path) -> None:
    path = write_plot(
        [before_phase(reported=True), after_phase()], tmp_path / "out" / "seed001.png", title="t"
    )
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 20_000  # two panels with lines and text, not an empty canvas


def test_plot_handles_a_phase_with_no_samples(tmp_path: Path) -> None:
    empty = PhaseTimeline("after", "Headroom")
    path = write_plot([before_phase(reported=False), empty], tmp_path / "p.png", title="t")
    assert path.stat().st_size > 0


def test_scenario_is_seed001_with_one_leaker_and_a_guarded_policy() -> None:
    story = scenario.load()
    assert story.workloads == ("inference", "notebook", "simulation")
    assert story.leaker == "notebook"
    assert story.guard == "evict"
    assert parse_policy(story.policy).spec.guard == "evict"
    assert [story.declared(w) for w in story.workloads] == ["10Gi", "6Gi", "10Gi"]


def test_scenario_times_scale_with_the_phase_length() -> None:
    def usage(story: scenario.Scenario, name: str) -> Any:
        deployment = next(d for d in story.deployments if d["metadata"]["name"] == name)
        text = deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION_SIMULATED_USAGE]
        return parse_usage(text)

    normal, short = scenario.load(), scenario.load(duration=12.5)
    assert usage(short, "inference").period_seconds == usage(normal, "inference").period_seconds / 2
    assert usage(short, "notebook").rate_per_minute == 2 * usage(normal, "notebook").rate_per_minute
    # The same curve: the short notebook holds at t what the normal one holds at 2t.
    assert usage(short, "notebook").demand(5) == usage(normal, "notebook").demand(10)


def test_before_is_stock_time_slicing_pinned_to_one_node() -> None:
    story = scenario.load()
    for deployment in scenario.before_deployments(story, "demo-before", node="a100-shared-0"):
        pod = deployment["spec"]["template"]
        assert deployment["metadata"]["namespace"] == "demo-before"
        assert ANNOTATION_GPU_MEMORY not in pod["metadata"]["annotations"]
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU_SHARED: "1"}
        assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "a100-shared-0"}
        assert pod["spec"]["tolerations"] == [scenario.GPU_TAINT_TOLERATION]
        assert "schedulerName" not in pod["spec"]
    # Deriving the before form leaves the scenario (the after form) untouched.
    after = scenario.after_deployments(story, "demo-after")
    assert [d["spec"]["template"]["spec"]["containers"][0]["resources"] for d in after] == [
        {"limits": {GPU: "1"}}
    ] * 3
    assert (
        scenario.namespace("demo-after", policy="headroom-demo")["metadata"]["labels"][LABEL_POLICY]
        == "headroom-demo"
    )
    assert LABEL_POLICY not in scenario.namespace("demo-before", policy=None)["metadata"]["labels"]


def test_a_scenario_without_a_policy_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n")
    with pytest.raises(scenario.ScenarioError, match="expected one GPUSharingPolicy"):
        scenario.load(path)


def node(name: str, *, strategy: str, memory_mib: str, shared: bool = True) -> dict[str, Any]:
    allocatable = {GPU_SHARED: "4"} if shared else {GPU: "1"}
    labels = {LABEL_SHARING_STRATEGY: strategy, LABEL_MEMORY_MIB: memory_mib}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def test_before_runs_on_the_time_sliced_node_with_the_most_memory() -> None:
    nodes = [
        node("t4-shared-0", strategy="time-slicing", memory_mib="15360"),
        node("a100-shared-1", strategy="time-slicing", memory_mib="40960"),
        node("a100-shared-0", strategy="time-slicing", memory_mib="40960"),
        node("a100-mig-0", strategy="none", memory_mib="40960", shared=False),
        node("h100-mps-0", strategy="mps", memory_mib="81920"),
    ]
    assert pick_node(nodes) == "a100-shared-0"


def test_no_time_sliced_node_is_a_clear_error() -> None:
    with pytest.raises(DemoError, match="time-slicing; the demo needs a time-sliced GPU node"):
        pick_node([node("a100-mig-0", strategy="none", memory_mib="40960", shared=False)])


def test_cli_defaults_and_bad_durations(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.duration, args.output, args.kubeconfig, args.keep) == (
        25.0,
        Path("demo-output/seed001.png"),
        None,
        False,
    )
    assert build_parser().parse_args(["demo", "--duration", "40s"]).duration == 40.0
    for bad in ("0", "fast", "601"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["demo", "--duration", bad])
        assert "--duration" in capsys.readouterr().err


def test_cli_cannot_run_without_a_cluster_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.kubeconfig"
    code = main(["demo", "--kubeconfig", str(missing), "--output", str(tmp_path / "p.png")])
    assert code == 2
    assert f"headroom demo: cannot run: cannot load Kubernetes credentials from {missing}" in (
        capsys.readouterr().err
    )


def test_table_names_the_backend_that_measured_each_gpu() -> None:
    # The local cluster's GPUs are simulated; the table must not pass them off as measured.
    lines = render_table([before_phase(reported=True)]).splitlines()
    gpu_line = next(line for line in lines if "total, peak" in line)
    assert gpu_line.startswith("  a100-0/gpu0 NVIDIA-A100-PCIE-40GB-SHARED (simulated backend): ")


def test_stand_ins_name_the_simulated_backend_and_the_kwok_nodes() -> None:
    phases = [before_phase(reported=True), after_phase()]
    assert stand_ins(phases, kwok_nodes={"a100-0", "t4-0"}) == [
        "GPU memory: the agents' simulated backend (driven by each pod's "
        f"{ANNOTATION_SIMULATED_USAGE} annotation), not NVML on a GPU",
        "nodes a100-0: KWOK nodes (no kubelet; the pods' containers never run)",
    ]
    nvml = PhaseTimeline("after", "Headroom")
    measured = report("a100-9", 1, {"simulation": (GIB, None)})
    measured["status"]["backend"] = "nvml"
    nvml.observe(1.0, parse_report(measured), pods())
    assert stand_ins([nvml], kwok_nodes=set()) == []


def test_kwok_nodes_are_those_kwok_manages() -> None:
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "a100-shared-0", "annotations": {"kwok.x-k8s.io/node": "fake"}}},
        {"metadata": {"name": "gpu-real-0", "annotations": {}}},
        {"metadata": {"name": "cpu-0"}},
    ]
    assert kwok_nodes(nodes) == {"a100-shared-0"}


def test_before_node_is_described_by_its_labels_not_assumed_an_a100() -> None:
    t4 = node("t4-shared-0", strategy="time-slicing", memory_mib="15360")
    t4["metadata"]["labels"][LABEL_PRODUCT] = "Tesla-T4-SHARED"
    assert describe_node(t4) == "a time-sliced Tesla-T4-SHARED (15360 MiB per GPU)"
    t4["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake"}
    assert describe_node(t4) == (
        "a KWOK node labelled as a time-sliced Tesla-T4-SHARED (15360 MiB per GPU)"
    )


def test_readme_sample_has_every_line_the_table_prints() -> None:
    # The README shows a real run; each phase block must have the lines
    # render_table prints today: the rule under the header, a line per GPU, and
    # the phase's OOM-starved summary.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]
    sample = section.split("```\n", 2)[1]
    blocks = [b for b in sample.split("\n\n") if b.startswith(("BEFORE:", "AFTER:"))]
    assert [b.split(":", 1)[0] for b in blocks] == ["BEFORE", "AFTER"]
    for block in blocks:
        lines = block.splitlines()
        assert lines[2].strip().startswith("---"), block
        assert any("backend): " in line and "total, peak" in line for line in lines), block
        assert any(line.startswith("  OOM-starved: ") for line in lines), block


def test_namespaces_left_by_an_earlier_run_are_gone_before_the_before_phase(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `--keep` leaves the AFTER namespace running (a killed run leaves either):
    # its pods must not share the GPUs, and the replicas, of the next BEFORE phase.
    calls: list[tuple[str, str]] = []
    a100 = node("a100-shared-0", strategy="time-slicing", memory_mib="40960")

    def run_phase(apis: Any, phase: PhaseTimeline, **kwargs: Any) -> PhaseTimeline:
        calls.append(("phase", kwargs["namespace"]["metadata"]["name"]))
        return phase

    monkeypatch.setattr(demo, "api_client", lambda path: None)
    monkeypatch.setattr(Apis, "of", classmethod(lambda cls, api: cls(*[MagicMock()] * 3)))
    monkeypatch.setattr(demo, "raw", lambda call, *a, **k: {"items": [a100]})
    monkeypatch.setattr(demo, "wait_for_report", lambda *args: None)
    monkeypatch.setattr(demo, "install_policy", lambda *args: None)
    monkeypatch.setattr(demo, "run_phase", run_phase)
    monkeypatch.setattr(demo, "delete_namespace", lambda apis, ns, p: calls.append(("delete", ns)))
    monkeypatch.setattr(
        demo, "wait_namespace_gone", lambda apis, ns, p: calls.append(("gone", ns)), raising=False
    )
    monkeypatch.setattr(demo, "write_plot", lambda phases, path, title: path)

    demo.run(demo.DemoOptions(kubeconfig=None, output=tmp_path / "p.png"), lambda m: None)

    first_phase = calls.index(("phase", "seed001-before"))
    assert {("gone", "seed001-before"), ("gone", "seed001-after")} <= set(calls[:first_phase])


SIGTERM_DURING_DEMO = """
import os, signal, sys, time
from pathlib import Path
from types import SimpleNamespace
from cli.main import main
from devcluster import cluster, demo

cluster.status = lambda *a, **k: SimpleNamespace(up=False)
cluster.up = lambda *a, **k: SimpleNamespace(kubeconfig=Path("/nonexistent"))
cluster.down = lambda *a, **k: print("cluster down", flush=True)

def run(options, progress):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)

demo.run = run
sys.exit(main(["demo"]))
"""


def test_sigterm_midway_stops_the_cluster_the_demo_started() -> None:
    # `timeout`, CI cancelling a job and make passing on its own SIGTERM all send
    # SIGTERM, not SIGINT; the cluster's processes run in sessions of their own.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_DURING_DEMO],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "cluster down" in done.stdout, done.stderr
    assert done.returncode == 128 + signal.SIGTERM
