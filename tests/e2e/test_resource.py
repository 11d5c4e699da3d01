"""Declared memory is a resource: a pod without it (Headroom 0.1's) is never placed on a guess.

The rest of issue 7 §1 on the real control plane (patched annotations, the
immutable resource, quotas, node capacity, a bound legacy pod's charge) is in
test_tenants.py.
"""

import yaml

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import eventually, failed_scheduling, legacy_pod, pods


def test_a_pending_legacy_pod_is_refused_with_the_fix(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # Only an admin's exempt namespace can still create such a pod; on 0.1 it
    # would have been placed on its 1Mi annotation.
    ns = namespace()
    cluster.kubectl("label", "namespace", ns, f"{names.LABEL_EXEMPT}=true")
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(legacy_pod(ns, "old")))
    eventually(
        "a FailedScheduling event for the legacy pod",
        lambda: "old" in failed_scheduling(cluster, ns),
        timeout=120,
    )
    reason = failed_scheduling(cluster, ns)["old"]
    assert "legacy pod" in reason, reason
    assert "rollout restart" in reason, reason
    assert not any(p["spec"].get("nodeName") for p in pods(cluster, ns))
