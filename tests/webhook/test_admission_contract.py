"""Contract: AdmissionReviews shaped as kube-apiserver v1.34 sends them, through the
real app; the returned patch is decoded and applied with ``jsonpatch`` as the
apiserver would, and the resulting pod is checked."""

import copy
import json
from typing import Any

from tests.webhook.conftest import Client
from tests.webhook.reviews import decoded_patch, patched, review_json
from webhook.cache import ClusterCache

EXTENDED_PREFIXES = ("nvidia.com/",)


async def admit(client: Client, document: dict[str, Any]) -> dict[str, Any]:
    """POST a review; check the envelope; return ``response``."""
    reply = await client.post("/mutate", json=document)
    assert reply.status == 200, await reply.text()
    assert reply.content_type == "application/json"
    body = await reply.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response: dict[str, Any] = body["response"]
    assert response["uid"] == document["request"]["uid"]
    assert ("patch" in response) == ("patchType" in response)
    for warning in response.get("warnings", []):
        assert len(warning) < 120
        assert warning.isascii()
    return response


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def assert_requests_equal_limits(pod: dict[str, Any]) -> None:
    for container in containers(pod):
        resources = container.get("resources", {})
        limits = {k: v for k, v in resources.get("limits", {}).items() if "/" in k}
        requests = {k: v for k, v in resources.get("requests", {}).items() if "/" in k}
        assert limits == requests, container["name"]


async def assert_idempotent(client: Client, document: dict[str, Any], pod: dict[str, Any]) -> None:
    """reinvocationPolicy IfNeeded: the webhook's own output gets no further patch."""
    again = copy.deepcopy(document)
    again["request"]["uid"] = "again-" + document["request"]["uid"]
    again["request"]["object"] = pod
    response = await admit(client, again)
    assert response["allowed"] is True
    assert "patch" not in response


async def test_a_deployment_pod_in_a_shared_namespace_gets_a_shared_gpu(client: Client) -> None:
    document = review_json("deployment-pod-shared")
    response = await admit(client, document)
    assert response["allowed"] is True
    pod = patched(document["request"]["object"], response)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "10Gi"}
    assert resources["requests"] == {
        "nvidia.com/gpu.shared": "1",
        "headroom.dev/gpu-memory": "10Gi",
    }
    annotations = pod["metadata"]["annotations"]
    assert annotations["headroom.dev/gpu-memory"] == "10Gi"  # the user's, kept
    assert annotations["headroom.dev/policy"] == "shared-default"
    assert annotations["headroom.dev/mode"] == "shared"
    assert annotations["headroom.dev/declared-memory"] == "10Gi"
    assert annotations["headroom.dev/placement"] == "binpack"
    tolerations = pod["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu.shared", "operator": "Exists", "effect": "NoSchedule"} in (
        tolerations
    )
    assert tolerations[:3] == document["request"]["object"]["spec"]["tolerations"]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    assert pod["spec"]["schedulerName"] == "headroom-scheduler"
    # generateName untouched, no name or namespace invented.
    assert pod["metadata"]["generateName"] == "tf-notebook-7d9c8b6f5-"
    assert "name" not in pod["metadata"]
    assert "namespace" not in pod["metadata"]
    assert any("nvidia.com/gpu.shared" in w for w in response["warnings"])
    # Pointer escaping: the slash in the resource name travels as ~1.
    paths = [op["path"] for op in decoded_patch(response)]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared" in paths
    await assert_idempotent(client, document, pod)


async def test_a_pod_without_annotation_declares_the_policy_default(client: Client) -> None:
    document = review_json("pod-cuda-vectoradd")
    response = await admit(client, document)
    pod = patched(document["request"]["object"], response)
    assert pod["metadata"]["annotations"]["headroom.dev/declared-memory"] == "4Gi"
    assert pod["metadata"]["name"] == "cuda-vectoradd"
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    await assert_idempotent(client, document, pod)


async def test_two_gpus_stay_whole_with_a_warning(client: Client) -> None:
    document = review_json("deployment-pod-two-gpus")
    response = await admit(client, document)
    pod = patched(document["request"]["object"], response)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["metadata"]["annotations"]["headroom.dev/mode"] == "exclusive"
    assert any("whole GPUs" in w for w in response["warnings"])
    await assert_idempotent(client, document, pod)


async def test_every_gpu_container_and_init_container_is_rewritten(client: Client) -> None:
    document = review_json("pod-multi-container")
    response = await admit(client, document)
    pod = patched(document["request"]["object"], response)
    by_name = {c["name"]: c["resources"] for c in containers(pod)}
    for name in ("warmup", "trainer", "sidecar"):
        assert by_name[name]["limits"]["nvidia.com/gpu.shared"] == "1", name
        assert "nvidia.com/gpu" not in by_name[name]["limits"], name
    assert by_name["trainer"]["limits"]["memory"] == "16Gi"
    assert by_name["logger"] == {"limits": {"cpu": "100m"}, "requests": {"cpu": "100m"}}
    # 6Gi (trainer) + 2Gi (sidecar override); the init container runs before them.
    assert pod["metadata"]["annotations"]["headroom.dev/declared-memory"] == "8Gi"
    assert_requests_equal_limits(pod)
    await assert_idempotent(client, document, pod)


async def test_a_mig_namespace_gets_the_smallest_fitting_profile(client: Client) -> None:
    document = review_json("deployment-pod-mig")
    response = await admit(client, document)
    pod = patched(document["request"]["object"], response)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-2g.10gb": "1"}
    assert pod["metadata"]["annotations"]["headroom.dev/mig-profile"] == "2g.10gb"
    assert_requests_equal_limits(pod)
    await assert_idempotent(client, document, pod)


async def test_an_mps_pod_keeps_host_ipc_and_gets_the_pinned_memory_hint(client: Client) -> None:
    document = review_json("pod-mps-hostipc")
    response = await admit(client, document)
    pod = patched(document["request"]["object"], response)
    assert pod["spec"]["hostIPC"] is True
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith("0=")
    await assert_idempotent(client, document, pod)


async def test_a_malformed_memory_annotation_is_denied_naming_it(client: Client) -> None:
    response = await admit(client, review_json("deployment-pod-bad-quantity"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "headroom.dev/gpu-memory" in response["status"]["message"]
    assert "10Gx" in response["status"]["message"]
    assert "patch" not in response


async def test_a_pod_without_gpu_passes_untouched(client: Client) -> None:
    response = await admit(client, review_json("deployment-pod-no-gpu"))
    assert response == {"uid": response["uid"], "allowed": True}


async def test_an_update_is_never_mutated(client: Client) -> None:
    response = await admit(client, review_json("pod-update"))
    assert response["allowed"] is True
    assert "patch" not in response


async def test_a_server_side_dry_run_gets_the_same_answer(client: Client) -> None:
    dry = await admit(client, review_json("pod-dry-run"))
    real = await admit(client, review_json("pod-cuda-vectoradd"))
    assert decoded_patch(dry) == decoded_patch(real)
    assert dry["warnings"] == real["warnings"]


async def test_a_dry_run_policy_only_warns(client: Client) -> None:
    document = review_json("pod-cuda-vectoradd")
    document["request"]["namespace"] = "dry-team"
    response = await admit(client, document)
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"]
    assert all(w.startswith("headroom dry-run") for w in response["warnings"])


async def test_a_namespace_naming_a_missing_policy_passes_with_a_warning(client: Client) -> None:
    document = review_json("pod-cuda-vectoradd")
    document["request"]["namespace"] = "typo-team"
    response = await admit(client, document)
    assert response["allowed"] is True
    assert "patch" not in response
    assert "no-such-policy" in response["warnings"][0]


async def test_an_invalid_policy_is_reported_as_invalid(
    client: Client, cache: ClusterCache
) -> None:
    cache.on_policy(
        "ADDED",
        {
            "apiVersion": "headroom.dev/v1alpha1",
            "kind": "GPUSharingPolicy",
            "metadata": {"name": "no-such-policy"},
            "spec": {"mode": "shared", "defaultMemory": "lots"},
        },
    )
    document = review_json("pod-cuda-vectoradd")
    document["request"]["namespace"] = "typo-team"
    response = await admit(client, document)
    assert response["allowed"] is True
    assert "patch" not in response
    assert "no-such-policy is invalid" in response["warnings"][0]
    assert "defaultMemory" in response["warnings"][0]
    metrics = await (await client.get("/metrics")).text()
    assert 'outcome="invalid-policy",policy="no-such-policy"' in metrics


async def test_a_deployment_sent_by_mistake_is_denied_naming_the_resource(client: Client) -> None:
    response = await admit(client, review_json("deployment-create"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "pods only" in response["status"]["message"]
    assert "apps/v1/deployments" in response["status"]["message"]


async def test_a_namespace_the_cache_has_not_seen_denies_rather_than_guess(client: Client) -> None:
    document = review_json("pod-cuda-vectoradd")
    document["request"]["namespace"] = "brand-new"
    response = await admit(client, document)
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert response["status"]["reason"] == "ServiceUnavailable"
    assert "brand-new" in response["status"]["message"]


async def test_the_patch_is_valid_json_patch_text(client: Client) -> None:
    response = await admit(client, review_json("deployment-pod-shared"))
    ops = decoded_patch(response)
    assert all(op["op"] in ("add", "replace", "remove") for op in ops)
    assert json.loads(json.dumps(ops)) == ops
