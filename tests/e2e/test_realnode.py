"""The real node: kubelet, containerd and runc on this machine, in a bare cluster of its own.

One cluster for the module (kubelet's first start is the slow part); the last
test takes it down and checks that nothing is left on the machine. Skipped, with
the reason, where containers cannot run (not root, no runtime, no cgroups).
"""

import ipaddress
import json
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
from agent.gpuspec import simulated_gpu_uuid
from devcluster import binaries, images, incluster, nodehost, realnode
from devcluster.cluster import Cluster, down, up
from devcluster.kubectl import Kubectl, wait_until
from devcluster.state import ClusterState, free_port
from tests.e2e.outcomes import progress, skip_or_fail

_progress = progress("e2e real node")


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = realnode.available()
    if reason:
        pytest.skip(reason)
    absent = binaries.missing() + realnode.node_binaries().missing()
    if absent:
        skip_or_fail(
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


def _request(
    cluster: Cluster, identity: str, method: str, path: str, body: dict[str, Any], content: str
) -> tuple[int, str]:
    """One request to the apiserver with ``identity``'s client certificate (in the
    cluster's pki), its status and body, errors included."""
    pki = cluster.state.pki
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / f"{identity}.crt"), str(pki / f"{identity}.key"))
    request = urllib.request.Request(
        f"{cluster.server}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": content},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _patch_as_kubelet(cluster: Cluster, node: str) -> tuple[int, str]:
    """PATCH a label onto ``node`` with kubelet's client certificate. A PATCH needs no
    read first (kubectl's would GET), so it passes the Node authorizer and meets
    NodeRestriction, the admission plugin under test."""
    body = {"metadata": {"labels": {"e2e/patched": "yes"}}}
    return _request(
        cluster, "kubelet", "PATCH", f"/api/v1/nodes/{node}", body, "application/merge-patch+json"
    )


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


# --- Headroom in the cluster: manifests/overlays/realnode on the real node ---------


@pytest.fixture(scope="module")
def in_cluster(node_cluster: Cluster) -> Cluster:
    """manifests/base (through the realnode overlay) installed server-side and serving
    from gpu-real-0: the certificates Job, the webhook behind its Service, the
    scheduler Deployment with the extender sidecar, the agent DaemonSet."""
    archives = images.ensure(_progress)
    realnode.load_images(archives.values(), _progress)
    incluster.install(node_cluster, realnode.NODE_NAME, _progress)
    return node_cluster


def _headroom_pods(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("get", "pods", "-n", incluster.NAMESPACE)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def test_every_component_runs_from_the_image_as_written(in_cluster: Cluster) -> None:
    """The webhook, kube-scheduler + extender and agent pods run on the real node from
    the local images, with base's securityContext (non-root uid 10001 but the agent,
    read-only root filesystem) in force, and every container ready (its probes pass)."""
    pods = _headroom_pods(in_cluster)
    by_component = {p["metadata"]["labels"].get("app.kubernetes.io/name"): p for p in pods}
    assert {"headroom-webhook", "headroom-scheduler", "headroom-agent"} <= set(by_component)
    for pod in pods:
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME
        for status in pod["status"]["containerStatuses"]:
            assert status["ready"], (pod["metadata"]["name"], status)
            assert status["imageID"], status  # kubelet ran it from containerd's store
        for container in pod["spec"]["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Not just declared: kubelet runs the webhook's process as uid 10001 (its /proc
    # status says so), and its root filesystem is mounted read-only.
    webhook = by_component["headroom-webhook"]
    pid = _container_pid(webhook, "webhook")
    uids = next(
        line.split()[1:]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert set(uids) == {"10001"}
    root_options = next(
        line.split()[5]
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )
    assert "ro" in root_options.split(","), root_options
    # The certificates Job ran to completion from the same image.
    job = in_cluster.kubectl_json(
        "get", "job", incluster.CERTIFICATES_JOB, "-n", incluster.NAMESPACE
    )
    assert job["status"].get("succeeded") == 1


def test_the_webhooks_disruption_budget_holds_on_eviction(in_cluster: Cluster) -> None:
    """The PDB as written (minAvailable 1 of 2 replicas): a drain may evict one
    webhook pod, and the eviction API refuses the second until a replacement is
    ready, so admission never loses its last replica to a drain."""
    selector = "app.kubernetes.io/name=headroom-webhook"
    pods = in_cluster.kubectl_json("get", "pods", "-n", incluster.NAMESPACE, "-l", selector)
    names = sorted(p["metadata"]["name"] for p in pods["items"])
    assert len(names) == 2
    first, second = (_evict(in_cluster, name) for name in names)
    assert first[0] == 201, first
    assert second[0] == 429, second
    assert "disruption budget" in second[1]
    wait_until(
        "the webhook Deployment to be available again",
        lambda: incluster._deployment_available(in_cluster, "headroom-webhook"),
        timeout=120,
    )


def _evict(cluster: Cluster, name: str) -> tuple[int, str]:
    """POST an Eviction for ``name`` as the admin, as ``kubectl drain`` does."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": incluster.NAMESPACE},
    }
    path = f"/api/v1/namespaces/{incluster.NAMESPACE}/pods/{name}/eviction"
    return _request(cluster, "admin", "POST", path, body, "application/json")


def _container_pid(pod: dict[str, Any], container: str) -> int:
    """The host pid of ``container``'s first process, found through its cgroup."""
    cid = next(
        s["containerID"].split("://", 1)[1]
        for s in pod["status"]["containerStatuses"]
        if s["name"] == container
    )
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cgroup").read_text()
        except OSError:
            continue
        if cid in text:
            return int(entry.name)
    raise AssertionError(f"no process in {container}'s cgroup ({cid[:12]})")


def _gpu_pod(name: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"headroom.dev/gpu-memory": memory}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            # The KWOK nodes share GPUs by time-slicing too; this pod is for the real one.
            "nodeSelector": {"headroom.dev/real-node": "true"},
            "containers": [
                {
                    "name": "main",
                    "image": realnode.PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }


def test_gpu_pod_admitted_scheduled_allocated_and_located(in_cluster: Cluster) -> None:
    """One GPU pod through every real hop: the webhook Deployment (via its Service)
    rewrites it, the in-cluster headroom-scheduler binds it through the extender,
    kubelet allocates a replica from the device plugin, PodResources tells the agent,
    and the node's report shows its memory on that GPU, found from its real pid."""
    kubectl = in_cluster.kubectl
    namespace = "tenant-real"
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "headroom.dev/policy=gpu-shared")
    try:
        kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_gpu_pod("train", "8Gi")))
        pod = in_cluster.kubectl_json("get", "pod", "train", "-n", namespace)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits.get("nvidia.com/gpu.shared") == "1"
        assert "nvidia.com/gpu" not in limits
        assert pod["spec"]["schedulerName"] == "headroom-scheduler"

        def running() -> bool:
            current = in_cluster.kubectl_json("get", "pod", "train", "-n", namespace)
            return bool(current["status"].get("phase") == "Running")

        wait_until("the GPU pod to run on the real node", running, timeout=90)
        pod = in_cluster.kubectl_json("get", "pod", "train", "-n", namespace)
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME
        # Bound by the in-cluster scheduler, whose events carry its profile's name.
        events = in_cluster.kubectl_json(
            "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=train"
        )["items"]
        scheduled = [e for e in events if e["reason"] == "Scheduled"]
        reporters = {
            e.get("reportingComponent") or e.get("source", {}).get("component") for e in scheduled
        }
        assert reporters == {"headroom-scheduler"}, scheduled
        uid = pod["metadata"]["uid"]
        gpu = simulated_gpu_uuid(realnode.NODE_NAME, 0)

        def located() -> dict[str, Any] | None:
            report = in_cluster.kubectl_json("get", "gpunodereport", realnode.NODE_NAME)
            for usage in report["status"].get("gpus", []):
                for entry in usage.get("pods", []):
                    if entry["uid"] == uid and usage["uuid"] == gpu and entry.get("usedBytes"):
                        return dict(entry)
            return None

        wait_until(
            "the report to show the pod's memory on its GPU",
            lambda: located() is not None,
            timeout=60,
        )
        entry = located()
        assert entry is not None
        assert entry["allocated"] is True  # kubelet's PodResources answer
        assert entry["containers"] == ["main"]  # pid -> containerd's cgroup -> container
        assert entry["usedBytes"] == 8 * 2**30
    finally:
        # Gone before the next test counts the node's replicas.
        kubectl("delete", "namespace", namespace, "--timeout=90s", check=False, timeout=120)


def test_a_pod_of_two_replicas_is_reported_holding_both(in_cluster: Cluster) -> None:
    """A pod whose two containers each ask for a shared GPU holds two replicas:
    kubelet allocates one per container from the device plugin, PodResources lists
    both IDs (``GPU-<uuid>::<n>``), and the agent reports the pod once on that GPU
    with ``replicas: 2``, the count the extender locates a pod of several replicas
    by (agent.allocations.replicas_by_gpu; unit-tested on plain data, here through
    a real kubelet)."""
    kubectl = in_cluster.kubectl
    namespace = "tenant-pair"
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "headroom.dev/policy=gpu-shared")
    try:
        pod = _gpu_pod("pair", "2Gi")
        main = pod["spec"]["containers"][0]
        pod["spec"]["containers"].append({**main, "name": "helper"})
        kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))
        created = in_cluster.kubectl_json("get", "pod", "pair", "-n", namespace)
        shared = [
            c["resources"]["limits"].get("nvidia.com/gpu.shared")
            for c in created["spec"]["containers"]
        ]
        assert shared == ["1", "1"]

        def running() -> bool:
            current = in_cluster.kubectl_json("get", "pod", "pair", "-n", namespace)
            return bool(current["status"].get("phase") == "Running")

        wait_until("the two-replica pod to run on the real node", running, timeout=90)
        uid = created["metadata"]["uid"]
        gpu = simulated_gpu_uuid(realnode.NODE_NAME, 0)

        def entries() -> list[dict[str, Any]]:
            report = in_cluster.kubectl_json("get", "gpunodereport", realnode.NODE_NAME)
            return [
                dict(entry, gpu=usage["uuid"])
                for usage in report["status"].get("gpus", [])
                for entry in usage.get("pods", [])
                if entry["uid"] == uid
            ]

        wait_until(
            "the report to count the pod's replicas",
            lambda: any(e.get("replicas") for e in entries()),
            timeout=60,
        )
        listed = entries()
        assert len(listed) == 1, listed  # one GPU on this node: both replicas on it
        entry = listed[0]
        assert entry["gpu"] == gpu
        assert entry["allocated"] is True
        assert entry["replicas"] == 2, entry
    finally:
        # Gone before the next test counts the node's replicas.
        kubectl("delete", "namespace", namespace, "--timeout=90s", check=False, timeout=120)


def test_kubelet_refuses_a_pod_beyond_capacity_even_with_nodename(in_cluster: Cluster) -> None:
    """A preset nodeName skips every scheduler (and the exempt namespace skips
    Headroom's admission): kubelet's own admission still counts the device plugin's
    replicas and fails the pod that does not fit (KWOK accepted 7 on a node of 4)."""
    kubectl = in_cluster.kubectl
    namespace = "exempt-real"
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "headroom.dev/exempt=true")
    try:
        node = in_cluster.kubectl_json("get", "node", realnode.NODE_NAME)
        capacity = int(node["status"]["allocatable"]["nvidia.com/gpu.shared"])
        assert capacity == 4
        held = _replicas_held(in_cluster)
        free = capacity - held
        for n in range(free + 1):
            pod = _gpu_pod(f"direct-{n}", "1Gi")
            pod["metadata"]["annotations"] = {}
            spec = pod["spec"]
            spec["nodeName"] = realnode.NODE_NAME
            spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": 1}}
            kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))

        def settled() -> bool:
            pods = in_cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
            phases = [p["status"].get("phase") for p in pods]
            return phases.count("Running") + phases.count("Failed") == free + 1

        wait_until("kubelet to admit or refuse every pod", settled, timeout=90)
        pods = in_cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
        failed = [p for p in pods if p["status"]["phase"] == "Failed"]
        assert len(failed) == 1, [(p["metadata"]["name"], p["status"]["phase"]) for p in pods]
        assert failed[0]["status"]["reason"] == "UnexpectedAdmissionError" or (
            "nvidia.com/gpu.shared" in failed[0]["status"].get("message", "")
        ), failed[0]["status"]
        assert _replicas_held(in_cluster) == capacity
    finally:
        # Gone before the next test counts the node's replicas.
        kubectl("delete", "namespace", namespace, "--timeout=90s", check=False, timeout=120)


def _replicas_held(cluster: Cluster) -> int:
    pods = cluster.kubectl_json(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={realnode.NODE_NAME}"
    )["items"]
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu.shared", 0))
        for p in pods
        if p["status"].get("phase") in ("Pending", "Running")
        for c in p["spec"]["containers"]
    )


def test_down_leaves_nothing_behind(node_cluster: Cluster, pause_pod: dict[str, Any]) -> None:
    # What is ours: the pods of the real node, the bridge, the pod subnet, the rules
    # marked with our comment; another CNI user or kubelet on the machine may keep its own.
    on_node = node_cluster.kubectl_json(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={realnode.NODE_NAME}"
    )["items"]
    ours = {p["metadata"]["uid"] for p in on_node}
    assert nodehost.pod_processes(ours), "the pods' processes should be in kubepods"
    assert "CNI-HOSTPORT" in nodehost.run("iptables-save").stdout

    assert down(node_cluster.state.directory, progress=_progress)

    assert nodehost.mounts_under([realnode.ROOT, realnode.RUN]) == []
    assert nodehost.node_processes([realnode.ROOT, realnode.RUN]) == set()
    assert nodehost.shims(realnode.CONTAINERD_SOCKET) == {}
    assert nodehost.pod_processes(ours) == set()
    assert nodehost.pod_netns(realnode.POD_SUBNET) == []
    assert not nodehost.link_exists(realnode.BRIDGE)
    rules = nodehost.run("iptables-save").stdout
    assert nodehost.RULE_COMMENT not in rules
    assert realnode.BRIDGE not in rules
    assert realnode.POD_SUBNET not in rules
    assert realnode.NETWORK not in rules
    results = nodehost.CNI_RESULTS
    cached = list(results.iterdir()) if results.is_dir() else []
    assert [p.name for p in cached if str(realnode.RUN) in p.read_text()] == []
    assert not realnode.ROOT.exists()
    assert not realnode.RUN.exists()
    assert not realnode.DEVICE_PLUGIN_SOCKET.exists()
    assert not (realnode.DEVICE_PLUGINS / "headroom-gpu.sock").exists()
