"""What manifests/base needs on a real cluster that the local cluster cannot show.

``headroom cluster up`` runs Headroom's processes on the host, applies the CRDs
before everything else (devcluster/components.py, devcluster/incluster.py) and
has no other GPU taints, no PriorityClasses competing with Headroom's pods and
no Konnectivity. These read the manifests and the install instructions as a
platform engineer would follow them.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.quantity import parse_bytes

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "manifests/base"
POLICIES = sorted((BASE / "policies").glob("*.yaml"))


def _load(relative: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / relative).read_text())
    return document


def _pod_spec(relative: str) -> dict[str, Any]:
    spec: dict[str, Any] = _load(relative)["spec"]["template"]["spec"]
    return spec


def test_every_long_running_component_outranks_tenant_pods() -> None:
    # The webhook's failurePolicy is Fail: preempted by a tenant's higher-priority
    # pod, or evicted first under node pressure, it refuses every GPU pod in policy
    # namespaces (and every agent eviction) until it is back.
    assert _pod_spec("manifests/base/webhook/deployment.yaml")["priorityClassName"] == (
        "system-cluster-critical"
    )
    assert _pod_spec("manifests/base/scheduler/deployment.yaml")["priorityClassName"] == (
        "system-cluster-critical"
    )
    assert _pod_spec("manifests/base/agent/daemonset.yaml")["priorityClassName"] == (
        "system-node-critical"
    )


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint, for the fields the manifests use."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def test_the_agent_runs_on_every_gpu_node_whatever_its_taints() -> None:
    tolerations = _pod_spec("manifests/base/agent/daemonset.yaml")["tolerations"]
    taints = [
        # GKE's GPU node pools, the local cluster's, AKS's documented GPU pool taint,
        # a team-dedicated pool, and a NoExecute dedication.
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/gpu", "value": "true", "effect": "NoSchedule"},
        {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"},
    ]
    # Whatever a shipped policy lets tenant pods past, the agent gets past too:
    # a shared pod on a node with no agent has no report and no guard.
    for path in POLICIES:
        for toleration in yaml.safe_load(path.read_text())["spec"].get("tolerations", []):
            taints.append({k: toleration.get(k) for k in ("key", "value", "effect")})
    for taint in taints:
        assert any(_tolerates(t, taint) for t in tolerations), taint


def _deploy_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Deploying to a cluster")
    return readme[start : readme.index("\n## ", start + 1)]


def _ordered_commands(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if re.match(r"\s*kubectl\b.*\b(apply|wait)\b", line)
    ]


def _crds_before_kustomize(commands: list[str]) -> None:
    """One ``kubectl apply -k`` of manifests/base cannot create the CRDs and the
    GPUSharingPolicies in it: kubectl maps every object's kind before it sends
    any ("no matches for kind GPUSharingPolicy ... ensure CRDs are installed
    first"), so the CRDs are applied and Established first."""
    kustomize = next(i for i, c in enumerate(commands) if " -k " in f"{c} ")
    crds = next(i for i, c in enumerate(commands) if "apply" in c and "manifests/base/crds/" in c)
    wait = next(i for i, c in enumerate(commands) if "condition=Established" in c)
    assert crds < wait < kustomize, commands


def test_the_base_creates_policies_of_the_crds_it_installs() -> None:
    kustomization = _load("manifests/base/kustomization.yaml")
    resources = kustomization["resources"]
    assert any(r.startswith("crds/") for r in resources)
    kinds = {yaml.safe_load((BASE / r).read_text())["kind"] for r in resources if "policies/" in r}
    assert kinds == {"GPUSharingPolicy"}  # so the instructions below must split the apply


def test_the_readme_applies_the_crds_before_the_kustomization() -> None:
    _crds_before_kustomize(_ordered_commands(_deploy_section()))


def test_kind_up_applies_the_crds_before_the_kustomization() -> None:
    script = (ROOT / "hack/kind-up.sh").read_text()
    _crds_before_kustomize(_ordered_commands(script.replace('"$root/', "")))


def test_the_readme_points_the_manifests_at_an_image_the_user_pushed() -> None:
    # No image is published: the manifests' ghcr.io name pulls nothing on a real
    # cluster's nodes (kind loads it by hand, the real node imports it).
    section = _deploy_section()
    assert "docker push" in section
    assert "newName:" in section
    assert "ghcr.io/headroom-dev/headroom" in section


def test_the_webhook_network_policy_admits_the_apiserver_through_konnectivity() -> None:
    documents = yaml.safe_load_all(
        (ROOT / "manifests/components/networkpolicy/networkpolicies.yaml").read_text()
    )
    (policy,) = [d for d in documents if d["metadata"]["name"] == "headroom-webhook"]
    peers = policy["spec"]["ingress"][0]["from"]
    assert "ipBlock" in peers[0]  # the README's patch path: /spec/ingress/0/from/0/ipBlock/cidr
    konnectivity = [
        p["podSelector"]["matchLabels"]
        for p in peers
        if p.get("namespaceSelector", {}).get("matchLabels")
        == {"kubernetes.io/metadata.name": "kube-system"}
    ]
    # AKS labels its agents app=konnectivity-agent, GKE k8s-app=konnectivity-agent.
    assert {"app": "konnectivity-agent"} in konnectivity
    assert {"k8s-app": "konnectivity-agent"} in konnectivity


def test_docs_kind_leaves_headroom_schedulable_on_kinds_only_node() -> None:
    # hack/kind-up.sh creates kind's default cluster: one node. docs/kind.md then makes
    # that node the fake GPU node; a NoSchedule taint there (as the seeds' GPU nodes
    # carry) once left the certificates CronJob, and any webhook or scheduler
    # pod recreated by a rollout or an eviction, Pending for good.
    assert "--config" not in (ROOT / "hack/kind-up.sh").read_text()  # one node
    guide = (ROOT / "docs/kind.md").read_text()
    taints = [
        {"key": key, "value": value, "effect": effect}
        for key, value, effect in re.findall(
            r"kubectl taint node \S+ ([^=\s]+)=(\S*):(NoSchedule|NoExecute)", guide
        )
    ]
    workloads = {
        "webhook/deployment.yaml": ("spec", "template"),
        "scheduler/deployment.yaml": ("spec", "template"),
        "certificates/job.yaml": ("spec", "template"),
        "certificates/cronjob.yaml": ("spec", "jobTemplate", "spec", "template"),
    }
    for relative, path in workloads.items():
        template: Any = _load(f"manifests/base/{relative}")
        for key in path:
            template = template[key]
        tolerations = template["spec"].get("tolerations") or []
        for taint in taints:
            assert any(_tolerates(t, taint) for t in tolerations), (relative, taint)


def _base_objects() -> list[dict[str, Any]]:
    """Every object manifests/base installs (its kustomization's resources, as written)."""
    objects: list[dict[str, Any]] = []
    for relative in _load("manifests/base/kustomization.yaml")["resources"]:
        objects += [d for d in yaml.safe_load_all((BASE / relative).read_text()) if d]
    return objects


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's matchLabels (the only part the manifests use) over ``labels``."""
    assert set(selector) <= {"matchLabels"}, selector
    return bool(selector.get("matchLabels")) and labels.items() >= selector["matchLabels"].items()


def test_a_drain_never_evicts_every_replica_of_a_component_at_once() -> None:
    # `kubectl drain` evicts every pod of the node at once (one goroutine per pod,
    # kubectl/pkg/drain), and the Eviction API lets each through unless a
    # PodDisruptionBudget says no. Anti-affinity is only preferred, so both replicas
    # of a Deployment may share the node being drained (or two nodes drained
    # together, as node-pool upgrades and the cluster autoscaler do): without a
    # budget, every replica goes at once. For headroom-scheduler that stops the
    # scheduling of every shared GPU pod until a new pod is scheduled, started,
    # and its extender has waited out the old leader's binds.
    objects = _base_objects()
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        replicas = deployment["spec"].get("replicas", 1)
        if replicas < 2:
            continue
        namespace = deployment["metadata"]["namespace"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [
            b["spec"]
            for b in budgets
            if b["metadata"]["namespace"] == namespace and _selects(b["spec"]["selector"], labels)
        ]
        name = deployment["metadata"]["name"]
        assert len(covering) == 1, (name, covering)  # two budgets: every eviction is a 500
        (budget,) = covering
        if "minAvailable" in budget:
            assert 1 <= budget["minAvailable"] < replicas, (name, budget)
        else:
            assert 1 <= budget["maxUnavailable"] < replicas, (name, budget)


CRITICAL = ("system-node-critical", "system-cluster-critical")


def test_critical_priority_pods_are_admitted_where_quota_limits_them_to_kube_system() -> None:
    # GKE (and kube-up's GCE clusters: cluster/gce/gci/configure-helper.sh) configure
    # the ResourceQuota admission plugin with limitedResources for pods whose
    # PriorityClass is system-node-critical or system-cluster-critical: such a pod is
    # refused ("insufficient quota to match these scopes", apiserver
    # pkg/admission/plugin/resourcequota/controller.go CheckRequest) in any
    # namespace with no ResourceQuota whose scopeSelector covers its class. There the
    # webhook would never run (failurePolicy Fail: every GPU pod in policy
    # namespaces refused), nor the scheduler or the agent.
    objects = _base_objects()
    quotas = [o for o in objects if o["kind"] == "ResourceQuota"]
    for workload in (o for o in objects if o["kind"] in ("Deployment", "DaemonSet")):
        priority = workload["spec"]["template"]["spec"].get("priorityClassName")
        namespace = workload["metadata"]["namespace"]
        if priority not in CRITICAL or namespace == "kube-system":
            continue
        covering = [
            q["spec"]
            for q in quotas
            if q["metadata"]["namespace"] == namespace
            and any(
                e["scopeName"] == "PriorityClass"
                and e["operator"] == "In"
                and priority in e.get("values", [])
                for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", [])
            )
        ]
        assert covering, (workload["metadata"]["name"], priority)
        for quota in covering:
            # Room for an agent on every GPU node and for the rollouts' surge pods:
            # a quota that runs out refuses them just the same.
            assert set(quota["hard"]) == {"pods"}, quota
            assert _count(quota["hard"]["pods"]) >= 100_000, quota


def _count(quantity: str) -> int:
    suffixes = {"k": 10**3, "M": 10**6, "G": 10**9}
    return (
        int(quantity[:-1]) * suffixes[quantity[-1]] if quantity[-1] in suffixes else int(quantity)
    )


_AGENT_FLOOR = """
import cli.main, agent.service, agent.nvml, agent.podresources
from kubernetes import client
api = client.ApiClient(client.Configuration())
client.CoreV1Api(api), client.CustomObjectsApi(api)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]) * 1024)
"""


def test_the_agent_requests_at_least_the_memory_it_holds_before_its_first_report() -> None:
    # The DaemonSet runs on every GPU node: a request below what the agent always
    # holds makes the scheduler count that much less of each node than is used.
    # Its floor: the imports `headroom agent` makes (the official Kubernetes
    # client, gRPC for kubelet's PodResources, aiohttp, pydantic) and its API
    # clients, before any cache, measured here as bench/memory_bench.py does.
    pytest.importorskip("grpc")
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc")
    floor = int(
        subprocess.run(
            [sys.executable, "-c", _AGENT_FLOOR],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    (container,) = _pod_spec("manifests/base/agent/daemonset.yaml")["containers"]
    request = parse_bytes(container["resources"]["requests"]["memory"])
    limit = parse_bytes(container["resources"]["limits"]["memory"])
    assert floor <= request < limit, (floor / 2**20, request / 2**20)


def test_a_stopping_webhook_keeps_answering_until_its_endpoint_is_withdrawn() -> None:
    # kube-apiserver calls the webhook through its Service, and a Terminating pod
    # leaves the endpoints only once the EndpointSlice controller and the proxy have
    # caught up; the apiserver does not retry a webhook call, so a pod it sends to a
    # replica that stopped listening is refused. kubelet runs preStop before SIGTERM,
    # and the webhook serves normally through it (then 2 s more after SIGTERM).
    spec = _pod_spec("manifests/base/webhook/deployment.yaml")
    (container,) = spec["containers"]
    sleep = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    assert sleep.get("seconds", 0) >= 5, container.get("lifecycle")
    assert sleep["seconds"] + 5 < spec.get("terminationGracePeriodSeconds", 30)
