"""Rule 1 (what is mutated at all), rule 9 (dry run) and rule 11 (warnings)."""

import pytest

from headroom.mutation import decide
from tests.headroom.pods import SHARED, gpu_pod, load_pod, make_policy, patched, run

SEEDS = [
    "cuda-vectoradd",
    "tensorflow-deployment",
    "dcgmproftester-deployment",
    "dcgmproftester-2gpu-deployment",
    "mig-3g20gb-pod",
    "mps-pod",
    "multi-container",
    "init-containers",
    "sidecar-first",
]


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_rule1_only_create_is_mutated(operation: str) -> None:
    decision = run(load_pod("tensorflow-deployment"), operation=operation)
    assert decision.allowed
    assert decision.outcome == "skipped"
    assert decision.patch == []


def test_rule1_a_pod_without_a_gpu_passes_unchanged() -> None:
    pod = gpu_pod({"cpu": "1", "memory": "1Gi"})
    decision = run(pod)
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "skipped", [])


def test_rule1_a_zero_gpu_request_is_not_a_gpu_pod() -> None:
    assert run(gpu_pod({"nvidia.com/gpu": "0"})).outcome == "skipped"


def test_rule1_skip_label_opts_a_pod_out_only_where_the_policy_allows_it() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, labels={"headroom.dev/skip": "true"})
    allowing = make_policy("gpu-shared", defaultMemory="4Gi", allowSkip=True)
    decision = run(pod, allowing)
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "skipped", [])
    assert run(gpu_pod({"nvidia.com/gpu": "1"}, labels={"headroom.dev/skip": "no"})).patch


def test_rule1_skip_label_is_ignored_with_a_warning_by_default() -> None:
    # Issue 7 §2: the label alone used to take a GPU pod out of the accounting.
    pod = gpu_pod({"nvidia.com/gpu": "1"}, labels={"headroom.dev/skip": "true"})
    decision = run(pod)
    assert (decision.allowed, decision.outcome) == (True, "mutated")
    limits = patched(pod, decision)["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu.shared"] == "1"
    assert "nvidia.com/gpu" not in limits
    assert any(
        "headroom.dev/skip=true ignored" in w and "allowSkip" in w for w in decision.warnings
    )


def test_rule1_namespace_without_policy_label_passes_unchanged() -> None:
    decision = run(load_pod("mps-pod"), labels={"team": "ml"})
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "skipped", [])
    assert decision.warnings == []


def test_rule1_label_naming_a_missing_policy_warns_and_passes() -> None:
    decision = run(load_pod("mps-pod"), labels={"headroom.dev/policy": "gone"})
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "no-policy", [])
    assert decision.policy == "gone"
    assert len(decision.warnings) == 1
    assert "gone" in decision.warnings[0]
    assert "does not exist" in decision.warnings[0]


def test_rule1_an_empty_policy_label_warns_as_a_missing_policy() -> None:
    # The webhook is called for every namespace with the label (Exists), and the
    # unlabelled-namespaces admission policy binds only where it does not exist: an
    # empty value, an admin's slip, passed shared pods with no word at all.
    decision = run(load_pod("mps-pod"), labels={"headroom.dev/policy": ""})
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "no-policy", [])
    assert len(decision.warnings) == 1
    assert "empty headroom.dev/policy label" in decision.warnings[0]


def test_rule1_passthrough_policy_changes_nothing() -> None:
    decision = run(load_pod("tensorflow-deployment"), make_policy("hands-off", mode="passthrough"))
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "unchanged", [])


def test_the_namespace_comes_from_the_argument_not_the_object() -> None:
    pod = load_pod("mps-pod")  # metadata.namespace is nvidia-gpu-operator
    decision = decide(
        pod,
        namespace="elsewhere",
        namespace_labels={"headroom.dev/policy": "missing"},
        policies={},
    )
    assert "elsewhere" in decision.warnings[0]


def test_generate_name_pods_are_mutated() -> None:
    pod = load_pod("mps-pod")
    assert "name" not in pod["metadata"]
    decision = run(pod)
    assert decision.outcome == "mutated"
    assert patched(pod, decision)["metadata"]["generateName"] == "dcgmproftester12-"


def test_rule9_dry_run_warns_what_it_would_do_and_patches_nothing() -> None:
    policy = make_policy("trial", defaultMemory="4Gi", dryRun=True)
    decision = run(load_pod("tensorflow-deployment"), policy)
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "dry-run", [])
    assert any("nvidia.com/gpu.shared" in w for w in decision.warnings)
    assert all(w.startswith("headroom dry-run: would apply: ") for w in decision.warnings)
    assert decision.annotations["headroom.dev/mode"] == "shared"


def test_rule9_dry_run_reports_a_denial_instead_of_denying() -> None:
    policy = make_policy("trial", defaultMemory="4Gi", maxMemory="8Gi", dryRun=True)
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "12Gi"})
    decision = run(pod, policy)
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "dry-run", [])
    assert "would deny" in decision.warnings[0]
    assert "maxMemory 8Gi" in decision.warnings[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_rule11_every_mutation_says_what_and_why_in_short_ascii(seed: str) -> None:
    decision = run(load_pod(seed))
    assert decision.outcome == "mutated"
    assert decision.warnings
    assert decision.warnings[0].startswith("headroom: GPUSharingPolicy gpu-shared: mode ")
    for warning in decision.warnings:
        assert len(warning) < 120
        assert warning.isascii()
        assert warning.isprintable()


def test_rule11_hostile_names_are_cut_and_made_ascii() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["containers"][0]["name"] = "\u00fcber\n" + "x" * 300
    decision = run(pod)
    assert decision.outcome == "mutated"
    for warning in decision.warnings:
        assert len(warning) < 120
        assert warning.isascii()
        assert warning.isprintable()


def test_rule11_an_unchanged_pod_gets_no_change_warnings() -> None:
    pod = load_pod("tensorflow-deployment")
    again = run(patched(pod, run(pod)))
    assert (again.outcome, again.patch, again.warnings) == ("unchanged", [], [])
    assert again.annotations["headroom.dev/policy"] == SHARED.name


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"]
)
@pytest.mark.parametrize("policy", [SHARED, make_policy("hands-off", mode="passthrough")])
def test_a_count_kube_scheduler_reads_cut_to_64_bits_is_denied(
    resource: str, policy: object
) -> None:
    # 2^64 + 1 passes the apiserver's "must be an integer" check, and kube-scheduler,
    # kubelet and the device plugin read it as 1; every count here is exact, and the
    # extender's spread bound looped over it for good.
    decision = run(gpu_pod({resource: str(2**64 + 1)}), policy)  # type: ignore[arg-type]
    assert not decision.allowed
    assert (
        f"spec.containers[0].resources.limits[{resource}]: 18446744073709551617 is above 1024"
        in decision.message
    )


def test_a_pod_asking_more_than_the_most_in_all_is_denied() -> None:
    # Two containers of 600 each pass the per-container rule; the extender counts the
    # pod's effective request, and would refuse it on every node for good.
    decision = run(gpu_pod({"nvidia.com/gpu": "600"}, {"nvidia.com/gpu": "600"}))
    assert not decision.allowed
    assert "spec: the pod asks for 1200 nvidia.com/gpu in all" in decision.message
