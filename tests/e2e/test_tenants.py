"""Issue 7's attacks, each as a tenant or a component would try it, on the real control plane.

A tenant is a user bound to the built-in ``edit`` ClusterRole in their
namespace (DESIGN §8b), impersonated with ``kubectl --as``. Each attack worked
on Headroom 0.1; here each is refused, or changes nothing.
"""

import copy
import re
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import (
    GIB,
    eventually,
    failed_scheduling,
    gpu_container,
    gpu_deployment,
    gpu_pod,
    legacy_pod,
    pods,
    running,
    settle,
    wait_idle,
)

TENANT = "tenant-ada"
NODE = "a100-shared-0"


def tenant_of(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "create", "rolebinding", "tenant-edit", "--clusterrole=edit", f"--user={TENANT}",
        "-n", namespace,
    )  # fmt: skip


def as_tenant(cluster: Cluster, *args: str, input: str | None = None) -> tuple[int, str]:
    result = cluster.kubectl(f"--as={TENANT}", *args, input=input, check=False)
    return result.returncode, result.stderr + result.stdout


def create(cluster: Cluster, obj: dict[str, Any], *as_who: str) -> tuple[int, str]:
    result = cluster.kubectl(*as_who, "create", "-f", "-", input=yaml.safe_dump(obj), check=False)
    return result.returncode, result.stderr + result.stdout


def shared_pod(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """A pod asking nvidia.com/gpu.shared directly, declaring 1Mi, as a tenant would write it."""
    limits = {names.GPU_SHARED: "1", names.GPU_MEMORY: "1Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": names.HEADROOM_SCHEDULER,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
            **spec,
        },
    }


def pinned(namespace: str, name: str, replicas: int, memory: str) -> dict[str, Any]:
    return gpu_deployment(
        namespace,
        name,
        replicas=replicas,
        memory=memory,
        node_selector={"kubernetes.io/hostname": NODE},
    )


def test_patched_annotations_change_no_charge(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # An earlier test's pod deleted before kubelet said it stopped stays charged here
    # through its grace period: three 10Gi pods fit only on a node charged nothing.
    wait_idle(cluster, [NODE])
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    cluster.apply([pinned(ns, "fill", 3, "10Gi")])
    eventually("3 pods Running", lambda: len(running(pods(cluster, ns))) == 3)
    for pod in pods(cluster, ns):
        name = pod["metadata"]["name"]
        code, out = as_tenant(
            cluster, "annotate", "pod", name, "-n", ns, "--overwrite",
            f"{names.ANNOTATION_DECLARED_MEMORY}=1Mi",
            f"{names.ANNOTATION_POLICY}=gpu-shared-dryrun",
        )  # fmt: skip
        assert code == 0, out  # annotations are the tenant's to write ...
        code, out = as_tenant(
            cluster, "patch", "pod", name, "-n", ns, "--type=json", "-p",
            '[{"op":"replace","path":"/spec/containers/0/resources/limits/headroom.dev~1gpu-memory",'
            '"value":"1Mi"}]',
        )  # fmt: skip
        assert code != 0, out  # ... the declaration is not: pod resources are immutable
        assert "Forbidden" in out or "Invalid" in out, out
    # ... and nothing they wrote freed memory: a fourth 10Gi pod still does not fit.
    cluster.apply([pinned(ns, "more", 1, "10Gi")])
    settle(cluster, ns, total=4)
    assert len(running(pods(cluster, ns))) == 3
    (waiting,) = [p for p in pods(cluster, ns) if p["metadata"]["name"].startswith("more")]
    reason = failed_scheduling(cluster, ns)[waiting["metadata"]["name"]]
    assert names.GPU_MEMORY in reason or "declared" in reason, reason


def test_skip_label_preset_node_and_foreign_scheduler_are_refused(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    as_tenant_flag = f"--as={TENANT}"

    # The skip label no longer takes a pod out of the accounting (gpu-shared has
    # no allowSkip): the webhook declares the policy's default, as for any pod.
    skipped = gpu_pod(ns, "skipper", labels={names.LABEL_SKIP: "true"})
    skipped["spec"]["containers"][0]["resources"]["limits"] = {names.GPU_SHARED: "1"}
    code, out = create(cluster, skipped, as_tenant_flag)
    assert code == 0, out
    limits = cluster.kubectl_json("get", "pod", "skipper", "-n", ns)["spec"]["containers"][0][
        "resources"
    ]["limits"]
    assert limits == {names.GPU_SHARED: "1", names.GPU_MEMORY: "4Gi"}, limits
    cluster.kubectl("delete", "pod", "skipper", "-n", ns, "--wait=false")

    code, out = create(cluster, shared_pod(ns, "preset", nodeName=NODE), as_tenant_flag)
    assert code != 0, out
    assert "may not preset spec.nodeName" in out, out

    foreign = gpu_pod(ns, "kai", memory="4Gi")
    foreign["spec"]["schedulerName"] = "kai-scheduler"
    code, out = create(cluster, foreign, as_tenant_flag)
    assert code != 0, out
    # The webhook refuses it first (foreignSchedulers: deny); the admission policy
    # would refuse it too once rewritten to a shared slot.
    assert "spec.schedulerName is kai-scheduler" in out, out
    assert "foreignSchedulers: deny" in out, out

    assert [p["metadata"]["name"] for p in pods(cluster, ns)] in ([], ["skipper"])


def test_an_unlabelled_namespace_cannot_ask_for_shared_slots(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace()
    tenant_of(cluster, ns)
    code, out = create(cluster, shared_pod(ns, "sneaky"), f"--as={TENANT}")
    assert code != 0, out
    assert "without the label headroom.dev/policy" in out, out
    whole = gpu_pod(ns, "whole")  # nvidia.com/gpu: 1 stays allowed, untouched
    code, out = create(cluster, whole, f"--as={TENANT}")
    assert code == 0, out


def test_a_time_sliced_mig_slice_is_refused(cluster: Cluster, namespace: NamespaceFactory) -> None:
    # The device plugin names a MIG slice's time-slicing replicas
    # nvidia.com/mig-<profile>.shared. Read as a slice of its own, such a pod was
    # admitted everywhere with no declaration: its neighbours on the slice uncharged.
    sliced = {"nvidia.com/mig-1g.10gb.shared": "1"}
    plain, policy = namespace(), namespace("gpu-shared")
    for ns, expected in (
        (plain, 'container "main" asks for a time-sliced MIG slice'),  # the admission policy
        (policy, 'container "main" asks for nvidia.com/mig-1g.10gb.shared, a time-sliced'),
    ):
        tenant_of(cluster, ns)
        pod = shared_pod(ns, "sliced", nodeName=NODE)
        pod["spec"]["containers"][0]["resources"]["limits"] = dict(sliced)
        code, out = create(cluster, pod, f"--as={TENANT}")
        assert code != 0, out
        assert expected in out, out
        assert pods(cluster, ns) == []
    exempt = namespace()  # an admin's choice of stock time-slicing: left alone
    cluster.kubectl("label", "namespace", exempt, f"{names.LABEL_EXEMPT}=true")
    pod = shared_pod(exempt, "sliced")
    pod["spec"]["containers"][0]["resources"]["limits"] = dict(sliced)
    result = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False
    )
    assert result.returncode == 0, result.stderr


def test_gpu_memory_without_a_shared_slot_is_refused(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # headroom.dev/gpu-memory alone (or beside a MIG slice or a whole GPU) is backed by
    # no GPU slot, yet would take the node's advertised GPU memory from shared pods.
    rule = "declares headroom.dev/gpu-memory without asking for nvidia.com/gpu.shared"
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    stray = shared_pod(ns, "stray")
    stray["spec"]["containers"][0]["resources"]["limits"] = {names.GPU_MEMORY: "8Gi"}
    code, out = create(cluster, stray, f"--as={TENANT}")
    assert code != 0, out
    assert f'container "main" {rule}' in out, out

    # Beside a MIG slice: the webhook declares memory for shared slots only, and
    # refuses the resource first, naming the field (the admission policy would too).
    mig_ns = namespace("gpu-mig")
    tenant_of(cluster, mig_ns)
    slice_pod = shared_pod(mig_ns, "slice")
    slice_pod["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/mig-1g.5gb": "1",
        names.GPU_MEMORY: "4Gi",
    }
    code, out = create(cluster, slice_pod, f"--as={TENANT}")
    assert code != 0, out
    assert (
        f"spec.containers[0].resources.limits[{names.GPU_MEMORY}], which goes with "
        f"{names.GPU_SHARED} only" in out
    ), out

    # A namespace an admin exempted is left alone, as for every shared-GPU rule.
    exempt = namespace("gpu-shared")
    cluster.kubectl("label", "namespace", exempt, f"{names.LABEL_EXEMPT}=true")
    stray["metadata"]["namespace"] = exempt
    code, out = create(cluster, stray)
    assert code == 0, out


def test_a_shared_count_of_zero_is_no_slot(cluster: Cluster, namespace: NamespaceFactory) -> None:
    # nvidia.com/gpu.shared: 0 asks for no GPU; beside declared memory it would carry
    # memory past maxMemory and past the rule above. The webhook refuses it first...
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    padded = gpu_pod(ns, "padded", memory="4Gi")
    padded["spec"]["containers"].append(
        {
            "name": "pad",
            "image": "busybox",
            "resources": {"limits": {names.GPU_SHARED: "0", names.GPU_MEMORY: "60Gi"}},
        }
    )
    code, out = create(cluster, padded, f"--as={TENANT}")
    assert code != 0, out
    assert f'container "pad" asks for {names.GPU_SHARED}: 0 beside {names.GPU_MEMORY}' in out, out

    # ...and the admission policy, which counts a slot only above 0, where the
    # webhook only reports (a dry-run policy).
    dry = namespace("gpu-shared-dryrun")
    tenant_of(cluster, dry)
    zero = shared_pod(dry, "zero")
    zero["spec"]["containers"][0]["resources"]["limits"][names.GPU_SHARED] = "0"
    code, out = create(cluster, zero, f"--as={TENANT}")
    assert code != 0, out
    assert (
        'container "main" declares headroom.dev/gpu-memory without asking for '
        "nvidia.com/gpu.shared" in out
    ), out
    assert pods(cluster, ns) == []
    assert pods(cluster, dry) == []


def test_a_shared_pods_grace_period_is_bounded(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # A pod force-deleted (kubectl delete --force --grace-period=0) leaves the API at
    # once, and kubelet, which never saw a deletion grace period, stops it with the
    # pod's own (calculateEffectiveGracePeriod, pkg/kubelet/pod_workers.go): a year,
    # with SIGTERM trapped. The extender charges a pod gone from the API for its
    # grace period up to 600 s; the guard has no pod left to evict. So a shared pod
    # may not ask for longer: in a policy namespace (through the webhook) or not.
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    year = gpu_pod(ns, "year", memory="4Gi")
    year["spec"]["terminationGracePeriodSeconds"] = 31_536_000
    direct = shared_pod(ns, "direct", terminationGracePeriodSeconds=601)
    for pod in (year, direct):
        code, out = create(cluster, pod, f"--as={TENANT}")
        assert code != 0, out
        assert "spec.terminationGracePeriodSeconds" in out, out
        assert "at most 600" in out, out
    assert pods(cluster, ns) == []
    ten_minutes = gpu_pod(ns, "ten-minutes", memory="4Gi")
    ten_minutes["spec"]["terminationGracePeriodSeconds"] = 600
    result = cluster.kubectl(
        f"--as={TENANT}", "create", "--dry-run=server", "-f", "-",
        input=yaml.safe_dump(ten_minutes), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_counts_cut_to_64_bits_and_a_declaration_of_0_are_refused(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # 2^64 + 1 passes the apiserver's own checks, and kube-scheduler and kubelet read
    # it as 1: a MIG slice with a preset node in a namespace without a policy (allowed
    # there) would have been charged 2^64 + 1 slices, and a shared pod hung the
    # extender. Refused in every namespace, exempt ones included.
    huge = str(2**64 + 1)
    plain = namespace()
    tenant_of(cluster, plain)
    mig = shared_pod(plain, "many-slices", nodeName=NODE)
    mig["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-1g.5gb": huge}
    code, out = create(cluster, mig, f"--as={TENANT}")
    assert code != 0, out
    assert (
        'container "main" resources.limits[nvidia.com/mig-1g.5gb]: asks for more than 1024 '
        "GPUs, replicas or MIG slices" in out
    ), out
    exempt = namespace()  # no policy, so no webhook: the admission policy alone
    cluster.kubectl("label", "namespace", exempt, f"{names.LABEL_EXEMPT}=true")
    shared = shared_pod(exempt, "many-replicas")
    shared["spec"]["containers"][0]["resources"]["limits"][names.GPU_SHARED] = huge
    code, out = create(cluster, shared)
    assert code != 0, out
    assert "asks for more than 1024" in out, out
    shared["spec"]["containers"][0]["resources"]["limits"][names.GPU_SHARED] = "1024"
    code, out = create(cluster, shared)
    assert code == 0, out  # the most is allowed

    # A declaration of 0 is no declaration, and the extender could never place the
    # pod. The webhook refuses it where it applies a policy; where the label names a
    # policy that does not exist it lets every pod through unchanged.
    dry = namespace("no-such-policy")
    tenant_of(cluster, dry)
    zero = shared_pod(dry, "zero")
    zero["spec"]["containers"][0]["resources"]["limits"][names.GPU_MEMORY] = "0"
    code, out = create(cluster, zero, f"--as={TENANT}")
    assert code != 0, out
    assert "declares no headroom.dev/gpu-memory above 0" in out, out
    assert pods(cluster, plain) == []
    assert pods(cluster, dry) == []


def test_quota_on_gpu_memory_and_a_warning_for_a_bypassed_gpu_quota(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {f"requests.{names.GPU_MEMORY}": "20Gi", "requests.nvidia.com/gpu": "1"}},
    }
    cluster.apply([quota])
    eventually(
        "the quota to be counted",
        lambda: bool(cluster.kubectl_json("get", "resourcequota", "gpu", "-n", ns).get("status")),
    )
    outcomes = [create(cluster, gpu_pod(ns, f"q{i}", memory="10Gi")) for i in range(3)]
    assert [code for code, _ in outcomes] == [0, 0, 1], outcomes
    assert "exceeded quota: gpu" in outcomes[2][1], outcomes[2][1]
    assert f"requests.{names.GPU_MEMORY}" in outcomes[2][1], outcomes[2][1]
    # The rewrite took these pods out of requests.nvidia.com/gpu; kubectl says so.
    assert "ResourceQuota gpu limits nvidia.com/gpu" in outcomes[0][1], outcomes[0][1]


def test_a_bypassed_gpu_quota_is_warned_for_init_containers_and_mig_slices(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # The webhook takes nvidia.com/gpu out of init containers too (to
    # nvidia.com/gpu.shared), and out of every container under a MIG policy (to
    # nvidia.com/mig-<profile>): a quota on requests.nvidia.com/gpu counts neither.
    shared, mig = namespace("gpu-shared"), namespace("gpu-mig")
    for ns in (shared, mig):
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {"hard": {"requests.nvidia.com/gpu": "1"}},
        }
        cluster.apply([quota])

        def counted(ns: str = ns) -> bool:
            return bool(cluster.kubectl_json("get", "resourcequota", "gpu", "-n", ns).get("status"))

        eventually(f"the quota in {ns} to be counted", counted)
    setup = gpu_pod(shared, "setup", memory="4Gi")
    setup["spec"]["initContainers"] = [gpu_container("warm-up")]
    setup["spec"]["containers"] = [{"name": "main", "image": "registry.example/app:1"}]
    code, out = create(cluster, setup)
    assert code == 0, out
    assert "ResourceQuota gpu limits nvidia.com/gpu" in out, out
    assert "nvidia.com/gpu.shared" in out, out
    code, out = create(cluster, gpu_pod(mig, "inference", memory="8Gi"))
    assert code == 0, out
    assert "ResourceQuota gpu limits nvidia.com/gpu" in out, out
    assert "requests.nvidia.com/mig-" in out, out


def test_an_agent_may_write_only_its_own_nodes_report(cluster: Cluster) -> None:
    own = cluster.state.kubeconfigs / f"agent-{NODE}.kubeconfig"
    other = "a100-shared-1"
    report = cluster.kubectl_json("get", "gpunodereport", other)
    forged = copy.deepcopy(report)
    forged["metadata"].pop("managedFields", None)
    for gpu in forged["status"]["gpus"]:
        gpu["totalBytes"] = 1024 * GIB
    result = cluster.kubectl(
        f"--kubeconfig={own}", "replace", "-f", "-", input=yaml.safe_dump(forged), check=False
    )
    assert result.returncode != 0, result.stdout
    assert f"the agent of node {NODE} may not write the GPUNodeReport of {other}" in result.stderr
    after = cluster.kubectl_json("get", "gpunodereport", other)
    assert all(gpu["totalBytes"] < 1024 * GIB for gpu in after["status"]["gpus"])


def test_the_certificates_account_cannot_mint_token_secrets(cluster: Cluster) -> None:
    account = "--as=system:serviceaccount:headroom-system:headroom-certs"
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "headroom-webhook-tls",
            "namespace": "headroom-system",
            "annotations": {"kubernetes.io/service-account.name": "headroom-scheduler"},
        },
        "type": "kubernetes.io/service-account-token",
    }
    result = cluster.kubectl(
        account, "create", "-f", "-", input=yaml.safe_dump(token_secret), check=False
    )
    assert result.returncode != 0, result.stdout
    assert "only Opaque or kubernetes.io/tls Secrets" in result.stderr, result.stderr
    other = {
        **token_secret,
        "type": "Opaque",
        "metadata": {"name": "x", "namespace": "headroom-system"},
    }
    result = cluster.kubectl(account, "create", "-f", "-", input=yaml.safe_dump(other), check=False)
    assert result.returncode != 0, result.stdout
    assert "only Secrets headroom-webhook-tls and headroom-webhook-ca" in result.stderr


def test_node_capacity_is_advertised_and_put_back(cluster: Cluster) -> None:
    def capacity() -> str | None:
        node = cluster.kubectl_json("get", "node", NODE)
        value: str | None = node["status"]["capacity"].get(names.GPU_MEMORY)
        return value

    eventually("the node's GPU memory capacity", lambda: capacity() == "40448Mi")
    # What a kubelet restart without its device-plugin checkpoint does to extended resources.
    cluster.kubectl(
        "patch", "node", NODE, "--subresource=status", "--type=merge", "-p",
        '{"status":{"capacity":{"headroom.dev/gpu-memory":"0"},'
        '"allocatable":{"headroom.dev/gpu-memory":"0"}}}',
    )  # fmt: skip
    eventually("the capacity put back", lambda: capacity() == "40448Mi", timeout=60)


def test_the_schedulers_account_changes_only_its_two_keys_on_a_node(cluster: Cluster) -> None:
    # RBAC lets it patch nodes and nodes/status; the admission policy keeps it to the
    # room-at annotation and the headroom.dev/gpu-memory capacity, on both paths
    # (a status update may change metadata too).
    # As the extender does it: a PATCH alone (kubectl would GET nodes/status first,
    # which the account may not).
    api = k8s_config.new_client_from_config(str(cluster.kubeconfig))
    api.set_default_header(
        "Impersonate-User", "system:serviceaccount:headroom-system:headroom-scheduler"
    )
    core = k8s.CoreV1Api(api)

    def refusal(patch: Any, body: dict[str, Any]) -> str:
        try:
            patch(NODE, body)
        except ApiException as err:
            return str(err.body)
        return ""

    room_at = {"metadata": {"annotations": {"headroom.dev/room-at": "2026-01-01T00:00:00Z"}}}
    memory = {names.GPU_MEMORY: "40448Mi"}
    assert refusal(core.patch_node, room_at) == ""
    assert (
        refusal(core.patch_node_status, {"status": {"capacity": memory, "allocatable": memory}})
        == ""
    )
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "x",
        "uid": "0" * 8 + "-0000-0000-0000-" + "0" * 12,
    }
    attempts: list[tuple[Any, dict[str, Any]]] = [
        (core.patch_node, {"metadata": {"labels": {"nvidia.com/gpu.memory": "81920"}}}),
        (core.patch_node, {"metadata": {"ownerReferences": [owner]}}),
        (core.patch_node_status, {"metadata": {"labels": {"nvidia.com/gpu.memory": "81920"}}}),
        (core.patch_node_status, {"metadata": {"annotations": {"x": "y"}}}),
        (core.patch_node_status, {"status": {"capacity": {"nvidia.com/gpu.shared": "64"}}}),
    ]
    for patch, body in attempts:
        assert "may change only the node annotation" in refusal(patch, body), body
    api.close()
    labels = cluster.kubectl_json("get", "node", NODE)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.memory"] == "40960"


def test_a_legacy_pod_is_charged_the_whole_gpu(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # A shared pod with no declared resource, as 0.1 admitted them: only an admin's
    # exempt namespace can still create one now.
    legacy_ns = namespace()
    cluster.kubectl("label", "namespace", legacy_ns, f"{names.LABEL_EXEMPT}=true")
    code, out = create(cluster, legacy_pod(legacy_ns, "old", nodeName=NODE))
    assert code == 0, out
    ns = namespace("gpu-shared")
    cluster.apply([pinned(ns, "small", 1, "1Gi")])
    settle(cluster, ns, total=1)
    assert running(pods(cluster, ns)) == []
    reason = next(iter(failed_scheduling(cluster, ns).values()))
    # The whole 40 GiB is charged to the legacy pod, whatever its annotation says:
    # 40448 MiB offered (40 GiB less the margin) - 40 GiB = -512 MiB left at most,
    # less while an earlier test's pods on the same GPU are still being deleted.
    left = re.search(r"(-[\d.]+) (MiB|GiB) headroom < 1.0 GiB declared", reason)
    assert left is not None, reason
    assert float(left[1]) * (1024 if left[2] == "GiB" else 1) <= -512, reason


@pytest.mark.parametrize(
    "extra",
    [
        {names.GPU_MEMORY: "0"},
        {names.GPU_MEMORY: str(2**256 + 1)},
        {"nvidia.com/mig-1g.5gb": "1"},
    ],
    ids=["declares-0", "declares-2^256+1", "beside-a-mig-slice"],
)
def test_a_shared_pod_the_extender_cannot_read_is_charged_the_whole_gpu(
    cluster: Cluster, namespace: NamespaceFactory, extra: dict[str, str]
) -> None:
    # In an exempt namespace no admission policy looks at a shared pod's other
    # resources, and the apiserver stores each of these: a declaration of 0; one of
    # 2^256 + 1, whose low 64 bits, all kube-scheduler and kubelet read, are 1; a
    # MIG slice in the same container (a node mixing MIG and time-sliced GPUs
    # offers both). None is a declaration the extender can charge; such a pod must
    # still be charged the whole GPU, as an undeclared one is, never dropped from
    # the accounting as malformed.
    exempt = namespace()
    cluster.kubectl("label", "namespace", exempt, f"{names.LABEL_EXEMPT}=true")
    tenant_of(cluster, exempt)
    odd = legacy_pod(exempt, "odd", nodeName=NODE)
    odd["spec"]["containers"][0]["resources"]["limits"].update(extra)
    code, out = create(cluster, odd, f"--as={TENANT}")
    assert code == 0, out
    ns = namespace("gpu-shared")
    cluster.apply([pinned(ns, "small", 1, "1Gi")])
    settle(cluster, ns, total=1)
    assert running(pods(cluster, ns)) == []
    reason = next(iter(failed_scheduling(cluster, ns).values()))
    left = re.search(r"(-[\d.]+) (MiB|GiB) headroom < 1.0 GiB declared", reason)
    assert left is not None, reason
    assert float(left[1]) * (1024 if left[2] == "GiB" else 1) <= -512, reason


def test_kubernetes_1_34_paths_around_the_declaration_are_closed(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # Kubernetes 1.34 ways a pod might get a GPU slot, or change what it holds,
    # after admission or beside it: in-place resize (pods/resize), ephemeral
    # containers, a Binding, spec.nodeName on a gated pod, pod-level resources, a
    # GPU sidecar. Each is closed by Kubernetes itself (RBAC: edit grants none of
    # pods/resize, pods/ephemeralcontainers, pods/binding; validation: resize changes
    # cpu and memory only, ephemeral containers take no resources, pod-level
    # resources are cpu, memory and hugepages) or by the admission policies. If an
    # upgrade opens one, this fails. ResourceClaims are the tenant's to create (edit,
    # with DRA on by default): README, "Hardening the NVIDIA stack".
    ns = namespace("gpu-shared")
    tenant_of(cluster, ns)
    admin = k8s_config.new_client_from_config(str(cluster.kubeconfig))
    as_ada = k8s_config.new_client_from_config(str(cluster.kubeconfig))
    as_ada.set_default_header("Impersonate-User", TENANT)
    core, tenant_core = k8s.CoreV1Api(admin), k8s.CoreV1Api(as_ada)

    def refusal(call: Any, *args: Any) -> tuple[int, str]:
        try:
            call(*args)
        except ApiException as err:
            return err.status, str(err.body)
        return 0, ""

    code, out = create(cluster, gpu_pod(ns, "held", memory="4Gi"), f"--as={TENANT}")
    assert code == 0, out
    eventually(
        "held bound",
        lambda: bool(cluster.kubectl_json("get", "pod", "held", "-n", ns)["spec"].get("nodeName")),
    )
    smaller = {names.GPU_SHARED: "1", names.GPU_MEMORY: "1Mi"}
    resize = {"spec": {"containers": [{"name": "main", "resources": {"limits": smaller}}]}}
    status, body = refusal(tenant_core.patch_namespaced_pod_resize, "held", ns, resize)
    assert status == 403, body
    assert "pods/resize" in body, body
    status, body = refusal(core.patch_namespaced_pod_resize, "held", ns, resize)
    assert status == 422, body
    assert "only cpu and memory resources are mutable" in body, body

    debug = {
        "spec": {
            "ephemeralContainers": [
                {"name": "debug", "image": "cuda", "resources": {"limits": smaller}}
            ]
        }
    }
    status, body = refusal(tenant_core.patch_namespaced_pod_ephemeralcontainers, "held", ns, debug)
    assert status == 403, body
    assert "pods/ephemeralcontainers" in body, body
    status, body = refusal(core.patch_namespaced_pod_ephemeralcontainers, "held", ns, debug)
    assert status == 422, body
    assert "cannot be set for an Ephemeral Container" in body, body
    limits = cluster.kubectl_json("get", "pod", "held", "-n", ns)["spec"]["containers"][0][
        "resources"
    ]["limits"]
    assert limits == {names.GPU_SHARED: "1", names.GPU_MEMORY: "4Gi"}, limits

    gated = shared_pod(ns, "gated", schedulingGates=[{"name": "example.com/wait"}])
    code, out = create(cluster, gated, f"--as={TENANT}")
    assert code == 0, out
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "gated", "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }
    status, body = refusal(tenant_core.create_namespaced_pod_binding, "gated", ns, binding)
    assert status == 403, body
    assert "pods/binding" in body, body
    status, body = refusal(
        tenant_core.patch_namespaced_pod, "gated", ns, {"spec": {"nodeName": NODE}}
    )
    assert status == 422, body
    assert cluster.kubectl_json("get", "pod", "gated", "-n", ns)["spec"].get("nodeName") is None

    pod_level = shared_pod(ns, "pod-level")
    pod_level["spec"]["containers"][0]["resources"] = {}
    pod_level["spec"]["resources"] = {"limits": smaller}
    code, out = create(cluster, pod_level, f"--as={TENANT}")
    assert code != 0, out
    assert "spec.resources.limits" in out, out
    assert "Unsupported value" in out, out

    # A sidecar (restartable init container) is held to the same rules as any
    # container: where the webhook only reports, the admission policy names it.
    dry = namespace("gpu-shared-dryrun")
    tenant_of(cluster, dry)
    sidecar = shared_pod(dry, "sidecar")
    sidecar["spec"]["initContainers"] = [
        {
            "name": "side",
            "image": "cuda",
            "restartPolicy": "Always",
            "resources": {"limits": {names.GPU_SHARED: "1"}},
        }
    ]
    code, out = create(cluster, sidecar, f"--as={TENANT}")
    assert code != 0, out
    assert 'container "side" asks for nvidia.com/gpu.shared but declares no' in out, out

    code, out = as_tenant(cluster, "auth", "can-i", "create", "resourceclaims.resource.k8s.io",
                          "-n", ns)  # fmt: skip
    assert out.strip() == "yes", out
    admin.close()
    as_ada.close()
