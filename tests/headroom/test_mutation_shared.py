"""Rules 2 and 3: shared mode, every container and init container, requests = limits."""

from typing import Any

from tests.headroom.pods import SHARED, container, gpu_pod, load_pod, make_policy, patched, run


def gpu_keys(section: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in section.items() if key.startswith("nvidia.com/")}


def test_rule3_the_tensorflow_seed_gets_a_shared_gpu() -> None:
    pod = load_pod("tensorflow-deployment")
    decision = run(pod)
    assert decision.outcome == "mutated"
    resources = container(patched(pod, decision))["resources"]
    # The declaration is a resource too, in limits and requests alike.
    assert resources["limits"] == {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "4Gi"}
    assert resources["requests"] == {"headroom.dev/gpu-memory": "4Gi"}
    assert any('"tf": headroom.dev/gpu-memory: 4Gi' in w for w in decision.warnings)
    assert any(
        '"tf": nvidia.com/gpu: 1 -> nvidia.com/gpu.shared: 1' in w for w in decision.warnings
    )


def test_rule3_the_patch_escapes_the_slash_in_resource_names() -> None:
    decision = run(load_pod("cuda-vectoradd"))
    paths = {op["path"] for op in decision.patch}
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared" in paths
    assert "/metadata/annotations" in paths
    assert {op["op"] for op in decision.patch} <= {"add", "remove", "replace"}


def test_rule3_more_than_one_gpu_stays_exclusive_with_a_warning() -> None:
    pod = load_pod("dcgmproftester-2gpu-deployment")
    decision = run(pod)
    assert decision.allowed
    result = patched(pod, decision)
    assert container(result)["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert result["metadata"]["annotations"]["headroom.dev/mode"] == "exclusive"
    assert "headroom.dev/declared-memory" not in result["metadata"]["annotations"]
    assert any("keeps 2 whole GPUs" in w for w in decision.warnings)
    # The shared nodes' selector would strand a whole-GPU pod: it is not added.
    assert "nodeSelector" not in result["spec"]
    assert "schedulerName" not in result["spec"]


def test_rule3_more_than_one_gpu_is_denied_when_the_policy_says_so() -> None:
    policy = make_policy("strict", defaultMemory="4Gi", multiGPU="deny")
    decision = run(load_pod("dcgmproftester-2gpu-deployment"), policy)
    assert not decision.allowed
    assert decision.outcome == "denied"
    assert decision.patch == []
    assert 'container "dcgmproftester11" asks for nvidia.com/gpu: 2' in decision.message


def test_rule3_an_explicit_shared_request_is_kept() -> None:
    pod = gpu_pod({"nvidia.com/gpu.shared": "1"})
    decision = run(pod)
    result = patched(pod, decision)
    assert container(result)["resources"]["limits"] == {
        "nvidia.com/gpu.shared": "1",
        "headroom.dev/gpu-memory": "4Gi",
    }
    assert result["metadata"]["annotations"]["headroom.dev/mode"] == "shared"


def test_rule2_requests_are_rewritten_with_limits_and_other_resources_kept() -> None:
    pod = load_pod("multi-container")
    result = patched(pod, run(pod))
    trainer, server, shipper = result["spec"]["containers"]
    assert trainer["resources"] == {
        "limits": {"cpu": "2", "nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "10Gi"},
        "requests": {"cpu": "1", "nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "10Gi"},
    }
    assert server["resources"]["requests"] == server["resources"]["limits"]
    assert gpu_keys(server["resources"]["limits"]) == {"nvidia.com/gpu.shared": "1"}
    assert shipper == load_pod("multi-container")["spec"]["containers"][2]


def test_rule2_init_containers_and_sidecars_are_rewritten_too() -> None:
    pod = load_pod("init-containers")
    result = patched(pod, run(pod))
    for kind, index in (("initContainers", 0), ("initContainers", 1), ("containers", 0)):
        limits = container(result, index, kind)["resources"]["limits"]
        assert limits["nvidia.com/gpu.shared"] == "1", (kind, index)
        assert limits["headroom.dev/gpu-memory"], (kind, index)


def test_rule2_no_stale_gpu_key_is_left_anywhere() -> None:
    for seed in ("multi-container", "init-containers", "dcgmproftester-deployment"):
        pod = load_pod(seed)
        result = patched(pod, run(pod))
        for kind in ("initContainers", "containers"):
            for body in result["spec"].get(kind, []):
                for section in body.get("resources", {}).values():
                    assert "nvidia.com/gpu" not in section, seed


def test_rule2_exclusive_mode_keeps_whole_gpus_and_adds_scheduling() -> None:
    policy = make_policy(
        "whole",
        mode="exclusive",
        tolerations=[{"key": "node-role.kubernetes.io/gpu", "operator": "Exists"}],
    )
    pod = load_pod("dcgmproftester-2gpu-deployment")
    decision = run(pod, policy)
    result = patched(pod, decision)
    assert container(result)["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert result["metadata"]["annotations"]["headroom.dev/mode"] == "exclusive"
    assert result["spec"]["schedulerName"] == "headroom-scheduler"
    assert {"key": "node-role.kubernetes.io/gpu", "operator": "Exists"} in result["spec"][
        "tolerations"
    ]


def test_a_request_without_a_limit_is_denied_naming_the_field() -> None:
    pod = gpu_pod({})
    pod["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
    decision = run(pod)
    assert not decision.allowed
    assert decision.message == (
        "spec.containers[0].resources.limits: nvidia.com/gpu is requested but has no limit"
    )


def test_unequal_requests_and_limits_are_denied() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "2"})
    pod["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
    decision = run(pod)
    assert not decision.allowed
    assert "requests and limits of nvidia.com/gpu differ" in decision.message


def test_two_gpu_resources_in_one_container_are_denied() -> None:
    decision = run(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "1"}))
    assert not decision.allowed
    assert "more than one GPU resource" in decision.message


def test_shared_policy_uses_the_seed_defaults() -> None:
    assert SHARED.spec.multi_gpu == "exclusive"
    assert SHARED.spec.node_selector_conflict == "warn"


def test_an_explicit_memory_resource_is_the_declaration_and_is_held_to_max() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1", "headroom.dev/gpu-memory": "6Gi"})
    result = patched(pod, run(pod))
    assert container(result)["resources"]["limits"] == {
        "nvidia.com/gpu.shared": "1",
        "headroom.dev/gpu-memory": "6Gi",
    }
    assert result["metadata"]["annotations"]["headroom.dev/declared-memory"] == "6Gi"
    too_much = gpu_pod({"nvidia.com/gpu": "1", "headroom.dev/gpu-memory": "64Gi"})
    decision = run(too_much, make_policy("capped", defaultMemory="4Gi", maxMemory="20Gi"))
    assert not decision.allowed
    assert "above maxMemory 20Gi" in decision.message


def test_a_malformed_memory_resource_is_denied_naming_the_field() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1", "headroom.dev/gpu-memory": "1.5"})
    decision = run(pod)
    assert not decision.allowed
    assert "spec.containers[0].resources.limits[headroom.dev/gpu-memory]" in decision.message
    pod = gpu_pod({"nvidia.com/gpu": "1", "headroom.dev/gpu-memory": "8Gi"})
    pod["spec"]["containers"][0]["resources"]["requests"] = {"headroom.dev/gpu-memory": "4Gi"}
    decision = run(pod)
    assert not decision.allowed
    assert "requests and limits of headroom.dev/gpu-memory differ" in decision.message
