"""What devcluster writes for the real node, checked without running it."""

import os
import re
import shutil
import socket
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devcluster import binaries, nodehost, realnode
from devcluster.state import ClusterState


@pytest.fixture
def state(tmp_path: Path) -> ClusterState:
    state = ClusterState(tmp_path)
    state.make_dirs()
    return state


def test_cni_version_matches_the_pinned_go_module() -> None:
    go_mod = (realnode.BUILD_SCRIPT.parent / "cni" / "go.mod").read_text()

    assert re.search(
        rf"^require github\.com/containernetworking/plugins {realnode.CNI_VERSION}$", go_mod, re.M
    )
    built = realnode.node_binaries()
    assert f"node-k8s-{binaries.KUBERNETES_VERSION}-cni-{realnode.CNI_VERSION}" in str(built.bin)
    assert built.pause.parent == realnode.images_dir()


def test_containerd_config_keeps_everything_in_the_node_directories(state: ClusterState) -> None:
    config = tomllib.loads(realnode.containerd_config(state, realnode.node_binaries()))

    assert config["root"] == str(realnode.CONTAINERD_ROOT)
    assert config["state"] == str(realnode.CONTAINERD_STATE)
    assert config["grpc"]["address"] == str(realnode.CONTAINERD_SOCKET)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == realnode.PAUSE_IMAGE
    assert cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"SystemdCgroup": False, "Root": str(realnode.RUNC_ROOT)}
    assert cri["cni"]["conf_dir"] == str(state.directory / "cni" / "net.d")
    # The shim sockets' directory is containerd's, not ours; unix paths stay short.
    assert len(str(realnode.CONTAINERD_SOCKET)) < 108
    assert len(str(realnode.DEVICE_PLUGIN_SOCKET)) < 108


def test_pod_network_is_the_bridge_with_the_node_address_as_gateway() -> None:
    bridge, portmap = realnode.cni_conflist()["plugins"]

    assert bridge["bridge"] == realnode.BRIDGE
    assert bridge["isDefaultGateway"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]
    assert bridge["ipam"]["dataDir"].startswith(str(realnode.ROOT))
    assert portmap["backend"] == "iptables"


def test_kubelet_authenticates_callers_and_serves_on_the_bridge(state: ClusterState) -> None:
    config = realnode.kubelet_configuration(state)

    assert config["address"] == realnode.NODE_IP
    assert config["readOnlyPort"] == 0
    assert config["healthzBindAddress"] == "127.0.0.1"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["x509"]["clientCAFile"] == str(state.pki / "ca.crt")
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["containerRuntimeEndpoint"] == f"unix://{realnode.CONTAINERD_SOCKET}"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["port"] != config["healthzPort"]


def test_node_labels_are_the_seed_gpu_labels_kubelet_may_set() -> None:
    labels = realnode.node_labels()

    assert labels["headroom.dev/real-node"] == "true"
    assert labels["nvidia.com/gpu.product"] == "A100-PCIE-40GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    # NodeRestriction refuses most kubernetes.io/ and k8s.io/ labels from a kubelet.
    assert all(k.startswith(("nvidia.com/", "headroom.dev/")) for k in labels)


def test_mount_points_are_found_deepest_first(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "\n".join(
            [
                "20 1 0:1 / /var/lib/headroom/kubelet rw - ext4 /dev/vda rw",
                "21 20 0:2 / /var/lib/headroom/kubelet/pods/u/volumes/a\\040b rw - tmpfs tmpfs rw",
                "22 1 0:3 / /run/headroom/containerd/x/rootfs rw - overlay overlay rw",
                "23 1 0:4 / /var/lib/headroomish rw - tmpfs tmpfs rw",
            ]
        )
    )

    found = nodehost.mounts_under([Path("/var/lib/headroom"), Path("/run/headroom")], mountinfo)

    assert found == [
        "/var/lib/headroom/kubelet/pods/u/volumes/a b",
        "/run/headroom/containerd/x/rootfs",
        "/var/lib/headroom/kubelet",
    ]


def test_cached_archives_are_the_newest_of_each_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(realnode, "images_dir", lambda: tmp_path)
    for name, mtime in [
        ("headroom-aaaa.oci.tar", 100),
        ("headroom-bbbb.oci.tar", 200),
        ("kube-scheduler-cccc.oci.tar", 100),
        ("pause-3.10.oci.tar", 50),
        ("build.log", 300),
    ]:
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (mtime, mtime))

    assert [p.name for p in realnode.cached_archives()] == [
        "headroom-bbbb.oci.tar",
        "kube-scheduler-cccc.oci.tar",
        "pause-3.10.oci.tar",
    ]


def test_the_agent_overlay_mounts_our_kubelets_pod_resources() -> None:
    overlay = binaries.CHECKOUT / "manifests" / "overlays" / "realnode" / "agent.yaml"
    agent = yaml.safe_load(overlay.read_text())

    (volume,) = agent["spec"]["template"]["spec"]["volumes"]
    assert volume["hostPath"]["path"] == str(realnode.POD_RESOURCES_SOCKET.parent)


@pytest.fixture
def device_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer
    root = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))
    directory = root / "device-plugins"
    directory.mkdir()
    for name in realnode.DEVICE_PLUGIN_FILES:
        (directory / name).write_bytes(b"")
    monkeypatch.setattr(realnode, "DEVICE_PLUGINS_ROOT", root)
    monkeypatch.setattr(realnode, "DEVICE_PLUGINS", directory)
    monkeypatch.setattr(realnode, "DEVICE_PLUGIN_SOCKET", directory / "kubelet.sock")
    yield directory
    shutil.rmtree(root, ignore_errors=True)


def test_down_removes_the_device_plugin_files_of_ours(device_plugins: Path) -> None:
    realnode._remove_device_plugin_files()

    assert not device_plugins.parent.exists()


def test_down_leaves_a_live_kubelets_device_plugin_files(device_plugins: Path) -> None:
    (device_plugins / "kubelet.sock").unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as kubelet:
        kubelet.bind(str(device_plugins / "kubelet.sock"))
        kubelet.listen()

        realnode._remove_device_plugin_files()

    assert sorted(p.name for p in device_plugins.iterdir()) == sorted(realnode.DEVICE_PLUGIN_FILES)
