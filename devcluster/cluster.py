"""``up``, ``down`` and ``status`` of the local cluster, and the :class:`Cluster` handle.

``up`` starts, in order: etcd; kube-apiserver; kube-controller-manager, the
stock kube-scheduler and kwok; then creates the nodes and waits until they are
Ready, the controllers and scheduler hold their leases and the ``default``
ServiceAccount exists. With ``headroom=True`` (the default) it then installs
Headroom (:mod:`devcluster.components`). Every step is shown through
``progress``; a process that dies is reported with the tail of its log.

With ``real_node=True`` it also starts the real node (:mod:`devcluster.realnode`:
kubelet, containerd, runc) with the test device plugin (:mod:`devcluster.deviceplugin`),
and Headroom is installed in the cluster instead, from ``manifests/overlays/realnode``
with the images built here (:mod:`devcluster.images`, :mod:`devcluster.incluster`).
"""

import functools
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster import (
    binaries,
    components,
    controlplane,
    deviceplugin,
    images,
    incluster,
    nodes,
    realnode,
)
from devcluster.kubectl import Kubectl, wait_until
from devcluster.process import Component, ProcessError, Progress
from devcluster.state import ClusterState, default_state_dir

READY_TIMEOUT = 90.0


def _stderr(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """The state dir holds a cluster that is partly dead, or is not a cluster's."""


@dataclass
class Cluster:
    """A running local cluster, as ``up`` left it (or as ``attach`` finds it)."""

    state: ClusterState
    bins: Path

    @property
    def kubeconfig(self) -> Path:
        return self.state.admin_kubeconfig

    @property
    def server(self) -> str:
        return self.state.server

    @property
    def components(self) -> dict[str, Component]:
        return self.state.components

    @property
    def ports(self) -> dict[str, int]:
        return self.state.ports

    @property
    def gpu_nodes(self) -> list[str]:
        return list(self.state.gpu_nodes)

    @property
    def kubectl(self) -> Kubectl:
        """The built kubectl with the admin kubeconfig; call it: ``c.kubectl("get", "pods")``."""
        return Kubectl(self.bins / "kubectl", self.kubeconfig)

    def kubectl_json(self, *args: str) -> Any:
        return self.kubectl.json(*args)

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl.apply(objects)

    def stop(self, name: str) -> None:
        """Stop one component (``c.components`` names them); the state remembers it."""
        self.components[name].stop()
        self.state.save()

    def start(self, name: str, *, timeout: float = READY_TIMEOUT) -> None:
        """Start a stopped component again with the same arguments; wait until ready."""
        component = self.components[name]
        component.start()
        self.state.save()
        component.wait_ready(timeout)

    def restart(self, name: str, *, timeout: float = READY_TIMEOUT) -> None:
        self.stop(name)
        self.start(name, timeout=timeout)

    def add_node(self, spec: nodes.NodeSpec, progress: Progress = _stderr) -> None:
        """Create a KWOK node through the API and, for a GPU node, start its simulated
        agent (stopped by ``down`` with the rest)."""
        _create_nodes(self, [spec], progress)
        if spec.has_gpu():
            self._launch([components.agent_component(self, spec.name)], progress)

    def remove_node(self, name: str) -> None:
        """Stop the node's agent, if any, and delete the Node."""
        agent = self.components.get(f"agent-{name}")
        if agent is not None:
            agent.stop()
            del self.state.components[agent.name]
            self.state.save()
        self.kubectl("delete", "node", name, "--wait=false")

    def _launch(self, batch: list[Component], progress: Progress) -> None:
        """Start ``batch`` together, then wait for each; the state is saved first so a
        failed ``up`` leaves pids that ``down`` can kill."""
        for component in batch:
            self.state.components[component.name] = component
            component.start()
            progress(f"started {component.name} (pid {component.pid}, log {component.log})")
        self.state.save()
        for component in batch:
            component.wait_ready(READY_TIMEOUT, progress)


def _alive(state: ClusterState) -> tuple[list[str], list[str]]:
    running = [n for n, c in state.components.items() if c.alive()]
    dead = [n for n, c in state.components.items() if not c.alive()]
    return running, dead


def attach(state_dir: Path | None = None) -> Cluster:
    """The cluster already running in ``state_dir``; ClusterError if none is up."""
    directory = (state_dir or default_state_dir()).resolve()
    state = ClusterState.load(directory)
    if state is None:
        raise ClusterError(f"no cluster in {directory}; start one with `headroom cluster up`")
    return Cluster(state, binaries.bin_dir())


def up(
    nodes_file: Path | None = None,
    state_dir: Path | None = None,
    *,
    headroom: bool = True,
    build: bool = True,
    real_node: bool = False,
    progress: Progress = _stderr,
) -> Cluster:
    """Start the local cluster (or return the one already running in ``state_dir``);
    with ``real_node``, also the real node (:mod:`devcluster.realnode`), before Headroom."""
    directory = (state_dir or default_state_dir()).resolve()
    existing = ClusterState.load(directory)
    if existing is not None:
        running, dead = _alive(existing)
        if running and not dead:
            progress(f"already running in {directory}")
            return Cluster(existing, binaries.bin_dir())
        if running:
            raise ClusterError(
                f"the cluster in {directory} is partly down ({', '.join(dead)} not running); "
                "run `headroom cluster down` first"
            )
        down(directory, progress=progress)
    specs = nodes.load(nodes_file)
    if real_node:
        realnode.preflight(directory, progress, build=build)
    bins = binaries.ensure(build=build, progress=progress)
    started = time.monotonic()
    state = ClusterState(directory)
    state.make_dirs()
    state.nodes = [spec.name for spec in specs]
    state.gpu_nodes = [spec.name for spec in specs if spec.has_gpu()]
    cluster = Cluster(state, bins)
    try:
        controlplane.prepare_pki(state)
        cluster._launch([controlplane.etcd(state, bins)], progress)
        cluster._launch([controlplane.apiserver(state, bins)], progress)
        cluster._launch(
            [
                controlplane.controller_manager(state, bins),
                controlplane.default_scheduler(state, bins),
                controlplane.kwok(state, bins),
            ],
            progress,
        )
        _create_nodes(cluster, specs, progress)
        _wait_control_plane(cluster, progress)
        if real_node:
            archives = images.ensure(progress, build_binaries=build) if headroom else {}
            realnode.start(cluster, progress, build=build, extra=[_device_plugin(state)])
            stale = set(archives.values()) - set(realnode.cached_archives())
            if stale:
                realnode.load_images(sorted(stale), progress)
        if headroom and real_node:
            # Headroom as a platform team runs it: manifests/base on the real node;
            # the KWOK GPU nodes, where nothing runs, keep a simulated agent each.
            incluster.install(cluster, realnode.NODE_NAME, progress)
            cluster._launch(
                [components.agent_component(cluster, s.name) for s in specs if s.has_gpu()],
                progress,
            )
        elif headroom:
            components.install(cluster, specs, progress)
    except BaseException:
        if realnode.owned_by(state):
            try:
                realnode.down(state, progress)
            except Exception as err:  # the original error matters more
                progress(f"removing the real node failed too: {err}")
        for component in reversed(list(state.components.values())):
            component.stop()
        state.save()
        progress(f"up failed; logs are in {state.logs} (`headroom cluster down` removes them)")
        raise
    progress(f"up in {time.monotonic() - started:.0f}s; kubeconfig {cluster.kubeconfig}")
    return cluster


def _device_plugin(state: ClusterState) -> Component:
    """The test device plugin (standing in for NVIDIA's) advertising the real node's
    GPUs as its GFD labels describe them: ``nvidia.com/gpu.count`` GPUs of
    ``nvidia.com/gpu.memory`` MiB, ``nvidia.com/gpu.replicas`` time-slicing replicas each."""
    labels = realnode.node_labels()
    return deviceplugin.component(
        state,
        kubelet_dir=realnode.DEVICE_PLUGINS_ROOT,
        node=realnode.NODE_NAME,
        gpus=int(labels["nvidia.com/gpu.count"]),
        replicas=int(labels["nvidia.com/gpu.replicas"]),
        product=labels["nvidia.com/gpu.product"],
        memory_mib=int(labels["nvidia.com/gpu.memory"]),
    )


def _create_nodes(cluster: Cluster, specs: list[nodes.NodeSpec], progress: Progress) -> None:
    cluster.apply([spec.to_object() for spec in specs])
    names = {spec.name for spec in specs}

    def all_ready() -> bool:
        listed = cluster.kubectl_json("get", "nodes")["items"]
        ready = {
            node["metadata"]["name"]
            for node in listed
            for condition in node.get("status", {}).get("conditions", [])
            if condition["type"] == "Ready" and condition["status"] == "True"
        }
        return names <= ready

    wait_until("kwok to make the nodes Ready", all_ready, timeout=READY_TIMEOUT)
    progress(f"nodes Ready: {', '.join(spec.name for spec in specs)}")


def _wait_control_plane(cluster: Cluster, progress: Progress) -> None:
    def leader(lease: str) -> bool:
        result = cluster.kubectl(
            "get",
            "lease",
            "-n",
            "kube-system",
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
            check=False,
        )
        return result.returncode == 0 and bool(result.stdout.strip())

    for lease in ("kube-controller-manager", "kube-scheduler"):
        wait_until(
            f"{lease} to become leader", functools.partial(leader, lease), timeout=READY_TIMEOUT
        )
    # Pods cannot be created in a namespace before its "default" ServiceAccount exists.
    wait_until(
        "the default ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", check=False).returncode == 0,
        timeout=READY_TIMEOUT,
    )
    progress("control plane ready: controllers and scheduler hold their leases")


def down(state_dir: Path | None = None, *, progress: Progress = _stderr) -> bool:
    """Stop every component and remove the state dir; False when there was nothing."""
    directory = (state_dir or default_state_dir()).resolve()
    state = ClusterState.load(directory)
    if state is None:
        if directory.exists() and any(directory.iterdir()):
            raise ClusterError(f"{directory} has no state.json; not removing it")
        return False
    if realnode.owned_by(state):
        realnode.down(state, progress)
    for component in reversed(list(state.components.values())):
        if component.alive():
            progress(f"stopping {component.name} (pid {component.pid})")
        component.stop()
    shutil.rmtree(directory)
    progress(f"removed {directory}")
    return True


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    log: str


@dataclass(frozen=True)
class Status:
    state_dir: Path
    kubeconfig: Path | None
    server: str | None
    components: list[ComponentStatus]

    @property
    def up(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components)


def status(state_dir: Path | None = None) -> Status:
    directory = (state_dir or default_state_dir()).resolve()
    state = ClusterState.load(directory)
    if state is None:
        return Status(directory, None, None, [])
    return Status(
        directory,
        state.admin_kubeconfig,
        state.server if "apiserver" in state.ports else None,
        [ComponentStatus(c.name, c.pid, c.alive(), c.log) for c in state.components.values()],
    )


__all__ = ["Cluster", "ClusterError", "ProcessError", "attach", "down", "status", "up"]
