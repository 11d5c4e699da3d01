"""``headroom agent``: the node agent (a DaemonSet on GPU nodes).

Measures GPU memory every --interval (NVML, or a simulation for fake nodes),
maps each GPU process to its pod through /proc/<pid>/cgroup (the pod needs
hostPID: true), and publishes a GPUNodeReport named after the node: on a
significant change, and at least every --heartbeat. A pod is listed on the
GPU kubelet allocated it (PodResources, --pod-resources-socket) before it
holds memory there. A pod using more GPU memory than it declared gets a
Warning Event and, under a policy with guard: evict, is evicted. Without an
NVIDIA driver the report says NVMLAvailable=False and the agent keeps running.

The simulated backend stands in for the GPUs of fake (KWOK) nodes. On a real
node without a GPU, --sim-processes host makes it stand in for NVML alone:
the memory each pod's demand asks for is reported on the host pid of its
container's main process, on the GPU kubelet allocated the pod, and the agent
finds the pod from that pid's cgroup as it would with NVML.
"""

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

from cli.options import add_kubeconfig, duration

log = logging.getLogger(__name__)

_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""agent.podresources.DEFAULT_SOCKET, spelled out so that --help imports no gRPC."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="node agent: measure GPU memory, publish the GPUNodeReport, guard declarations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the node this agent runs on (default $NODE_NAME, from the downward API)",
    )
    parser.add_argument(
        "--backend",
        choices=["nvml", "simulated"],
        default="nvml",
        help="nvml: the NVIDIA driver; simulated: fake GPUs from the node's labels (default nvml)",
    )
    parser.add_argument("--interval", type=duration, default=5.0, help="measure every (default 5s)")
    parser.add_argument(
        "--heartbeat",
        type=duration,
        default=30.0,
        help="rewrite the report at least this often, changed or not (default 30s)",
    )
    add_kubeconfig(parser)
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="DIR",
        help="where to read <pid>/cgroup (default /proc; needs hostPID)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        default=_POD_RESOURCES_SOCKET,
        metavar="PATH",
        help="kubelet's PodResources socket, asked which GPU each pod was given "
        "(nvml backend, or simulated with --sim-processes host; default %(default)s); "
        "an empty string asks nothing",
    )
    parser.add_argument(
        "--sim-gpus",
        metavar="SPEC",
        help="simulated backend: COUNTxMEMORY[:PRODUCT], e.g. 1x40Gi:NVIDIA-A100-PCIE-40GB "
        "(default: from the node's nvidia.com/gpu.* labels)",
    )
    parser.add_argument(
        "--sim-processes",
        choices=["none", "host"],
        default="none",
        help="simulated backend: none: no processes, memory is charged to pods by name "
        "(KWOK nodes); host: to the real host pid of each pod's container, found in "
        "--proc-root, on the GPU kubelet allocated (a real node without a GPU; default none)",
    )
    parser.add_argument(
        "--guard-grace",
        type=int,
        default=2,
        metavar="N",
        help="observations over declared memory before the guard acts, counted until as many "
        "in a row are within it (default 2)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=9402,
        help="HTTP port for /healthz /readyz /metrics; 0 disables (default 9402)",
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="address for that port (default 0.0.0.0, also outside a Pod: give 127.0.0.1 there)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agent.gpuspec import parse_gpu_spec
    from agent.reporter import WritePolicy
    from agent.service import AgentConfig

    if not args.node_name:
        log.error("--node-name is required (or set $NODE_NAME)")
        return 2
    if not 0 <= args.port < 65536:
        log.error("--port %d: not a TCP port", args.port)
        return 2
    if args.guard_grace < 1:
        log.error("--guard-grace %d: must be at least 1", args.guard_grace)
        return 2
    try:
        spec = parse_gpu_spec(args.sim_gpus) if args.sim_gpus else None
    except ValueError as err:
        log.error("--sim-gpus: %s", err)
        return 2
    if spec is not None and args.backend != "simulated":
        log.error("--sim-gpus needs --backend simulated")
        return 2
    if args.sim_processes != "none" and args.backend != "simulated":
        log.error("--sim-processes needs --backend simulated")
        return 2
    config = AgentConfig(
        node_name=args.node_name,
        backend=args.backend,
        interval_seconds=args.interval,
        proc_root=args.proc_root,
        sim_spec=spec,
        sim_processes=args.sim_processes,
        write_policy=WritePolicy(heartbeat_seconds=max(args.heartbeat, args.interval)),
        grace=args.guard_grace,
        port=args.port,
        host=args.host,
        pod_resources_socket=args.pod_resources_socket,
    )
    return asyncio.run(_main(config, args.kubeconfig))


async def _main(config: Any, kubeconfig: str | None) -> int:
    from agent.service import serve
    from kube.config import KubeConfigError, api_client

    try:
        api = api_client(kubeconfig)
    except KubeConfigError as err:
        log.error("%s", err)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(config, api, stop)
    except OSError as err:
        log.error("cannot listen on port %d: %s", config.port, err)
        return 1
    finally:
        api.close()
    return 0
