"""Rules 6, 7 and 8: tolerations, nodeSelector, schedulerName and env hints."""

from typing import Any

from tests.headroom.pods import container, gpu_pod, load_pod, make_policy, patched, run

GPU_TAINT = {
    "key": "node-role.kubernetes.io/gpu",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
TIME_SLICING = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}


def scheduling_policy(**extra: Any) -> Any:
    spec: dict[str, Any] = {
        "defaultMemory": "4Gi",
        "tolerations": [GPU_TAINT],
        "nodeSelector": TIME_SLICING,
    }
    spec.update(extra)
    return make_policy("gpu-shared", **spec)


def test_rule6_tolerations_are_added_after_the_pods_own() -> None:
    pod = load_pod("dcgmproftester-deployment")
    result = patched(pod, run(pod, scheduling_policy()))
    assert result["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        GPU_TAINT,
    ]


def test_rule6_a_mig_pod_in_a_shared_namespace_gets_no_time_slicing_selector() -> None:
    # The selector picks time-sliced nodes, which offer no MIG slices: adding it
    # would leave the pod unschedulable.
    pod = gpu_pod({"nvidia.com/mig-3g.20gb": "1"})
    decision = run(pod, scheduling_policy())
    result = patched(pod, decision)
    assert decision.allowed
    assert "nodeSelector" not in result["spec"]
    assert result["spec"]["tolerations"] == [GPU_TAINT]
    assert result["spec"]["schedulerName"] == "headroom-scheduler"
    assert any("nodeSelector not added" in w and "mig" in w for w in decision.warnings)


def test_rule6_a_toleration_the_pod_already_has_is_not_duplicated() -> None:
    pod = load_pod("tensorflow-deployment")  # tolerates the GPU taint itself
    decision = run(pod, scheduling_policy())
    assert patched(pod, decision)["spec"]["tolerations"] == [GPU_TAINT]
    assert not any("toleration" in w for w in decision.warnings)


def test_rule6_an_equal_toleration_spelled_with_defaults_is_a_duplicate() -> None:
    policy = scheduling_policy(
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu"}]
    )
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["tolerations"] = [{"key": "dedicated", "value": "gpu"}]
    assert "tolerations" not in {op["path"].split("/")[2] for op in run(pod, policy).patch}


def test_rule6_node_selector_is_merged_with_the_pods() -> None:
    pod = load_pod("cuda-vectoradd")
    result = patched(pod, run(pod, scheduling_policy()))
    assert result["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "A100-PCIE-40GB-MIG-1g.5gb",
        **TIME_SLICING,
    }


def test_rule6_a_conflicting_user_value_is_kept_with_a_warning_by_default() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.sharing-strategy": "mps"}
    decision = run(pod, scheduling_policy())
    assert decision.allowed
    assert patched(pod, decision)["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.sharing-strategy": "mps"
    }
    assert (
        'headroom: kept nodeSelector nvidia.com/gpu.sharing-strategy="mps"; '
        "policy gpu-shared wants time-slicing"
    ) in decision.warnings


def test_rule6_a_conflict_is_denied_when_the_policy_says_so() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.sharing-strategy": "mps"}
    decision = run(pod, scheduling_policy(nodeSelectorConflict="deny"))
    assert not decision.allowed
    assert 'spec.nodeSelector nvidia.com/gpu.sharing-strategy="mps" conflicts' in decision.message


def test_rule7_default_scheduler_is_replaced_by_the_policys() -> None:
    for scheduler in (None, "", "default-scheduler"):
        pod = gpu_pod({"nvidia.com/gpu": "1"})
        if scheduler is not None:
            pod["spec"]["schedulerName"] = scheduler
        result = patched(pod, run(pod, scheduling_policy()))
        assert result["spec"]["schedulerName"] == "headroom-scheduler", scheduler


def test_rule7_a_foreign_scheduler_is_denied_by_default() -> None:
    # Issue 7 §2: a volcano pod used to be rewritten to a shared slot yet skip the fit.
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["schedulerName"] = "volcano"
    decision = run(pod, scheduling_policy())
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert "spec.schedulerName is volcano" in decision.message
    assert "foreignSchedulers: deny" in decision.message


def test_rule7_a_foreign_scheduler_is_left_alone_under_foreign_schedulers_ignore() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["schedulerName"] = "kai-scheduler"
    decision = run(pod, scheduling_policy(foreignSchedulers="ignore"))
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "unchanged", [])
    assert any("kai-scheduler" in w and "outside Headroom" in w for w in decision.warnings)


def test_rule7_the_policy_may_name_its_own_scheduler() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"})
    result = patched(pod, run(pod, scheduling_policy(schedulerName="gpu-scheduler")))
    assert result["spec"]["schedulerName"] == "gpu-scheduler"


def test_rule8_env_hints_are_off_unless_the_policy_asks() -> None:
    pod = load_pod("tensorflow-deployment")
    assert "env" not in container(patched(pod, run(pod, scheduling_policy())))


def test_rule8_tensorflow_gets_allow_growth() -> None:
    pod = load_pod("tensorflow-deployment")
    result = patched(pod, run(pod, scheduling_policy(envHints=True)))
    assert container(result)["env"] == [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"}]


def test_rule8_mps_pins_the_declared_memory() -> None:
    pod = load_pod("mps-pod")
    pod["metadata"]["annotations"] = {"headroom.dev/gpu-memory": "4608Mi"}
    result = patched(pod, run(pod, scheduling_policy(envHints=True, sharing="mps")))
    assert container(result)["env"] == [
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=4608M"},
    ]
    assert result["spec"]["hostIPC"] is True


def test_rule8_the_mps_pin_never_exceeds_the_declaration() -> None:
    # 1.5G is 1430.5 MiB: a pin of 1431M (MiB, as the device plugin's own
    # set_default_device_pinned_mem_limit reads it) would let the client allocate
    # half a MiB more than it is charged, and the guard evict it for using its pin.
    for declared, pin in (("1.5G", "0=1430M"), ("4608Mi", "0=4608M"), ("6Gi", "0=6G")):
        pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": declared})
        result = patched(pod, run(pod, scheduling_policy(envHints=True, sharing="mps")))
        hint = {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": pin}
        assert hint in container(result)["env"]


def test_rule8_an_env_the_user_set_is_never_overridden() -> None:
    pod = load_pod("multi-container")  # server sets TF_FORCE_GPU_ALLOW_GROWTH=false
    result = patched(pod, run(pod, scheduling_policy(envHints=True, sharing="mps")))
    trainer, server, shipper = result["spec"]["containers"]
    assert server["env"] == [
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=6G"},
    ]
    assert {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=10G"} in trainer["env"]
    assert "env" not in shipper


def test_rule8_a_pin_the_user_set_is_kept_and_said_so() -> None:
    # Kept (the user's env is never overridden), but it may allow more than the
    # declaration: the guard, not the pin, then holds the pod to it.
    for user in ({"value": "0=20G"}, {"valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}):
        pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "6Gi"})
        pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", **user}]
        decision = run(pod, scheduling_policy(envHints=True, sharing="mps"))
        env = container(patched(pod, decision))["env"]
        assert [e for e in env if e["name"] == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == [
            {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", **user}
        ]
        (note,) = [w for w in decision.warnings if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in w]
        assert 'container "c0"' in note
        assert "0=6G" in note  # the pin its declaration gives
        assert "kept" in note


def test_rule8_a_pin_the_user_set_to_headrooms_own_value_says_nothing() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": "6Gi"})
    pod["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=6G"}
    ]
    decision = run(pod, scheduling_policy(envHints=True, sharing="mps"))
    assert not [w for w in decision.warnings if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in w]


def test_rule8_no_hints_beside_envfrom_which_may_set_them() -> None:
    # env overrides envFrom in Kubernetes, so an added hint could override a
    # value the user set in a ConfigMap.
    pod = load_pod("tensorflow-deployment")
    container(pod)["envFrom"] = [{"configMapRef": {"name": "tf-settings"}}]
    decision = run(pod, scheduling_policy(envHints=True))
    assert "env" not in container(patched(pod, decision))
    assert any("env hints not added (it uses envFrom)" in w for w in decision.warnings)


def test_rule8_no_hints_for_whole_gpus() -> None:
    pod = load_pod("dcgmproftester-2gpu-deployment")
    assert "env" not in container(patched(pod, run(pod, scheduling_policy(envHints=True))))


def test_rule8_an_env_name_that_is_not_a_string_is_denied_naming_it() -> None:
    # Found by the garbage property test: an unhashable name raised TypeError.
    pod = load_pod("tensorflow-deployment")
    container(pod)["env"] = [{"name": ["TF_FORCE_GPU_ALLOW_GROWTH"], "value": "false"}]
    decision = run(pod, scheduling_policy(envHints=True))
    assert (decision.allowed, decision.outcome) == (False, "denied")
    assert decision.message == "spec.containers[0].env[0].name: expected a string, got array"


def _requiring(pod: dict[str, Any], *terms: list[dict[str, Any]]) -> dict[str, Any]:
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }
    return pod


def test_rule6_a_selector_the_pods_required_affinity_excludes_is_not_added() -> None:
    # Both required: a pod asking for mps nodes by affinity and given the time-slicing
    # selector would stay Pending on every node, with nothing said.
    key = "nvidia.com/gpu.sharing-strategy"
    pod = _requiring(
        gpu_pod({"nvidia.com/gpu": "1"}),
        [{"key": key, "operator": "In", "values": ["mps"]}],
        [{"key": key, "operator": "DoesNotExist"}],
    )
    decision = run(pod, scheduling_policy())
    assert decision.allowed
    assert "nodeSelector" not in patched(pod, decision)["spec"]
    assert (
        f"headroom: kept required node affinity on {key}; policy gpu-shared wants time-slicing"
    ) in decision.warnings
    denied = run(pod, scheduling_policy(nodeSelectorConflict="deny"))
    assert not denied.allowed
    assert "requiredDuringSchedulingIgnoredDuringExecution admits no node" in denied.message


def test_rule6_a_selector_some_required_term_admits_is_added() -> None:
    key = "nvidia.com/gpu.sharing-strategy"
    pod = _requiring(
        gpu_pod({"nvidia.com/gpu": "1"}),
        [{"key": key, "operator": "NotIn", "values": ["time-slicing"]}],
        [{"key": key, "operator": "In", "values": ["mps", "time-slicing"]}],
        [{"key": "zone", "operator": "Exists"}],
    )
    result = patched(pod, run(pod, scheduling_policy(nodeSelectorConflict="deny")))
    assert result["spec"]["nodeSelector"] == TIME_SLICING


def test_rule6_required_affinity_values_that_are_not_an_array_are_denied_naming_them() -> None:
    # decide() promises a denial naming the field for any shape, never an exception
    # (the webhook answers one with "internal error", code 500). _term_admits read
    # ``values`` as given: a number raised TypeError, a string was searched as text.
    key = "nvidia.com/gpu.sharing-strategy"
    for values, got in ((5, "number"), ("time-slicing", "string"), ({"a": "b"}, "object")):
        pod = _requiring(
            gpu_pod({"nvidia.com/gpu": "1"}), [{"key": key, "operator": "In", "values": values}]
        )
        decision = run(pod, scheduling_policy())
        assert (decision.allowed, decision.outcome) == (False, "denied"), values
        assert decision.message == (
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            f".nodeSelectorTerms[0].matchExpressions[0].values: expected an array, got {got}"
        )
