"""A test device plugin that stands in for NVIDIA's, on kubelet's real Device Plugin API.

NVIDIA's device plugin (NVIDIA/k8s-device-plugin) cannot be fetched here, and
there is no GPU. This plugin speaks kubelet's ``v1beta1`` Device Plugin API
over gRPC (stubs generated from the vendored ``api.proto``; ``make
deviceplugin``) and shows kubelet what NVIDIA's plugin shows it with
time-slicing, ``renameByDefault`` and ``failRequestsGreaterThanOne``:
``nvidia.com/gpu.shared`` replicas ``GPU-<uuid>::<n>``, the ``distributed``
preferred allocation, at most one replica per container, and
``NVIDIA_VISIBLE_DEVICES`` in the container. Kubelet really allocates, enforces
capacity and reports the replicas through PodResources; nothing touches a GPU.

- ``replicas``: the GPUs, replica IDs and NVIDIA's decisions (pure);
- ``plugin``: the gRPC service, registration and re-registration after a
  kubelet restart;
- ``python -m devcluster.deviceplugin``: the process (``__main__``);
- :func:`component`: that process as a local-cluster :class:`Component`.
"""

import sys
from pathlib import Path

from devcluster.deviceplugin.replicas import RESOURCE_NAME, Inventory, gpu_uuid
from devcluster.process import Component, Probe
from devcluster.state import ClusterState

__all__ = ["RESOURCE_NAME", "Inventory", "component", "gpu_uuid"]


def component(
    state: ClusterState,
    *,
    kubelet_dir: Path,
    node: str,
    gpus: int = 1,
    replicas: int = 4,
    product: str = "NVIDIA-A100-SXM4-40GB",
    memory_mib: int = 40960,
) -> Component:
    """The plugin for ``node``'s kubelet, named ``deviceplugin-<node>``.

    Start it next to kubelet (before or after: it waits for ``kubelet.sock``
    and registers again whenever kubelet restarts). Ready (its probe,
    ``GET /readyz`` on a port kept in the state as ``deviceplugin-<node>``)
    once kubelet accepted the registration and the plugin's socket is in place;
    ``stop()`` sends SIGTERM, and the plugin removes its socket. Logs to
    ``<state>/logs/deviceplugin-<node>.log``.
    """
    name = f"deviceplugin-{node}"
    port = state.port(name)
    return Component(
        name=name,
        argv=[
            sys.executable,
            "-m",
            "devcluster.deviceplugin",
            "--kubelet-dir",
            str(kubelet_dir),
            "--node",
            node,
            "--gpus",
            str(gpus),
            "--replicas",
            str(replicas),
            "--product",
            product,
            "--memory-mib",
            str(memory_mib),
            "--health-port",
            str(port),
        ],
        log=str(state.logs / f"{name}.log"),
        probe=Probe(f"http://127.0.0.1:{port}/readyz"),
    )
