"""The local cluster's one real node, ``gpu-real-0``: kubelet, containerd and runc here.

Next to the KWOK nodes, one node runs containers for real: kubelet built from
the pinned Kubernetes module, Debian's containerd 1.6 and runc, the CNI bridge,
host-local, loopback and portmap plugins built from their module, and a pause
image built here (``tests/e2e/controlplane/build-node.sh`` builds all of it).
kubelet joins with its own identity (``system:node:gpu-real-0`` in
``system:nodes``), so the Node authorizer and NodeRestriction apply to it.

Networking stays on this machine: pods sit on the bridge ``headroom0``
(10.88.0.0/16, the node's address 10.88.0.1 is its gateway). There is no
kube-proxy; one DNAT rule stands in for it for the only Service pods need before
anything else, ``kubernetes`` (10.96.0.1:443 -> the apiserver on 127.0.0.1). The
apiserver reaches webhooks by their endpoints' pod IPs (aggregator routing),
and kubelet's logs and exec at 10.88.0.1.

One real node per machine: its directories are fixed (below) and a file in
``/run/headroom`` names the state dir that owns them. The integrator starts
more processes next to kubelet (the test device plugin) through ``extra``.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devcluster import binaries, controlplane, nodehost, nodes
from devcluster.kubectl import wait_until
from devcluster.process import Component, Probe, Progress
from devcluster.state import ClusterState

if TYPE_CHECKING:
    from devcluster.cluster import Cluster

NODE_NAME = "gpu-real-0"
SEED_NODE = "a100-shared-0"
"""The KWOK node in devcluster/data/nodes.yaml whose GFD labels the real node carries."""
ROOT = Path("/var/lib/headroom")
RUN = Path("/run/headroom")
KUBELET_ROOT = ROOT / "kubelet"
DEVICE_PLUGINS_ROOT = Path("/var/lib/kubelet")
"""Not under :data:`ROOT`: kubelet serves device-plugin registration at a fixed path,
whatever its ``--root-dir`` (k8s.io/kubelet deviceplugin/v1beta1 ``DevicePluginPath``)."""
DEVICE_PLUGINS = DEVICE_PLUGINS_ROOT / "device-plugins"
DEVICE_PLUGIN_SOCKET = DEVICE_PLUGINS / "kubelet.sock"
POD_RESOURCES_SOCKET = KUBELET_ROOT / "pod-resources" / "kubelet.sock"
POD_LOGS = ROOT / "pod-logs"
CNI_DATA = ROOT / "cni"
CONTAINERD_ROOT = ROOT / "containerd"
CONTAINERD_STATE = RUN / "containerd"
CONTAINERD_SOCKET = CONTAINERD_STATE / "containerd.sock"
RUNC_ROOT = RUN / "runc"
OWNER = RUN / "owner.json"
NAMESPACE = "k8s.io"
"""containerd's namespace for CRI: where kubelet's containers and images live."""
BRIDGE = "headroom0"
NETWORK = "headroom"
POD_SUBNET = "10.88.0.0/16"
NODE_IP = "10.88.0.1"
KUBERNETES_SERVICE_IP = "10.96.0.1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CNI_VERSION = "v1.9.1"
BUILD_SCRIPT = binaries.BUILD_SCRIPT.parent / "build-node.sh"
READY_TIMEOUT = 120.0
# kubelet, containerd and the CNI plugins run ip, iptables, mount and runc.
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RealNodeError(RuntimeError):
    """The real node cannot run here or is another cluster's; the message says why."""


def available() -> str | None:
    """Why this machine cannot run the real node, or None when it can."""
    if os.geteuid() != 0:
        return (
            "the real node needs root: kubelet, containerd and runc manage cgroups, mounts "
            "and network namespaces"
        )
    path = f"{os.environ.get('PATH', '')}:{_PATH}"
    absent = [
        tool
        for tool in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "ip", "iptables")
        if shutil.which(tool, path=path) is None
    ]
    if absent:
        return (
            f"{', '.join(absent)} not installed (Debian: apt-get install containerd runc "
            f"iproute2 iptables; {BUILD_SCRIPT} installs them)"
        )
    if (nodehost.CGROUP_ROOT / "cgroup.controllers").exists():
        controllers = (nodehost.CGROUP_ROOT / "cgroup.controllers").read_text().split()
        missing = [c for c in ("cpu", "memory", "pids") if c not in controllers]
    else:
        missing = [
            c
            for c in ("cpu", "cpuacct", "cpuset", "memory", "pids")
            if not (nodehost.CGROUP_ROOT / c / "cgroup.procs").exists()
        ]
    if missing:
        return (
            f"cgroup controllers {', '.join(missing)} are not mounted under {nodehost.CGROUP_ROOT}"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem (containerd's snapshotter)"
    if _owner() is None and _listening(DEVICE_PLUGIN_SOCKET):
        return (
            f"{DEVICE_PLUGIN_SOCKET} exists: another kubelet runs on this machine, and "
            "device plugins register at that fixed path"
        )
    return None


def _listening(path: Path) -> bool:
    """Something accepts connections on the unix socket ``path`` (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class NodeBinaries:
    bin: Path
    """kubelet"""
    cni: Path
    """bridge, host-local, loopback, portmap"""
    pause: Path
    """the pause image's OCI archive"""

    def missing(self) -> list[str]:
        wanted = [
            self.bin / "kubelet",
            *(self.cni / p for p in ("bridge", "host-local", "loopback", "portmap")),
        ]
        return [str(p) for p in [*wanted, self.pause] if not p.exists()]


def images_dir() -> Path:
    return binaries.bin_dir().parent.parent / "images"


def node_binaries() -> NodeBinaries:
    root = (
        binaries.bin_dir().parent.parent
        / f"node-k8s-{binaries.KUBERNETES_VERSION}-cni-{CNI_VERSION}"
    )
    return NodeBinaries(root / "bin", root / "cni", images_dir() / "pause-3.10.oci.tar")


def ensure_node_binaries(progress: Progress, *, build: bool = True) -> NodeBinaries:
    """kubelet, the CNI plugins and the pause image, building them first if allowed (the
    first kubelet build takes minutes); also installs Debian's runtime if missing."""
    built = node_binaries()
    absent = built.missing()
    if not absent:
        return built
    if not build:
        raise binaries.BinariesMissing(
            f"{', '.join(absent)} not built; run {BUILD_SCRIPT} (needs Go, gcc and buildah)"
        )
    progress("building the real node (kubelet, CNI plugins, pause image); the first build is slow")
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise binaries.BinariesMissing(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    absent = built.missing()
    if absent:
        raise binaries.BinariesMissing(f"{BUILD_SCRIPT} did not build {', '.join(absent)}")
    return built


def cached_archives() -> list[Path]:
    """The newest OCI archive of each image in the cache (``<kind>-<key>.oci.tar``, as
    devcluster.images names them; older builds of a kind are kept there too)."""
    directory = images_dir()
    newest: dict[str, Path] = {}
    for archive in directory.glob("*.oci.tar") if directory.is_dir() else []:
        kind = archive.name.rsplit("-", 1)[0]
        if kind not in newest or archive.stat().st_mtime > newest[kind].stat().st_mtime:
            newest[kind] = archive
    return sorted(newest.values())


def ctr(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``ctr`` against our containerd, in the CRI namespace."""
    argv = ["ctr", f"--address={CONTAINERD_SOCKET}", f"--namespace={NAMESPACE}", *args]
    result = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=timeout, env=_env()
    )
    if check and result.returncode != 0:
        raise RealNodeError(
            f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


def load_images(archives: Iterable[Path], progress: Progress | None = None) -> None:
    """Import OCI (or docker) archives into containerd's CRI namespace, where kubelet
    finds them; pods must use them with ``imagePullPolicy: IfNotPresent`` or ``Never``."""
    for archive in archives:
        started = time.monotonic()
        ctr("images", "import", str(archive))
        if progress:
            progress(f"image {archive.name} loaded ({time.monotonic() - started:.1f}s)")


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{_PATH}:{os.environ.get('PATH', '')}"}


def cni_conflist() -> dict[str, Any]:
    """The pod network: bridge + host-local, then portmap; containerd adds loopback."""
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isDefaultGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    "dataDir": str(CNI_DATA / "networks"),
                },
            },
            # iptables: its rules are what `down` knows how to find and delete.
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "iptables"},
        ],
    }


def containerd_config(state: ClusterState, built: NodeBinaries) -> str:
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{CONTAINERD_ROOT}"
state = "{CONTAINERD_STATE}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[metrics]
  address = "127.0.0.1:{state.port("containerd-metrics")}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{CONTAINERD_ROOT / "opt"}"

{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pods' network namespaces under our state dir rather than /run/netns.
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = {"false" if _can_lower_oom_score() else "true"}
{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{RUNC_ROOT}"
{cri}.cni]
  bin_dir = "{built.cni}"
  conf_dir = "{state.directory / "cni" / "net.d"}"
  max_conf_num = 1
"""


def _can_lower_oom_score() -> bool:
    """Whether we hold CAP_SYS_RESOURCE, which a negative oom_score_adj needs. Some VMs
    drop it from every process's bounding set; runc then cannot give the pause
    container kubelet's -998, so containerd is told to keep scores at or above ours."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def containerd(state: ClusterState, built: NodeBinaries) -> Component:
    config = state.config / "containerd.toml"
    config.write_text(containerd_config(state, built))
    conflist = state.directory / "cni" / "net.d" / "10-headroom.conflist"
    conflist.parent.mkdir(parents=True, exist_ok=True)
    conflist.write_text(json.dumps(cni_conflist(), indent=2))
    return Component(
        name="containerd",
        # The paths on the command line too, so that `down` recognizes a stray one.
        argv=[
            shutil.which("containerd", path=_PATH) or "/usr/bin/containerd",
            f"--config={config}",
            f"--address={CONTAINERD_SOCKET}",
            f"--root={CONTAINERD_ROOT}",
            f"--state={CONTAINERD_STATE}",
        ],
        log=str(state.logs / "containerd.log"),
        env={"PATH": _PATH},
        probe=Probe(f"http://127.0.0.1:{state.port('containerd-metrics')}/v1/metrics"),
    )


def node_labels() -> dict[str, str]:
    """``headroom.dev/real-node=true`` and the GFD labels of :data:`SEED_NODE`
    (NodeRestriction lets kubelet set nvidia.com/ and headroom.dev/ labels)."""
    seed = next(spec for spec in nodes.load() if spec.name == SEED_NODE)
    labels = {k: v for k, v in seed.labels.items() if k.startswith("nvidia.com/")}
    return {"headroom.dev/real-node": "true", **labels}


def kubelet_configuration(state: ClusterState) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": state.port("kubelet"),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": state.port("kubelet-healthz"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(state.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "cgroupDriver": "cgroupfs",
        # This machine: cgroup v1, swap allowed, no systemd.
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(POD_LOGS),
        "volumePluginDir": str(KUBELET_ROOT / "volume-plugins"),
        # The canary chains are for kube-proxy, which does not run here.
        "makeIPTablesUtilChains": False,
        # A busy development VM must not evict the test pods, and images built here
        # cannot be pulled again, so image garbage collection never starts.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
    }


def kubelet(state: ClusterState, built: NodeBinaries) -> Component:
    config = controlplane.identity(state, "kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
    path = state.config / "kubelet.yaml"
    path.write_text(yaml.safe_dump(kubelet_configuration(state), sort_keys=False))
    labels = ",".join(f"{k}={v}" for k, v in node_labels().items())
    return Component(
        name="kubelet",
        argv=[
            str(built.bin / "kubelet"),
            f"--config={path}",
            f"--kubeconfig={config}",
            f"--root-dir={KUBELET_ROOT}",
            f"--cert-dir={KUBELET_ROOT / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--node-labels={labels}",
            "--v=1",
        ],
        log=str(state.logs / "kubelet.log"),
        env={"PATH": _PATH},
        probe=Probe(f"http://127.0.0.1:{state.port('kubelet-healthz')}/healthz"),
    )


def _owner() -> dict[str, Any] | None:
    try:
        document: dict[str, Any] = json.loads(OWNER.read_text())
    except (OSError, ValueError):
        return None
    return document


def _refuse_if_taken(directory: Path) -> None:
    owner = _owner()
    if owner is None or Path(owner["stateDir"]) == directory:
        return
    other = ClusterState.load(Path(owner["stateDir"]))
    running = [
        c.name
        for c in (other.components.values() if other else [])
        if c.name in ("containerd", "kubelet") and c.alive()
    ]
    if running:
        raise RealNodeError(
            f"a real node already runs on this machine for the cluster in {owner['stateDir']} "
            f"({', '.join(running)}); stop it with `headroom cluster down --state-dir "
            f"{owner['stateDir']}` (one real node per machine)"
        )


def preflight(directory: Path, progress: Progress, *, build: bool = True) -> NodeBinaries:
    """Before anything starts: this machine can run containers, no other live cluster
    owns the node, and the node's binaries are built (building them if allowed)."""
    reason = available()
    if reason:
        raise RealNodeError(f"cannot run the real node here: {reason}")
    _refuse_if_taken(directory)
    return ensure_node_binaries(progress, build=build)


def claim(state: ClusterState, progress: Progress) -> None:
    """Take the node for ``state``: refuse when another live cluster owns it, clear
    what a dead one (or a crash) left, and record ourselves as the owner."""
    _refuse_if_taken(state.directory)
    owner = _owner()
    if owner is not None or ROOT.exists() or RUN.exists() or nodehost.link_exists(BRIDGE):
        progress("removing what an earlier real node left on this machine")
        teardown(owner)
    RUN.mkdir(parents=True, exist_ok=True)
    forwarding = nodehost.sysctl("net.ipv4.ip_forward")
    OWNER.write_text(json.dumps({"stateDir": str(state.directory), "ipForward": forwarding}))


def start(
    cluster: "Cluster",
    progress: Progress,
    *,
    build: bool = True,
    extra: Sequence[Component] = (),
) -> NodeBinaries:
    """Bring up containerd (with the cached images loaded) and kubelet, wait until the
    Node is Ready, then start ``extra`` (e.g. the device plugin) and wait for them."""
    state = cluster.state
    built = preflight(state.directory, progress, build=build)
    claim(state, progress)
    for directory in (KUBELET_ROOT, POD_LOGS, CNI_DATA, CONTAINERD_ROOT, CONTAINERD_STATE):
        directory.mkdir(parents=True, exist_ok=True)
    nodehost.create_bridge(BRIDGE, f"{NODE_IP}/{POD_SUBNET.split('/')[1]}")
    nodehost.service_dnat(
        BRIDGE, KUBERNETES_SERVICE_IP, 443, f"127.0.0.1:{state.port('apiserver')}"
    )
    cluster._launch([containerd(state, built)], progress)
    wait_until(
        "containerd's API",
        lambda: ctr("version", check=False, timeout=10).returncode == 0,
        timeout=30,
    )
    load_images(dict.fromkeys([built.pause, *cached_archives()]), progress)
    cluster._launch([kubelet(state, built)], progress)
    _wait_ready(cluster, progress)
    if extra:
        cluster._launch(list(extra), progress)
    return built


def _wait_ready(cluster: "Cluster", progress: Progress) -> None:
    started = time.monotonic()

    def ready() -> bool:
        component = cluster.components["kubelet"]
        if not component.alive():
            raise RealNodeError(
                f"kubelet exited; last lines of {component.log}:\n{component.log_tail()}"
            )
        result = cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    try:
        wait_until(f"node {NODE_NAME} to be Ready", ready, timeout=READY_TIMEOUT)
    except TimeoutError as err:
        log = cluster.components["kubelet"]
        raise RealNodeError(f"{err}; last lines of {log.log}:\n{log.log_tail()}") from err
    progress(f"node {NODE_NAME} Ready ({time.monotonic() - started:.1f}s)")


def owned_by(state: ClusterState) -> bool:
    owner = _owner()
    return (owner is not None and Path(owner["stateDir"]) == state.directory) or (
        "kubelet" in state.components or "containerd" in state.components
    )


def down(state: ClusterState, progress: Progress) -> None:
    """Stop kubelet, every container and containerd (and whatever was started after
    containerd), then remove everything the node put on this machine."""
    names = list(state.components)
    ours = names[names.index("containerd") :] if "containerd" in names else []
    runtime = state.components.get("containerd")
    for name in reversed(ours):
        component = state.components[name]
        if name == "containerd":
            if component.alive():
                _remove_tasks(progress)
        elif component.alive():
            progress(f"stopping {name} (pid {component.pid})")
        component.stop()
    if runtime is not None:
        state.save()
    owner = _owner()
    if owner is None or Path(owner["stateDir"]) == state.directory:
        teardown(owner)
        progress(f"removed the real node's containers, mounts, {BRIDGE} and {ROOT}")


def _remove_tasks(progress: Progress) -> None:
    """Kill and delete every task through containerd, so that shims unmount the root
    filesystems and exit; teardown kills what is left."""
    listed = ctr("tasks", "ls", "--quiet", check=False, timeout=20)
    tasks = listed.stdout.split() if listed.returncode == 0 else []
    if tasks:
        progress(f"killing {len(tasks)} container(s)")
        for task in tasks:
            ctr("tasks", "kill", "--signal=SIGKILL", "--all", task, check=False, timeout=20)
        for task in tasks:
            ctr("tasks", "delete", "--force", task, check=False, timeout=20)


def _pod_uids() -> set[str]:
    """The pods our kubelet ran (its ``pods/<uid>`` directories): only their
    processes and cgroups are ours to kill and remove."""
    pods = KUBELET_ROOT / "pods"
    return {entry.name for entry in pods.iterdir()} if pods.is_dir() else set()


def teardown(owner: dict[str, Any] | None = None) -> None:
    """Remove every trace of our real node from this machine, this cluster's or one
    that died without ``down``.

    Pods' network namespaces need nothing of their own: containerd keeps them
    under its state dir (``netns_mounts_under_state_dir``), unmounted with it."""
    pods = _pod_uids()
    for _ in range(3):
        strays = nodehost.node_processes([ROOT, RUN]) | nodehost.pod_processes(pods)
        shims = nodehost.shims(CONTAINERD_SOCKET)
        if not strays and not shims:
            break
        nodehost.kill(strays | set(shims))
        for shim_socket in shims.values():
            shim_socket.unlink(missing_ok=True)
    left = nodehost.unmount_all([ROOT, RUN])
    if left:
        raise RealNodeError(f"could not unmount {', '.join(left)}")
    nodehost.delete_bridge(BRIDGE)
    nodehost.delete_rules(NETWORK)
    nodehost.remove_cgroups(pods)
    nodehost.remove_cni_results(NETWORK, RUN)
    nodehost.remove_log_links(POD_LOGS)
    if owner and owner.get("ipForward") in ("0", "1"):
        with contextlib.suppress(OSError):
            nodehost.sysctl("net.ipv4.ip_forward", owner["ipForward"])
    for directory in (ROOT, RUN):
        shutil.rmtree(directory, ignore_errors=True)
    _remove_device_plugin_files()


DEVICE_PLUGIN_FILES = ("kubelet.sock", "kubelet_internal_checkpoint", "headroom-gpu.sock")
"""What kubelet and the test device plugin put in :data:`DEVICE_PLUGINS`."""


def _remove_device_plugin_files() -> None:
    """The files ours put in kubelet's fixed device-plugin directory; the directories
    too when nothing else is in them. Ours is stopped by now, so a kubelet still
    serving there is the machine's own: its socket and checkpoint stay."""
    if _listening(DEVICE_PLUGIN_SOCKET):
        return
    for name in DEVICE_PLUGIN_FILES:
        (DEVICE_PLUGINS / name).unlink(missing_ok=True)
    for directory in (DEVICE_PLUGINS, DEVICE_PLUGINS_ROOT):
        with contextlib.suppress(OSError):
            directory.rmdir()
