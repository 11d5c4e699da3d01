"""Rule 4: MIG mode sizes a slice by declared memory."""

from typing import Any

import pytest

from headroom.mig import MigOffer
from tests.headroom.pods import container, gpu_pod, load_pod, make_policy, patched, run

A100_40GB = ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]


def mig_policy(**extra: Any) -> Any:
    spec: dict[str, Any] = {
        "mode": "mig",
        "defaultMemory": "4Gi",
        "mig": {"allowedProfiles": A100_40GB},
    }
    spec.update(extra)
    return make_policy("gpu-mig", **spec)


def node(**capacity: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "labels": {}},
        "status": {
            "capacity": {f"nvidia.com/mig-{k.replace('_', '.')}": v for k, v in capacity.items()}
        },
    }


def declaring(memory: str) -> dict[str, Any]:
    return gpu_pod({"nvidia.com/gpu": "1"}, annotations={"headroom.dev/gpu-memory": memory})


@pytest.mark.parametrize(
    ("memory", "profile"),
    [
        ("4Gi", "1g.5gb"),
        ("4864Mi", "1g.5gb"),
        ("5Gi", "2g.10gb"),
        ("10Gi", "3g.20gb"),
        ("39Gi", "7g.40gb"),
    ],
)
def test_rule4_smallest_allowed_profile_that_holds_the_declared_memory(
    memory: str, profile: str
) -> None:
    pod = declaring(memory)
    decision = run(pod, mig_policy())
    result = patched(pod, decision)
    assert container(result)["resources"]["limits"] == {f"nvidia.com/mig-{profile}": "1"}
    assert result["metadata"]["annotations"]["headroom.dev/mig-profile"] == profile
    assert result["metadata"]["annotations"]["headroom.dev/mode"] == "mig"
    assert result["metadata"]["annotations"]["headroom.dev/declared-memory"] == memory


def test_rule4_nothing_fits_denies_naming_declared_memory_and_largest_profile() -> None:
    decision = run(declaring("48Gi"), mig_policy(maxMemory="80Gi"))
    assert not decision.allowed
    assert "declares 48Gi" in decision.message
    assert "largest: 7g.40gb, 40192Mi" in decision.message


def test_rule4_prefers_profiles_the_cluster_advertises() -> None:
    offer = MigOffer.from_nodes([node(**{"3g_20gb": "2", "7g_40gb": "1"})])
    pod = declaring("4Gi")
    decision = run(pod, mig_policy(), offer=offer)
    assert container(patched(pod, decision))["resources"]["limits"] == {
        "nvidia.com/mig-3g.20gb": "1"
    }
    assert any("no node offers 1g.5gb; using larger 3g.20gb" in w for w in decision.warnings)


def test_rule4_fallback_deny_refuses_when_the_best_fit_is_not_offered() -> None:
    offer = MigOffer.from_nodes([node(**{"3g_20gb": "2"})])
    decision = run(
        declaring("4Gi"),
        mig_policy(mig={"allowedProfiles": A100_40GB, "fallback": "deny"}),
        offer=offer,
    )
    assert not decision.allowed
    assert "no node offers nvidia.com/mig-1g.5gb" in decision.message


def test_rule4_advertised_memory_beats_the_table() -> None:
    # A node whose 1g.5gb slices report 5120 MiB: a 5Gi pod fits there.
    offer = MigOffer.from_nodes(
        [
            {
                "metadata": {"labels": {"nvidia.com/mig-1g.5gb.memory": "5120"}},
                "status": {"capacity": {"nvidia.com/mig-1g.5gb": "7"}},
            }
        ]
    )
    pod = declaring("5Gi")
    result = patched(pod, run(pod, mig_policy(), offer=offer))
    assert container(result)["resources"]["limits"] == {"nvidia.com/mig-1g.5gb": "1"}


def test_rule4_each_container_gets_its_own_slice_and_requests_follow() -> None:
    pod = load_pod("multi-container")  # trainer declares 10Gi, server 6Gi
    result = patched(pod, run(pod, mig_policy()))
    trainer, server, _ = result["spec"]["containers"]
    assert trainer["resources"]["limits"]["nvidia.com/mig-3g.20gb"] == "1"
    assert trainer["resources"]["requests"]["nvidia.com/mig-3g.20gb"] == "1"
    assert server["resources"]["limits"]["nvidia.com/mig-2g.10gb"] == "1"
    assert result["metadata"]["annotations"]["headroom.dev/mig-profile"] == "3g.20gb,2g.10gb"


def test_rule4_the_seed_mig_pod_keeps_its_allowed_profile() -> None:
    pod = load_pod("mig-3g20gb-pod")
    decision = run(pod, mig_policy())
    result = patched(pod, decision)
    assert container(result)["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": 1}
    assert result["metadata"]["annotations"]["headroom.dev/mig-profile"] == "3g.20gb"


def test_rule4_an_explicit_profile_outside_the_allow_list_is_denied() -> None:
    decision = run(load_pod("mig-3g20gb-pod"), mig_policy(mig={"allowedProfiles": ["1g.5gb"]}))
    assert not decision.allowed
    assert "asks for nvidia.com/mig-3g.20gb" in decision.message
    assert "allows only 1g.5gb" in decision.message


@pytest.mark.parametrize(
    ("name", "count"), [("vllm-tp2-deployment", 2), ("nim-mixtral-8gpu-deployment", 8)]
)
def test_rule4_multi_gpu_requests_stay_whole_gpus_never_n_slices(name: str, count: int) -> None:
    # A CUDA process sees one MIG device and slices have no peer-to-peer, so
    # nvidia.com/mig-<p>: N never runs tensor parallelism: follow multiGPU.
    pod = load_pod(name)
    decision = run(pod, mig_policy())
    assert decision.allowed
    limits = container(patched(pod, decision))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == str(count)
    assert not any(key.startswith("nvidia.com/mig-") for key in limits)
    assert any(f"keeps {count} whole GPUs" in w and "MIG" in w for w in decision.warnings)


def test_rule4_multi_gpu_requests_denied_under_multigpu_deny() -> None:
    decision = run(load_pod("vllm-tp2-deployment"), mig_policy(multiGPU="deny"))
    assert not decision.allowed
    assert "nvidia.com/gpu: 2" in decision.message
    assert "multiGPU: deny" in decision.message


def test_rule4_me_profiles_use_the_device_plugin_spelling() -> None:
    pod = declaring("9Gi")
    policy = mig_policy(mig={"allowedProfiles": ["1g.10gb+me"]})
    result = patched(pod, run(pod, policy))
    assert container(result)["resources"]["limits"] == {"nvidia.com/mig-1g.10gb.me": "1"}
    assert result["metadata"]["annotations"]["headroom.dev/mig-profile"] == "1g.10gb+me"


@pytest.mark.parametrize("policy", [mig_policy(), make_policy("gpu-shared", defaultMemory="4Gi")])
def test_rule4_a_time_sliced_mig_slice_is_refused(policy: Any) -> None:
    # A review's case: the device plugin time-slices a MIG slice as
    # nvidia.com/mig-1g.10gb.shared; read as a slice of its own, it was admitted with
    # no declaration, and pods sharing the slice went uncharged for its memory.
    sliced = {"nvidia.com/mig-1g.10gb.shared": "1"}
    warn = make_policy("lenient", defaultMemory="4Gi", invalidMemory="warn")
    for pod, under in (
        (gpu_pod(sliced), policy),
        # The refusal names the slice, not a malformed annotation beside it.
        (gpu_pod(sliced, annotations={"headroom.dev/gpu-memory": "10Gx"}), warn),
    ):
        decision = run(pod, under)
        assert (decision.allowed, decision.patch) == (False, [])
        assert decision.message.startswith(
            'container "c0" asks for nvidia.com/mig-1g.10gb.shared, a time-sliced MIG slice'
        ), decision.message
        assert decision.message.endswith("or for the slice itself, nvidia.com/mig-1g.10gb")


def test_rule4_never_places_a_pod_on_a_time_sliced_mig_slice_a_node_offers() -> None:
    # A review's case: a node time-slices its 1g.10gb slices (the device plugin
    # advertises nvidia.com/mig-1g.10gb.shared) and also offers 3g.40gb. The offer read
    # the .shared resource as a profile of its own, "1g.10gb+shared", the smallest
    # holding 8 GiB, and the webhook rewrote nvidia.com/gpu to the very time-sliced
    # slice it refuses when a pod asks it directly (pods sharing it share its memory).
    offer = MigOffer.from_nodes([node(**{"1g_10gb_shared": "28", "3g_40gb": "2"})])
    pod = declaring("8Gi")
    decision = run(pod, mig_policy(mig={}), offer=offer)
    assert decision.allowed, decision.message
    limits = container(patched(pod, decision))["resources"]["limits"]
    assert limits == {"nvidia.com/mig-3g.40gb": "1"}, limits
    assert all(not name.endswith("+shared") for name in offer.profiles), offer.profiles


@pytest.mark.parametrize(
    ("policy", "limits", "given"),
    [
        (mig_policy(), {"nvidia.com/gpu": "1"}, "a MIG slice (nvidia.com/mig-3g.20gb)"),
        (mig_policy(), {"nvidia.com/gpu": "2"}, "2 whole GPUs (nvidia.com/gpu)"),
        (make_policy("p", defaultMemory="4Gi"), {"nvidia.com/gpu": "2"}, "2 whole GPUs"),
        (make_policy("p", mode="exclusive"), {"nvidia.com/gpu": "1"}, "1 whole GPU ("),
        (make_policy("p", defaultMemory="4Gi"), {"nvidia.com/mig-1g.5gb": "1"}, "a MIG slice"),
    ],
)
def test_declared_memory_resource_on_a_container_not_given_a_shared_gpu_is_denied(
    policy: Any, limits: dict[str, str], given: str
) -> None:
    # headroom.dev/gpu-memory goes with nvidia.com/gpu.shared only: beside a MIG slice
    # or whole GPUs it takes node capacity no slot backs, and the admission policy
    # headroom-shared-gpu-pods refuses the rewritten pod telling the tenant to "ask
    # for nvidia.com/gpu: 1 in a namespace labelled headroom.dev/policy" -- as it did.
    resources = {**limits, "headroom.dev/gpu-memory": "10Gi"}
    pod = gpu_pod(resources)
    pod["spec"]["containers"][0]["resources"]["requests"] = dict(resources)
    decision = run(pod, policy)
    assert not decision.allowed
    assert decision.patch == []
    assert "spec.containers[0].resources.limits[headroom.dev/gpu-memory]" in decision.message
    assert given in decision.message


@pytest.mark.parametrize(
    "policy", [mig_policy(maxMemory="80Gi"), make_policy("s", defaultMemory="4Gi")]
)
def test_an_explicit_slice_smaller_than_the_declaration_is_denied(policy: Any) -> None:
    # A review's case: a pod asking nvidia.com/mig-1g.5gb (4864Mi) and declaring 20Gi
    # was admitted with "20Gi GPU memory declared" on a slice that cannot hold it,
    # where the same declaration on nvidia.com/gpu is sized to a slice that does.
    pod = gpu_pod({"nvidia.com/mig-1g.5gb": "1"}, annotations={"headroom.dev/gpu-memory": "20Gi"})
    decision = run(pod, policy)
    assert (decision.allowed, decision.patch) == (False, [])
    assert "annotation headroom.dev/gpu-memory declares 20Gi" in decision.message
    assert "nvidia.com/mig-1g.5gb holds 4864Mi" in decision.message
    # The node's own size of the slice counts: one that advertises it larger passes.
    offer = MigOffer.from_nodes(
        [
            {
                "metadata": {"labels": {"nvidia.com/mig-1g.5gb.memory": "5120"}},
                "status": {"capacity": {"nvidia.com/mig-1g.5gb": "7"}},
            }
        ]
    )
    pod = gpu_pod({"nvidia.com/mig-1g.5gb": "1"}, annotations={"headroom.dev/gpu-memory": "5Gi"})
    assert run(pod, policy).allowed is False
    assert run(pod, policy, offer=offer).allowed is True


def test_an_explicit_slice_smaller_than_the_default_declares_the_slice() -> None:
    # The pod declares nothing; the policy's default (for sizing nvidia.com/gpu) is more
    # than the slice it asked for: the slice is what it may hold, and is recorded.
    pod = gpu_pod({"nvidia.com/mig-1g.5gb": "1"})
    decision = run(pod, mig_policy(defaultMemory="8Gi"))
    assert decision.allowed, decision.message
    assert decision.annotations["headroom.dev/declared-memory"] == "4864Mi"
    assert any("defaultMemory 8Gi" in w for w in decision.warnings), decision.warnings
    # A profile the table does not know and no node describes is not guessed at.
    pod = gpu_pod({"nvidia.com/mig-1g.18gb": "1"}, annotations={"headroom.dev/gpu-memory": "17Gi"})
    assert run(pod, make_policy("s", defaultMemory="4Gi")).allowed


def test_a_memory_resource_beside_a_small_slice_is_refused_for_the_resource() -> None:
    resources = {"nvidia.com/mig-1g.5gb": "1", "headroom.dev/gpu-memory": "20Gi"}
    pod = gpu_pod(resources)
    pod["spec"]["containers"][0]["resources"]["requests"] = dict(resources)
    decision = run(pod, mig_policy(maxMemory="80Gi"))
    assert not decision.allowed
    assert "which goes with nvidia.com/gpu.shared only" in decision.message, decision.message
