"""The real node: kubelet, containerd and runc on this machine, in a bare cluster of its own.

One cluster for the module (kubelet's first start is the slow part); the last
test takes it down and checks that nothing is left on the machine. Skipped, with
the reason, where containers cannot run (not root, no runtime, no cgroups).
"""

import ipaddress
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import cgroups
from devcluster import binaries, nodehost, realnode
from devcluster.cluster import Cluster, down, up
from devcluster.kubectl import Kubectl, wait_until
from devcluster.state import ClusterState, free_port


def _progress(message: str) -> None:
    print(f"[e2e real node] {message}", file=sys.stderr, flush=True)


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = realnode.available()
    if reason:
        pytest.skip(reason)
    absent = binaries.missing() + realnode.node_binaries().missing()
    if absent:
        _skip_or_fail(
            f"not built: {', '.join(absent)}; run {binaries.BUILD_SCRIPT} and "
            f"{realnode.BUILD_SCRIPT}"
        )
    state_dir: Path = tmp_path_factory.mktemp("realnode")
    try:
        yield up(
            state_dir=state_dir, headroom=False, build=False, real_node=True, progress=_progress
        )
    finally:
        down(state_dir, progress=_progress)


@pytest.fixture(scope="module")
def pause_pod(node_cluster: Cluster) -> dict[str, Any]:
    """A pause pod on gpu-real-0, Running."""
    node_cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pause-real", "namespace": "default"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": realnode.NODE_NAME},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "pause",
                            "image": realnode.PAUSE_IMAGE,
                            "imagePullPolicy": "Never",
                            # A host port makes the portmap plugin add rules for down to remove.
                            "ports": [{"containerPort": 8080, "hostPort": free_port()}],
                        }
                    ],
                },
            }
        ]
    )

    def running() -> bool:
        pod = node_cluster.kubectl_json("get", "pod", "pause-real", "-n", "default")
        return bool(pod["status"].get("phase") == "Running")

    try:
        wait_until("the pause pod to run", running, timeout=60)
    except TimeoutError:
        described = node_cluster.kubectl("describe", "pod", "pause-real", check=False).stdout
        raise AssertionError(f"pause-real not Running:\n{described}") from None
    pod: dict[str, Any] = node_cluster.kubectl_json("get", "pod", "pause-real", "-n", "default")
    return pod


def test_node_is_ready_with_the_seed_labels_and_a_bridge_address(node_cluster: Cluster) -> None:
    node = node_cluster.kubectl_json("get", "node", realnode.NODE_NAME)

    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    labels = node["metadata"]["labels"]
    assert labels["headroom.dev/real-node"] == "true"
    assert labels["nvidia.com/gpu.product"] == "A100-PCIE-40GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == realnode.NODE_IP
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == binaries.KUBERNETES_VERSION


def _patch_as_kubelet(cluster: Cluster, node: str) -> tuple[int, str]:
    """PATCH a label onto ``node`` with kubelet's client certificate. A PATCH needs no
    read first (kubectl's would GET), so it passes the Node authorizer and meets
    NodeRestriction, the admission plugin under test."""
    pki = cluster.state.pki
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "kubelet.crt"), str(pki / "kubelet.key"))
    request = urllib.request.Request(
        f"{cluster.server}/api/v1/nodes/{node}",
        data=b'{"metadata": {"labels": {"e2e/patched": "yes"}}}',
        method="PATCH",
        headers={"Content-Type": "application/merge-patch+json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_kubelet_credentials_cannot_modify_another_node(node_cluster: Cluster) -> None:
    other = node_cluster.state.nodes[0]
    as_kubelet = Kubectl(
        node_cluster.bins / "kubectl", node_cluster.state.kubeconfigs / "kubelet.kubeconfig"
    )

    own_status, _ = _patch_as_kubelet(node_cluster, realnode.NODE_NAME)
    foreign_status, foreign = _patch_as_kubelet(node_cluster, other)
    read = as_kubelet("get", "node", other, check=False)

    assert own_status == 200
    assert foreign_status == 403
    message = json.loads(foreign)["message"]
    assert f'node "{realnode.NODE_NAME}" is not allowed to modify node "{other}"' in message
    assert read.returncode != 0
    assert "Forbidden" in read.stderr


def test_a_pod_runs_on_the_real_node_with_a_bridge_ip(pause_pod: dict[str, Any]) -> None:
    assert pause_pod["spec"]["nodeName"] == realnode.NODE_NAME
    pod_ip = ipaddress.ip_address(pause_pod["status"]["podIP"])
    assert pod_ip in ipaddress.ip_network(realnode.POD_SUBNET)
    assert pod_ip != ipaddress.ip_address(realnode.NODE_IP)
    assert pause_pod["status"]["containerStatuses"][0]["ready"] is True


def test_apiserver_reaches_kubelet_for_logs(
    node_cluster: Cluster, pause_pod: dict[str, Any]
) -> None:
    # pause writes nothing; what matters is that the apiserver reached kubelet at the
    # node's address, authenticated, and kubelet authorized it through the apiserver.
    logs = node_cluster.kubectl("logs", "pause-real", "-n", "default", check=False)

    assert logs.returncode == 0, logs.stderr


def _container_id(pod: dict[str, Any]) -> str:
    container_id: str = pod["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("containerd://")
    return container_id.removeprefix("containerd://")


def _host_pids() -> dict[str, int]:
    """containerd's task ID -> the task's host pid."""
    tasks = realnode.ctr("tasks", "ls").stdout.splitlines()[1:]
    return {words[0]: int(words[1]) for words in (line.split() for line in tasks)}


def test_agent_maps_the_containers_host_pid_to_its_pod(pause_pod: dict[str, Any]) -> None:
    container_id = _container_id(pause_pod)

    found = cgroups.container_of_pid(_host_pids()[container_id])

    assert found == cgroups.ContainerRef(pause_pod["metadata"]["uid"], container_id)


def test_a_pod_reaches_the_apiserver_through_the_kubernetes_service(
    node_cluster: Cluster, pause_pod: dict[str, Any]
) -> None:
    # No client image is needed: this Python runs in the pod's network namespace
    # (nsenter), which is where a pod's connections start.
    ca = node_cluster.state.pki / "ca.crt"
    client = (
        "import ssl, urllib.request; "
        f"context = ssl.create_default_context(cafile={str(ca)!r}); "
        f"print(urllib.request.urlopen('https://{realnode.KUBERNETES_SERVICE_IP}/version', "
        "context=context, timeout=5).read().decode())"
    )
    pid = _host_pids()[_container_id(pause_pod)]

    result = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", client],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gitVersion"] == binaries.KUBERNETES_VERSION


def test_a_second_cluster_cannot_take_the_node(node_cluster: Cluster, tmp_path: Path) -> None:
    with pytest.raises(realnode.RealNodeError, match="already runs on this machine"):
        realnode.preflight(tmp_path, _progress, build=False)
    with pytest.raises(realnode.RealNodeError, match="already runs on this machine"):
        realnode.claim(ClusterState(tmp_path), _progress)
    assert nodehost.link_exists(realnode.BRIDGE)


def test_down_leaves_nothing_behind(node_cluster: Cluster, pause_pod: dict[str, Any]) -> None:
    assert nodehost.pod_processes(), "the pause pod's processes should be in kubepods"
    assert "CNI-HOSTPORT" in nodehost.run("iptables-save").stdout

    assert down(node_cluster.state.directory, progress=_progress)

    assert nodehost.mounts_under([realnode.ROOT, realnode.RUN]) == []
    assert nodehost.node_processes([realnode.ROOT, realnode.RUN]) == set()
    assert nodehost.shims(realnode.CONTAINERD_SOCKET) == {}
    assert nodehost.pod_processes() == set()
    assert nodehost.pod_netns(realnode.POD_SUBNET) == []
    assert not nodehost.link_exists(realnode.BRIDGE)
    rules = nodehost.run("iptables-save").stdout
    assert nodehost.RULE_COMMENT not in rules
    assert "CNI-" not in rules
    assert "KUBE-" not in rules
    results = nodehost.CNI_RESULTS
    cached = list(results.iterdir()) if results.is_dir() else []
    assert [p.name for p in cached if str(realnode.RUN) in p.read_text()] == []
    assert not realnode.ROOT.exists()
    assert not realnode.RUN.exists()
