"""Rule 5: declared GPU memory, its limits, and the annotations recorded."""

import pytest

from tests.headroom.pods import gpu_pod, load_pod, make_policy, patched, run


def annotations_after(pod: dict[str, object], decision: object) -> dict[str, str]:
    result = patched(pod, decision)  # type: ignore[arg-type]
    recorded: dict[str, str] = result["metadata"]["annotations"]
    return recorded


def test_rule5_the_policy_default_applies_when_the_pod_says_nothing() -> None:
    pod = load_pod("tensorflow-deployment")
    decision = run(pod)
    assert annotations_after(pod, decision) == {
        "headroom.dev/policy": "gpu-shared",
        "headroom.dev/mode": "shared",
        "headroom.dev/placement": "binpack",
        "headroom.dev/declared-memory": "4Gi",
    }
    assert decision.annotations == annotations_after(pod, decision)


def test_rule5_the_pod_annotation_declares_memory_per_gpu_container() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "10Gi"})
    assert run(pod).annotations["headroom.dev/declared-memory"] == "10Gi"


def test_rule5_per_container_override_and_the_sum_over_containers() -> None:
    pod = load_pod("multi-container")  # trainer 10Gi (override), server 6Gi (pod-wide)
    assert run(pod).annotations["headroom.dev/declared-memory"] == "16Gi"


def test_rule5_init_containers_count_like_kubernetes_effective_requests() -> None:
    # warmup (12Gi) runs alone before the app; metrics (1Gi sidecar) runs beside app (8Gi).
    pod = load_pod("init-containers")
    assert run(pod).annotations["headroom.dev/declared-memory"] == "12Gi"
    pod["metadata"]["annotations"]["headroom.dev/gpu-memory.warmup"] = "2Gi"
    assert run(pod).annotations["headroom.dev/declared-memory"] == "9Gi"


def test_rule5_a_sidecar_started_first_runs_beside_the_init_container_after_it() -> None:
    # metrics (1Gi sidecar) starts, then warmup (12Gi) runs beside it, then the app (8Gi).
    pod = load_pod("sidecar-first")
    assert run(pod).annotations["headroom.dev/declared-memory"] == "13Gi"
    pod["metadata"]["annotations"]["headroom.dev/gpu-memory.warmup"] = "2Gi"
    assert run(pod).annotations["headroom.dev/declared-memory"] == "9Gi"


def test_rule5_whole_gpu_containers_declare_nothing() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"})
    assert run(pod).annotations["headroom.dev/declared-memory"] == "4Gi"


def test_rule5_above_max_memory_is_denied_naming_both() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "24Gi"})
    decision = run(pod)
    assert (decision.allowed, decision.outcome, decision.patch) == (False, "denied", [])
    assert decision.message == (
        'container "c0" declares 24Gi of GPU memory, above maxMemory 20Gi of policy gpu-shared'
    )


def test_rule5_below_min_memory_is_denied_naming_both() -> None:
    # A declaration of a few bytes places the pod on an all but full GPU, and only the
    # guard stands between its real use and the neighbours (a review's observation).
    policy = make_policy("floored", defaultMemory="4Gi", minMemory="1Gi")
    tiny = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "1"})
    decision = run(tiny, policy)
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert decision.message == (
        'container "c0" declares 1 of GPU memory, below minMemory 1Gi of policy floored'
    )
    assert run(gpu_pod({"nvidia.com/gpu": "1"}), policy).allowed  # the default is above it


@pytest.mark.parametrize("resource", ["nvidia.com/gpu.shared", "nvidia.com/gpu"])
def test_rule5_a_zero_gpu_count_beside_declared_memory_is_denied_naming_the_field(
    resource: str,
) -> None:
    # A count of 0 asks for no GPU, so the container is placed nowhere; its memory
    # resource would still be charged to the pod, past maxMemory and with no slot.
    pad = {resource: "0", "headroom.dev/gpu-memory": "60Gi"}
    for pod in (gpu_pod({"nvidia.com/gpu": "1"}, pad), gpu_pod({"cpu": "1"}, pad)):
        decision = run(pod)
        assert (decision.allowed, decision.outcome, decision.patch) == (False, "denied", [])
        assert decision.message == (
            f'container "c1" asks for {resource}: 0 beside headroom.dev/gpu-memory '
            f"(spec.containers[1].resources.limits[{resource}]): a count of 0 is no GPU, "
            "so no slot backs the memory; ask for 1 or drop headroom.dev/gpu-memory"
        )


def test_rule5_max_memory_holds_for_every_container_that_declares_memory() -> None:
    # c1 asks for no GPU (a ValidatingAdmissionPolicy refuses that too); its memory
    # is charged to the pod all the same, so the policy's maximum applies to it.
    pod = gpu_pod({"nvidia.com/gpu": "1"}, {"headroom.dev/gpu-memory": "60Gi"})
    decision = run(pod)
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert decision.message == (
        'container "c1" declares 60Gi of GPU memory, above maxMemory 20Gi of policy gpu-shared'
    )


def test_rule5_a_zero_gpu_count_alone_is_still_no_gpu_pod() -> None:
    assert run(gpu_pod({"nvidia.com/gpu.shared": "0"})).outcome == "skipped"


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("headroom.dev/gpu-memory", "10Gx", "is not a quantity"),
        ("headroom.dev/gpu-memory", "", "is not a quantity"),
        ("headroom.dev/gpu-memory", "-1Gi", "must be above 0"),
        ("headroom.dev/gpu-memory", "0", "must be above 0"),
        ("headroom.dev/gpu-memory", "99Ei", "is out of range"),
        ("headroom.dev/gpu-memory.c0", "lots", "is not a quantity"),
    ],
)
def test_rule5_a_malformed_annotation_is_denied_naming_it_and_its_value(
    key: str, value: str, problem: str
) -> None:
    decision = run(gpu_pod({"nvidia.com/gpu": "1"}, annotations={key: value}))
    assert not decision.allowed
    assert decision.message.startswith(f'annotation {key}="{value}" {problem}')


def test_rule5_the_brief_example_message() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "10Gx"})
    assert (
        run(pod).message
        == 'annotation headroom.dev/gpu-memory="10Gx" is not a quantity (e.g. 10Gi)'
    )


def test_rule5_an_unused_malformed_annotation_is_not_ignored() -> None:
    # Only c0 has a GPU, but a typo on any memory annotation is still an error.
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory.c9": "1Gz"})
    assert not run(pod).allowed


def test_rule5_invalid_memory_warn_passes_the_pod_unchanged() -> None:
    policy = make_policy("lenient", defaultMemory="4Gi", invalidMemory="warn")
    decision = run(
        gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "10Gx"}), policy
    )
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "unchanged", [])
    assert decision.warnings[0].startswith('headroom: annotation headroom.dev/gpu-memory="10Gx"')


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "1"},  # below minMemory
        {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "64Gi"},  # above maxMemory
        {"nvidia.com/gpu.shared": "1"},  # no declaration at all
    ],
)
def test_rule5_invalid_memory_warn_leaves_no_declaration_unchecked(limits: dict[str, str]) -> None:
    # A review's case: a pod asking for a shared slot itself, with one malformed
    # annotation, passed unchanged, so minMemory and maxMemory were never applied.
    policy = make_policy(
        "lenient", defaultMemory="4Gi", minMemory="1Gi", maxMemory="20Gi", invalidMemory="warn"
    )
    junk = {"headroom.dev/gpu-memory.nosuchcontainer": "junk"}
    decision = run(gpu_pod(limits, annotations=junk), policy)
    assert (decision.allowed, decision.outcome, decision.patch) == (False, "denied", [])
    assert decision.message.startswith(
        'annotation headroom.dev/gpu-memory.nosuchcontainer="junk" is not a quantity'
    ), decision.message
    assert "invalidMemory: warn passes unchanged only pods asking for whole GPUs" in (
        decision.message
    )


def test_rule5_no_default_and_no_annotation_is_denied_saying_how_to_fix_it() -> None:
    policy = make_policy("must-declare")
    decision = run(gpu_pod({"nvidia.com/gpu": "1"}), policy)
    assert not decision.allowed
    assert "set annotation headroom.dev/gpu-memory" in decision.message
    assert "no defaultMemory" in decision.message


def test_rule5_an_override_for_a_missing_container_is_warned() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory.trainr": "8Gi"})
    decision = run(pod)
    assert decision.allowed
    assert (
        "headroom: annotation headroom.dev/gpu-memory.trainr names no container"
        in decision.warnings
    )


def test_rule5_a_non_string_annotation_is_denied_naming_it() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": 10})
    decision = run(pod)
    assert not decision.allowed
    assert decision.message == (
        "metadata.annotations[headroom.dev/gpu-memory]: expected a string, got number"
    )


def test_rule5_placement_follows_the_policy() -> None:
    policy = make_policy("spread", defaultMemory="1Gi", placement="spread")
    assert (
        run(gpu_pod({"nvidia.com/gpu": "1"}), policy).annotations["headroom.dev/placement"]
        == "spread"
    )


def test_rule5_memory_within_max_on_a_pod_asking_for_no_gpu_changes_nothing() -> None:
    # The admission policy refuses memory that no slot backs; the webhook adds nothing to it.
    decision = run(gpu_pod({"headroom.dev/gpu-memory": "8Gi"}))
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "unchanged", [])


def test_rule5_a_declaration_too_long_to_read_is_named_as_such() -> None:
    # The apiserver stores a 78-digit headroom.dev/gpu-memory exactly; the denial
    # says it is too long to read, not that it is malformed (a tenant would look for
    # a typo in a well-formed number).
    pod = gpu_pod({"nvidia.com/gpu": "1", "headroom.dev/gpu-memory": str(2**256 + 1)})
    decision = run(pod)
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert "spec.containers[0].resources.limits[headroom.dev/gpu-memory]" in decision.message
    assert "is too long to read (78 characters, at most 64)" in decision.message
