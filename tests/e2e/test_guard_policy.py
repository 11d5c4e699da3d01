"""The guard acts by the namespace's policy, whatever the tenant writes on the pod.

Issue 7: "changing ``headroom.dev/policy`` on a pod switches the guard off". The
annotation is the tenant's to write (role ``edit``); the namespace's label is
not. Here a tenant in a ``guard: evict`` namespace points their pod's annotation
at a ``guard: off`` policy and then outgrows the declaration; the simulated
agent (its usage read from ``sim.headroom.dev/usage``) must still warn and evict.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.test_tenants import TENANT, as_tenant, create, tenant_of
from tests.e2e.workloads import eventually, gpu_pod, pods, running

EVICT, OFF = "e2e-guard-evict", "e2e-guard-off"


def shared_policy(name: str, guard: str) -> dict[str, Any]:
    """gpu-shared's placement, with the guard under test."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "mode": "shared",
            "defaultMemory": "4Gi",
            "maxMemory": "20Gi",
            "tolerations": [
                {
                    "key": "node-role.kubernetes.io/gpu",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            ],
            "nodeSelector": {"nvidia.com/gpu.sharing-strategy": "time-slicing"},
            "guard": guard,
        },
    }


@pytest.fixture
def guard_policies(cluster: Cluster) -> Iterator[None]:
    cluster.apply([shared_policy(EVICT, "evict"), shared_policy(OFF, "off")])
    yield
    cluster.kubectl("delete", names.POLICY_PLURAL, EVICT, OFF, "--ignore-not-found")


def usage(base: str) -> str:
    return json.dumps({"pattern": "steady", "base": base})


def webhook_applies(cluster: Cluster, pod: dict[str, Any]) -> bool:
    """The webhook learns of a new policy by its watch: a server-side dry run tells."""
    result = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(pod), check=False,
    )  # fmt: skip
    if result.returncode != 0:
        return False
    annotations = json.loads(result.stdout)["metadata"].get("annotations") or {}
    return bool(annotations.get(names.ANNOTATION_POLICY) == EVICT)


def guard_events(cluster: Cluster, namespace: str) -> list[str]:
    events = cluster.kubectl_json(
        "get", "events", "-n", namespace,
        "--field-selector", f"reason={names.EVENT_REASON_OVER_MEMORY}",
    )["items"]  # fmt: skip
    return [str(e.get("message", "")) for e in events]


def test_a_tenant_cannot_switch_the_guard_off_from_the_pod(
    cluster: Cluster, namespace: NamespaceFactory, guard_policies: None
) -> None:
    ns = namespace(EVICT)
    tenant_of(cluster, ns)
    hog = gpu_pod(ns, "hog", memory="4Gi")
    hog["metadata"]["annotations"][names.ANNOTATION_SIMULATED_USAGE] = usage("2Gi")
    eventually(f"the webhook to know policy {EVICT}", lambda: webhook_applies(cluster, hog))
    code, out = create(cluster, hog, f"--as={TENANT}")
    assert code == 0, out
    pod = cluster.kubectl_json("get", "pod", "hog", "-n", ns)
    assert pod["metadata"]["annotations"][names.ANNOTATION_POLICY] == EVICT
    eventually("the pod Running", lambda: len(running(pods(cluster, ns))) == 1)

    # One MODIFIED event: the policy annotation now names guard: off, and the pod
    # holds 8Gi of its declared 4Gi. Both are the tenant's to write.
    code, out = as_tenant(
        cluster, "annotate", "pod", "hog", "-n", ns, "--overwrite",
        f"{names.ANNOTATION_POLICY}={OFF}",
        f"{names.ANNOTATION_SIMULATED_USAGE}={usage('8Gi')}",
    )  # fmt: skip
    assert code == 0, out

    eventually(
        "the guard to warn and evict per the namespace's policy",
        lambda: any("policy guard is evict: evicting" in m for m in guard_events(cluster, ns)),
        timeout=60,
        explain=lambda: f"events: {guard_events(cluster, ns)}",
    )
    eventually("the evicted pod gone", lambda: pods(cluster, ns) == [], timeout=60)


@pytest.mark.parametrize("budgets", [1, 2], ids=["one-pdb", "two-pdbs"])
def test_a_tenants_pdb_does_not_switch_the_guard_off(
    cluster: Cluster, namespace: NamespaceFactory, guard_policies: None, budgets: int
) -> None:
    # The guard evicts through the Eviction API, which honours PodDisruptionBudgets,
    # and the edit role may write them: a tenant covers their pod with
    # maxUnavailable: 0 and then outgrows the declaration. The eviction is refused,
    # and the agent deletes the pod instead. With two budgets over the pod,
    # kube-apiserver refuses every eviction with a 500 ("more than one
    # PodDisruptionBudget"), not a 429: the agent took it for an API error and
    # retried the eviction for ever, never deleting.
    ns = namespace(EVICT)
    tenant_of(cluster, ns)
    hog = gpu_pod(ns, "hog", memory="4Gi", labels={"app": "hog"})
    hog["metadata"]["annotations"][names.ANNOTATION_SIMULATED_USAGE] = usage("2Gi")
    eventually(f"the webhook to know policy {EVICT}", lambda: webhook_applies(cluster, hog))
    code, out = create(cluster, hog, f"--as={TENANT}")
    assert code == 0, out
    eventually("the pod Running", lambda: len(running(pods(cluster, ns))) == 1)
    for i in range(budgets):
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": f"keep-hog-{i}", "namespace": ns},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "hog"}}},
        }
        code, out = as_tenant(cluster, "create", "-f", "-", input=json.dumps(pdb))
        assert code == 0, out
    code, out = as_tenant(
        cluster, "annotate", "pod", "hog", "-n", ns, "--overwrite",
        f"{names.ANNOTATION_SIMULATED_USAGE}={usage('8Gi')}",
    )  # fmt: skip
    assert code == 0, out

    eventually(
        "the guard to decide to evict",
        lambda: any("policy guard is evict: evicting" in m for m in guard_events(cluster, ns)),
        timeout=60,
        explain=lambda: f"events: {guard_events(cluster, ns)}",
    )
    eventually(
        "the over-declared pod gone despite the tenant's PodDisruptionBudget",
        lambda: pods(cluster, ns) == [],
        timeout=60,
        explain=lambda: f"pods: {[p['metadata']['name'] for p in pods(cluster, ns)]}",
    )
