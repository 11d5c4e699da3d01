"""``headroom cluster up|down|status``: a local control plane with fake GPU nodes.

  headroom cluster up [--nodes nodes.yaml] [--state-dir DIR] [--bare] [--no-build] [--real-node]
  headroom cluster down [--state-dir DIR]
  headroom cluster status [--state-dir DIR]

``up`` runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
headroom-scheduler and kwok on 127.0.0.1 (no Docker), creates the seeds' GPU
nodes (or those in --nodes), and installs Headroom: CRDs, example policies,
webhook, extender and one simulated agent per GPU node. From a checkout it
first builds the control plane if needed (tests/e2e/controlplane/build.sh).
--real-node adds one real node, gpu-real-0: kubelet, containerd and runc on this
machine (root; tests/e2e/controlplane/build-node.sh builds kubelet once).
The state dir defaults to $HEADROOM_STATE or ~/.local/state/headroom/cluster.
"""

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="run a local control plane with fake GPU nodes and Headroom",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the cluster (builds the control plane once)")
    up.add_argument(
        "--nodes",
        type=Path,
        metavar="FILE",
        help="node file (format: devcluster/data/nodes.yaml); default: the seeds' nodes",
    )
    up.add_argument("--bare", action="store_true", help="control plane and nodes only, no Headroom")
    up.add_argument(
        "--no-build", action="store_true", help="fail instead of building missing binaries"
    )
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run gpu-real-0: a real kubelet with containerd and runc (needs root)",
    )
    up.set_defaults(run=run_up)
    down = actions.add_parser("down", help="stop everything and remove the state dir")
    down.set_defaults(run=run_down)
    status = actions.add_parser("status", help="what runs; exit 0 only when all of it does")
    status.set_defaults(run=run_status)
    for action in (up, down, status):
        action.add_argument(
            "--state-dir",
            type=Path,
            metavar="DIR",
            help="where pids, logs, certs and kubeconfigs live",
        )
    parser.set_defaults(run=run_status)


def run_up(args: argparse.Namespace) -> int:
    import subprocess

    from devcluster.binaries import BinariesMissing
    from devcluster.cluster import ClusterError, up
    from devcluster.images import ImageError
    from devcluster.incluster import InstallError
    from devcluster.kubectl import KubectlError
    from devcluster.nodehost import HostError
    from devcluster.nodes import NodesError
    from devcluster.process import ProcessError
    from devcluster.realnode import RealNodeError

    try:
        cluster = up(
            args.nodes,
            args.state_dir,
            headroom=not args.bare,
            build=not args.no_build,
            real_node=args.real_node,
        )
    except (
        BinariesMissing,
        HostError,
        RealNodeError,
        ClusterError,
        KubectlError,
        NodesError,
        ProcessError,
        ImageError,
        InstallError,
        TimeoutError,
        subprocess.TimeoutExpired,
        OSError,
    ) as err:
        print(f"headroom cluster up: {err}", file=sys.stderr)
        return 1
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def run_down(args: argparse.Namespace) -> int:
    from devcluster.cluster import ClusterError, down
    from devcluster.nodehost import HostError
    from devcluster.realnode import RealNodeError

    try:
        if not down(args.state_dir):
            print("no cluster was running", file=sys.stderr)
    except (ClusterError, HostError, RealNodeError) as err:
        print(f"headroom cluster down: {err}", file=sys.stderr)
        return 1
    return 0


def run_status(args: argparse.Namespace) -> int:
    from devcluster.cluster import status

    current = status(getattr(args, "state_dir", None))
    if not current.components:
        print(f"no cluster in {current.state_dir}")
        return 3
    width = max(len(c.name) for c in current.components)
    for component in current.components:
        state = "running" if component.running else "STOPPED"
        print(
            f"{component.name:<{width}}  {state:<8} pid {component.pid or '-':<8} {component.log}"
        )
    print(f"apiserver:  {current.server}")
    print(f"kubeconfig: {current.kubeconfig}")
    return 0 if current.up else 1
