"""The node agent evicts and deletes only pods on its own node (issue 7 §2), on the real
control plane.

The agent's ServiceAccount may create ``pods/eviction`` cluster-wide (RBAC cannot
say "on my node"), so with Headroom 0.1 the agent of one node, or whoever held
its token, could evict any pod anywhere. Its tokens are bound to its Node (the
local cluster issues them as the DaemonSet's projected tokens are), and the
webhook's ``agent-evictions.headroom.dev`` checks the evicted pod's node against
the token's ``authentication.kubernetes.io/node-name`` claim.
"""

import json
from typing import Any

from devcluster.cluster import Cluster
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import eventually, gpu_pod, pods, running

OWN, OTHER = "a100-shared-0", "a100-shared-1"


def pinned(namespace: str, name: str, node: str) -> dict[str, Any]:
    pod = gpu_pod(namespace, name, memory="2Gi")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def evict(cluster: Cluster, namespace: str, name: str) -> tuple[int, str]:
    """POST an Eviction for the pod as the agent of ``OWN`` (its node-bound token), with
    the pod's UID as its precondition, as the agent sends it."""
    agent = cluster.state.kubeconfigs / f"agent-{OWN}.kubeconfig"
    uid = cluster.kubectl_json("get", "pod", name, "-n", namespace)["metadata"]["uid"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    result = cluster.kubectl(
        f"--kubeconfig={agent}", "create", "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", "-f", "-",
        input=json.dumps(eviction), check=False,
    )  # fmt: skip
    return result.returncode, result.stderr + result.stdout


def test_the_agent_evicts_on_its_own_node_and_nowhere_else(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    cluster.apply([pinned(ns, "mine", OWN), pinned(ns, "theirs", OTHER)])
    eventually("both pods Running", lambda: len(running(pods(cluster, ns))) == 2, timeout=90)

    code, out = evict(cluster, ns, "theirs")
    assert code != 0, out
    assert f"agent on node {OWN} may evict only pods on its own node" in out, out
    assert f"pod {ns}/theirs is on node {OTHER}" in out, out

    code, out = evict(cluster, ns, "mine")
    assert code == 0, out
    eventually(
        "the evicted pod gone",
        lambda: [p["metadata"]["name"] for p in pods(cluster, ns)] == ["theirs"],
        timeout=60,
    )
    theirs = cluster.kubectl_json("get", "pod", "theirs", "-n", ns)
    assert not theirs["metadata"].get("deletionTimestamp")


def delete(cluster: Cluster, namespace: str, name: str) -> tuple[int, str]:
    """DELETE the pod as the agent of ``OWN``, as its guard does after a
    PodDisruptionBudget refused the eviction."""
    agent = cluster.state.kubeconfigs / f"agent-{OWN}.kubeconfig"
    result = cluster.kubectl(
        f"--kubeconfig={agent}", "delete", "pod", name, "-n", namespace, "--wait=false",
        check=False,
    )  # fmt: skip
    return result.returncode, result.stderr + result.stdout


def test_the_agent_deletes_on_its_own_node_and_nowhere_else(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # RBAC lets the agent delete pods anywhere; headroom-agent-own-node-pods does not.
    ns = namespace("gpu-shared")
    cluster.apply([pinned(ns, "mine", OWN), pinned(ns, "theirs", OTHER)])
    eventually("both pods Running", lambda: len(running(pods(cluster, ns))) == 2, timeout=90)

    code, out = delete(cluster, ns, "theirs")
    assert code != 0, out
    assert f"agent on node {OWN} may delete only pods on its own node" in out, out
    assert f"pod {ns}/theirs is on node {OTHER}" in out, out

    code, out = delete(cluster, ns, "mine")
    assert code == 0, out
    eventually(
        "the deleted pod gone",
        lambda: [p["metadata"]["name"] for p in pods(cluster, ns)] == ["theirs"],
        timeout=60,
    )
