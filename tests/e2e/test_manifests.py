"""The manifests users apply, checked by the real apiserver.

``manifests/base`` goes through a server-side dry run (schema, defaulting,
admission; nothing needs to pull an image); the local overlay (the base minus
the workloads) was applied for real by ``cluster up``, and each of its objects
must be in the cluster as rendered. The real-node overlay is the base pinned to
the real node, with local images and a simulated agent, and nothing weaker.
"""

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import build_parser
from devcluster.binaries import CHECKOUT
from devcluster.cluster import Cluster
from devcluster.kubectl import FIELD_MANAGER

pytestmark = pytest.mark.e2e

MANIFESTS = CHECKOUT / "manifests"
WORKLOADS = {
    ("Deployment", "headroom-webhook"),
    ("Deployment", "headroom-scheduler"),
    ("DaemonSet", "headroom-agent"),
    ("Job", "headroom-certs"),
    ("CronJob", "headroom-certs-renew"),
    ("Service", "headroom-webhook"),
    ("PodDisruptionBudget", "headroom-webhook"),
    ("PodDisruptionBudget", "headroom-scheduler"),
}
SA = "system:serviceaccount:headroom-system:"
REAL_NODE = {"headroom.dev/real-node": "true"}
GPU_TAINT = {"key": "node-role.kubernetes.io/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _keys(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def _render(cluster: Cluster, directory: Path) -> list[dict[str, Any]]:
    return cluster.kubectl.kustomize(directory)


def test_base_passes_a_server_side_dry_run(cluster: Cluster) -> None:
    result = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--force-conflicts",
        # The same field manager as `cluster up`, so the local overlay's webhook URL
        # is dropped as it would be when a user moves from the overlay to the base.
        f"--field-manager={FIELD_MANAGER}", "-k", str(MANIFESTS / "base"),
    )  # fmt: skip

    applied = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(_render(cluster, MANIFESTS / "base")), result.stdout
    assert "deployment.apps/headroom-webhook serverside-applied" in result.stdout


def test_local_overlay_is_the_base_without_workloads_and_is_applied(cluster: Cluster) -> None:
    base = _render(cluster, MANIFESTS / "base")
    local = _render(cluster, MANIFESTS / "overlays" / "local")

    assert _keys(base) - _keys(local) == WORKLOADS
    for obj in local:
        kind, name = obj["kind"], obj["metadata"]["name"]
        args = ["get", kind, name]
        if "namespace" in obj["metadata"]:
            args += ["-n", obj["metadata"]["namespace"]]
        live = cluster.kubectl_json(*args)
        assert live["metadata"]["name"] == name
    configuration = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "headroom")
    webhook = configuration["webhooks"][0]
    assert webhook["clientConfig"]["url"].startswith("https://127.0.0.1:")
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["timeoutSeconds"] == 5
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["sideEffects"] == "None"
    assert [c["name"] for c in webhook["matchConditions"]] == ["asks-for-nvidia-gpu"]


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def _without_pinning(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` less what the real-node overlay may change in a workload: where it
    runs, the pull policy, the agent's flags and the kubelet directory's host path."""
    copy: dict[str, Any] = yaml.safe_load(yaml.safe_dump(obj))
    if copy["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob"):
        pod = _pod_spec(copy)
        pod.pop("nodeSelector", None)
        pod["tolerations"] = [t for t in pod.get("tolerations", []) if t != GPU_TAINT]
        pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
        for volume in pod["volumes"]:
            if volume["name"] == "pod-resources":
                volume["hostPath"].pop("path")
        for container in pod["containers"]:
            container.pop("imagePullPolicy", None)
            if copy["kind"] == "DaemonSet":
                container.pop("args")
    return copy


def test_realnode_overlay_pins_the_base_to_the_real_node_and_weakens_nothing(
    cluster: Cluster,
) -> None:
    base = {(o["kind"], o["metadata"]["name"]): o for o in _render(cluster, MANIFESTS / "base")}
    real = {
        (o["kind"], o["metadata"]["name"]): o
        for o in _render(cluster, MANIFESTS / "overlays" / "realnode")
    }

    assert set(real) == set(base)
    workloads = {key for key in real if key[0] in ("Deployment", "DaemonSet", "Job", "CronJob")}
    assert workloads == {
        key for key in WORKLOADS if key[0] not in ("Service", "PodDisruptionBudget")
    }
    for key in workloads:
        pod, base_pod = _pod_spec(real[key]), _pod_spec(base[key])
        assert pod["nodeSelector"].items() >= REAL_NODE.items(), key
        assert pod["securityContext"] == base_pod["securityContext"], key
        for container, base_container in zip(
            pod["containers"], base_pod["containers"], strict=True
        ):
            where = (*key, container["name"])
            assert container["imagePullPolicy"] == "Never", where  # imported, never pulled
            assert container["image"] == base_container["image"], where
            assert container["securityContext"] == base_container["securityContext"], where
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        if key[0] != "DaemonSet":  # the agent runs as uid 0 in base too (its manifest says why)
            assert pod["securityContext"]["runAsNonRoot"] is True, key
    # Everything else exactly as base: probes, resources, RBAC, the webhook configuration.
    assert {k: _without_pinning(o) for k, o in real.items()} == {
        k: _without_pinning(o) for k, o in base.items()
    }

    agent = _pod_spec(real[("DaemonSet", "headroom-agent")])
    args = build_parser().parse_args(agent["containers"][0]["args"])  # real flags only
    assert (args.backend, args.sim_processes, args.interval) == ("simulated", "host", 2.0)
    # The extender sidecar watches the lease its kube-scheduler elects a leader by.
    scheduler = _pod_spec(real[("Deployment", "headroom-scheduler")])
    (sidecar,) = [c for c in scheduler["containers"] if c["name"] == "extender"]
    config = real[("ConfigMap", "headroom-scheduler-config")]["data"]["scheduler-config.yaml"]
    election = yaml.safe_load(config)["leaderElection"]
    lease = f"{election['resourceNamespace']}/{election['resourceName']}"
    assert build_parser().parse_args(sidecar["args"]).leader_lease == lease
    (volume,) = [v for v in agent["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"]["path"] == "/var/lib/headroom/kubelet/pod-resources"
    # One node: both webhook replicas must fit on it for the PDB to allow a disruption.
    webhook = real[("Deployment", "headroom-webhook")]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(webhook)
    budget = real[("PodDisruptionBudget", "headroom-webhook")]["spec"]
    assert budget["minAvailable"] < webhook["spec"]["replicas"]
    scheduling = real[("Deployment", "headroom-scheduler")]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(scheduling)
    budget = real[("PodDisruptionBudget", "headroom-scheduler")]["spec"]
    assert budget["minAvailable"] < scheduling["spec"]["replicas"]


def test_cert_manager_overlay_replaces_the_certificates_job(cluster: Cluster) -> None:
    objects = _render(cluster, MANIFESTS / "overlays" / "cert-manager")
    keys = _keys(objects)

    assert ("Job", "headroom-certs") not in keys
    assert ("CronJob", "headroom-certs-renew") not in keys
    assert ("ServiceAccount", "headroom-certs") not in keys
    assert ("Certificate", "headroom-webhook") in keys
    configuration = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    annotations = configuration["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == "headroom-system/headroom-webhook"


def test_networkpolicy_component_fits_the_workloads(cluster: Cluster, tmp_path: Path) -> None:
    relative = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{relative}/base]\ncomponents: [{relative}/components/networkpolicy]\n"
    )
    objects = _render(cluster, tmp_path)
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    pods = {o["metadata"]["name"]: o["spec"]["template"] for o in workloads}

    assert policies.pop("headroom-default-deny-ingress")["spec"]["podSelector"] == {}
    for name, policy in policies.items():  # a renamed label or port must fail here
        selector, template = policy["spec"]["podSelector"]["matchLabels"], pods[name]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        containers = template["spec"]["containers"]
        ports = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} <= ports
    assert set(policies) == {"headroom-webhook", "headroom-scheduler", "headroom-agent"}
    manifest = "---\n".join(yaml.safe_dump(o) for o in policies.values())
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    assert applied.count("(server dry run)") == 3, applied


@pytest.mark.parametrize(
    ("account", "verb", "resource", "allowed"),
    [
        ("headroom-webhook", "watch", "gpusharingpolicies.headroom.dev", True),
        ("headroom-webhook", "get", "gpusharingpolicies.headroom.dev", False),  # lists only
        ("headroom-webhook", "list", "nodes", True),
        ("headroom-webhook", "get", "nodes", False),
        ("headroom-webhook", "get", "namespaces", True),  # one its watch has not shown yet
        ("headroom-webhook", "get", "pods", True),  # the pod the agent asks to evict
        ("headroom-webhook", "create", "pods", False),
        ("headroom-webhook", "get", "secrets", False),
        ("headroom-scheduler", "create", "pods --subresource=binding", True),
        ("headroom-scheduler", "update", "gpunodereports.headroom.dev", False),
        ("headroom-scheduler", "watch", "gpunodereports.headroom.dev", True),
        ("headroom-scheduler", "list", "gpusharingpolicies.headroom.dev", False),
        ("headroom-scheduler", "list", "secrets", False),
        ("headroom-agent", "create", "gpunodereports.headroom.dev", True),
        ("headroom-agent", "create", "pods --subresource=eviction", True),
        ("headroom-agent", "delete", "pods", True),  # its own node's: an admission policy
        ("headroom-agent", "update", "pods", False),
        ("headroom-agent", "list", "secrets", False),
        ("headroom-certs", "list", "secrets", False),
    ],
)
def test_rbac_grants_each_component_only_what_it_needs(
    cluster: Cluster, account: str, verb: str, resource: str, allowed: bool
) -> None:
    result = cluster.kubectl(
        "auth", "can-i", verb, *resource.split(), "-A", f"--as={SA}{account}", check=False
    )

    assert result.stdout.strip() == ("yes" if allowed else "no"), (account, verb, resource)
