"""The webhook as the real apiserver calls it: what users see from kubectl."""

import pytest
import yaml

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import (
    declared_by_node,
    eventually,
    gpu_deployment,
    gpu_pod,
    node_memory,
    pods,
    running,
)

pytestmark = pytest.mark.e2e

TIME_SLICED = {"a100-shared-0", "a100-shared-1", "t4-shared-0"}


def _create(cluster: Cluster, obj: dict[str, object]) -> tuple[int, str]:
    result = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj), check=False)
    return result.returncode, result.stderr


def test_shared_policy_deployment_is_rewritten_and_placed_with_headroom(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    cluster.apply([gpu_deployment(ns, "trainer", replicas=3, memory="8Gi")])

    eventually("3 trainer pods Running", lambda: len(running(pods(cluster, ns))) == 3)
    policy = cluster.kubectl_json("get", "gpusharingpolicy", "gpu-shared")["spec"]
    for pod in pods(cluster, ns):
        # The declaration is the immutable resource, in limits and requests alike.
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {names.GPU_SHARED: "1", names.GPU_MEMORY: "8Gi"}
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        assert requests == {names.GPU_SHARED: "1", names.GPU_MEMORY: "8Gi"}
        assert pod["spec"]["schedulerName"] == names.HEADROOM_SCHEDULER
        for toleration in policy["tolerations"]:
            assert toleration in pod["spec"]["tolerations"]
        assert policy["nodeSelector"].items() <= pod["spec"]["nodeSelector"].items()
        annotations = pod["metadata"]["annotations"]
        assert annotations[names.ANNOTATION_DECLARED_MEMORY] == "8Gi"
        assert annotations[names.ANNOTATION_POLICY] == "gpu-shared"
        assert pod["spec"]["nodeName"] in TIME_SLICED
    memory = node_memory(cluster)
    for node, declared in declared_by_node(cluster).items():
        assert declared <= memory[node], f"{node}: {declared} declared > {memory[node]}"


def test_kubectl_shows_the_webhook_warnings(cluster: Cluster, namespace: NamespaceFactory) -> None:
    ns = namespace("gpu-shared")
    code, stderr = _create(cluster, gpu_pod(ns, "notebook"))  # no memory declared

    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("Warning: headroom")]
    assert warnings, stderr
    assert any("nvidia.com/gpu.shared" in line for line in warnings), warnings
    pod = cluster.kubectl_json("get", "pod", "notebook", "-n", ns)
    # The policy's defaultMemory stands in for the missing declaration.
    assert pod["metadata"]["annotations"][names.ANNOTATION_DECLARED_MEMORY] == "4Gi"


def test_mig_policy_gets_the_smallest_profile_that_fits(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-mig")
    code, stderr = _create(cluster, gpu_pod(ns, "inference", memory="8Gi"))

    assert code == 0, stderr
    eventually("the MIG pod Running", lambda: len(running(pods(cluster, ns))) == 1)
    pod = cluster.kubectl_json("get", "pod", "inference", "-n", ns)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-2g.10gb": "1"}
    assert pod["metadata"]["annotations"][names.ANNOTATION_MIG_PROFILE] == "2g.10gb"
    assert pod["spec"]["nodeName"] == "a100-mig-0"


def test_namespace_without_policy_is_untouched(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace(None)
    sent = gpu_pod(ns, "plain", memory="8Gi")
    code, stderr = _create(cluster, sent)

    assert code == 0, stderr
    assert "Warning" not in stderr
    pod = cluster.kubectl_json("get", "pod", "plain", "-n", ns)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {names.GPU: "1"}
    assert pod["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER
    assert set(pod["metadata"].get("annotations", {})) == {names.ANNOTATION_GPU_MEMORY}


def test_skip_label_alone_does_not_opt_a_pod_out(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # Issue 7 §2: the label used to keep a whole-GPU pod out of the accounting.
    ns = namespace("gpu-shared")  # no allowSkip
    code, stderr = _create(cluster, gpu_pod(ns, "opted-out", labels={names.LABEL_SKIP: "true"}))

    assert code == 0, stderr
    assert "headroom.dev/skip=true ignored" in stderr, stderr
    pod = cluster.kubectl_json("get", "pod", "opted-out", "-n", ns)
    assert names.GPU_SHARED in pod["spec"]["containers"][0]["resources"]["limits"]
    assert pod["spec"]["schedulerName"] == names.HEADROOM_SCHEDULER


def test_skip_label_opts_a_pod_out_where_the_policy_allows_it(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    policy = {
        "apiVersion": names.API_VERSION,
        "kind": names.POLICY_KIND,
        "metadata": {"name": "gpu-shared-skippable"},
        "spec": {"defaultMemory": "4Gi", "allowSkip": True},
    }
    cluster.apply([policy])
    try:
        ns = namespace("gpu-shared-skippable")
        probe = gpu_pod(ns, "probe")
        # The webhook learns policies from a watch: wait until it knows this one.
        eventually(
            "the webhook knows gpu-shared-skippable",
            lambda: (
                "does not exist"
                not in cluster.kubectl(
                    "create",
                    "--dry-run=server",
                    "-f",
                    "-",
                    input=yaml.safe_dump(probe),
                    check=False,
                ).stderr
            ),
        )
        code, stderr = _create(cluster, gpu_pod(ns, "opted-out", labels={names.LABEL_SKIP: "true"}))

        assert code == 0, stderr
        pod = cluster.kubectl_json("get", "pod", "opted-out", "-n", ns)
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {names.GPU: "1"}
    finally:
        cluster.kubectl("delete", "gpusharingpolicy", "gpu-shared-skippable", check=False)


def test_pod_above_max_memory_is_denied_with_a_clear_message(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")  # maxMemory 20Gi
    code, stderr = _create(cluster, gpu_pod(ns, "greedy", memory="30Gi"))

    assert code != 0
    assert 'admission webhook "pods.headroom.dev" denied the request' in stderr, stderr
    assert "30Gi" in stderr, stderr
    assert "20Gi" in stderr, stderr
    assert cluster.kubectl("get", "pod", "greedy", "-n", ns, check=False).returncode != 0


def test_pod_the_webhook_annotations_would_take_past_the_limit_is_denied_by_the_webhook(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    """Without the check, the apiserver refused the mutated pod for a limit its author
    had not passed (``metadata.annotations: Too long: may not be more than 262144 bytes``)."""
    ns = namespace("gpu-shared")
    pod = gpu_pod(ns, "annotated", memory="4Gi")
    annotations = pod["metadata"].setdefault("annotations", {})
    used = sum(len(key) + len(value) for key, value in annotations.items())
    key = "example.com/notes"
    annotations[key] = "x" * (262144 - 50 - used - len(key))
    code, stderr = _create(cluster, pod)

    assert code != 0
    assert 'admission webhook "pods.headroom.dev" denied the request' in stderr, stderr
    assert "metadata.annotations" in stderr, stderr
    assert "262094 bytes" in stderr, stderr
    assert cluster.kubectl("get", "pod", "annotated", "-n", ns, check=False).returncode != 0


def test_webhook_down_fails_closed_for_gpu_pods_only(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    cluster.stop("webhook")
    try:
        code, stderr = _create(cluster, gpu_pod(ns, "while-down", memory="4Gi"))
        cpu_pod = gpu_pod(ns, "cpu-only")
        cpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
        cpu_code, cpu_stderr = _create(cluster, cpu_pod)
    finally:
        cluster.start("webhook")

    assert code != 0
    assert 'failed calling webhook "pods.headroom.dev"' in stderr, stderr
    # matchConditions keep pods that ask for no GPU away from the webhook.
    assert cpu_code == 0, cpu_stderr
    code, stderr = _create(cluster, gpu_pod(ns, "after-restart", memory="4Gi"))
    assert code == 0, stderr
