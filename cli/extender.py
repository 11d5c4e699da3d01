"""``headroom extender``: the kube-scheduler extender (HTTP: /filter /prioritize /bind /preempt).

Watches nodes, GPU pods and GPUNodeReports; filters out nodes whose GPU lacks
the memory a pod declared, scores the rest (binpack or spread), and binds,
re-checking fit first. Also serves /healthz, /readyz (503 until the watches
have listed and binds sent before this process started can no longer land),
/metrics and /state (the accounting as JSON).

Configure kube-scheduler with managedResources nvidia.com/gpu.shared and every
nvidia.com/mig-<profile> your nodes offer, nodeCacheCapable: true, and this
extender as the binder (bindVerb: bind).
"""

import argparse
import asyncio
import logging
from typing import Any

from cli.options import add_kubeconfig, duration, lease, memory, port
from headroom.accounting import DEFAULT_MARGIN_BYTES, DEFAULT_STALE_AFTER_SECONDS
from headroom.names import HEADROOM_SCHEDULER
from headroom.preemption import BUDGET_SECONDS

log = logging.getLogger(__name__)

BIND_SLACK_SECONDS = 2.0
"""Beyond a binding POST's deadline: its etcd write may commit as the deadline ends."""


def verify_after(text: str) -> float:
    """A ``--verify-after`` no shorter than a binding POST can still be stored in.

    A hold is read ``verify_after`` after its last POST began, and released if the pod
    is not bound; a POST is refused by the apiserver only after its own ``timeout``
    (extender.binding), so a read before then could let go of a charge about to land.
    """
    from extender.binding import REQUEST_TIMEOUT_SECONDS

    seconds = duration(text)
    least = REQUEST_TIMEOUT_SECONDS + BIND_SLACK_SECONDS
    if seconds < least:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be at least {least:g}s (a binding POST may be stored up to "
            f"{REQUEST_TIMEOUT_SECONDS:g}s after it is sent; a read before then could "
            "release a pod about to be bound)"
        )
    return seconds


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "extender",
        help="serve the kube-scheduler extender (HTTP: /filter /prioritize /bind /preempt /state)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=port, default=8888, help="HTTP port (default 8888)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1, as shipped: kube-scheduler reaches it as a "
        "sidecar, and /bind, which binds with this ServiceAccount's rights and no "
        "authentication, must not be reachable from the pod network)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        help="also serve /metrics, and nothing else, on this port (default: none; /metrics "
        "is on --port too). The shipped manifests use 9403 so that Prometheus can reach it",
    )
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        help="address the --metrics-port listener binds (default 0.0.0.0)",
    )
    add_kubeconfig(parser)
    parser.add_argument(
        "--margin",
        type=memory,
        default=DEFAULT_MARGIN_BYTES,
        metavar="QUANTITY",
        help="GPU memory kept free on every GPU, e.g. 512Mi, 1Gi (default 512Mi)",
    )
    parser.add_argument(
        "--report-stale-after",
        type=duration,
        default=DEFAULT_STALE_AFTER_SECONDS,
        metavar="DURATION",
        help="a GPUNodeReport older than this is ignored in favour of declarations "
        "(default 90s: three of the agent's default 30s heartbeats)",
    )
    parser.add_argument(
        "--verify-after",
        type=verify_after,
        default=10.0,
        metavar="DURATION",
        help="a bound-or-maybe-bound pod the pod watch has not confirmed after this long is "
        "read from the apiserver, and released only if it is not bound (default 10s, at "
        "least 5s; no timer alone ever releases one)",
    )
    parser.add_argument(
        "--leader-lease",
        type=lease,
        default=None,
        metavar="NAMESPACE/NAME",
        help="the leader-election Lease of the kube-scheduler this extender is a sidecar of "
        "(its leaderElection resourceNamespace/resourceName): filter and bind wait after that "
        "scheduler takes the lease until the previous leader's binds can no longer land "
        "(default: none; they wait only after this extender starts)",
    )
    parser.add_argument(
        "--scheduler-name",
        default=HEADROOM_SCHEDULER,
        help=f"bind only pods with this spec.schedulerName (default {HEADROOM_SCHEDULER})",
    )
    parser.add_argument(
        "--advertise-capacity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep every shared GPU node's headroom.dev/gpu-memory capacity at the sum of its "
        "GPUs' memory less the margin (patches nodes/status; default on)",
    )
    parser.add_argument(
        "--device-plugin-policy",
        choices=("distributed", "unknown"),
        default="distributed",
        help="the NVIDIA device plugin's sharedDevicesAllocationPolicy: 'distributed' (its "
        "default) bounds where a pod not yet located can be on a many-GPU node; 'unknown' "
        "charges such a pod to every GPU of its node (use it with 'packed' or another plugin)",
    )
    parser.add_argument(
        "--choose",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="answer a GPU pod's filter with the one node it scores best on, so kube-scheduler "
        "skips scoring and the prioritize call (default on; pods with preferred affinity or "
        "ScheduleAnyway spread always get every node that fits, scored by kube-scheduler)",
    )
    parser.add_argument(
        "--preempt-budget",
        type=duration,
        default=BUDGET_SECONDS,
        metavar="DURATION",
        help="how long the preempt verb may work out kube-scheduler's candidate nodes before "
        "it answers with those checked (default 2s; keep it well below the extender's "
        "httpTimeout in the KubeSchedulerConfiguration, 5s as shipped, past which "
        "kube-scheduler fails the whole preemption)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from extender.service import Settings, serve
    from kube.config import KubeConfigError

    settings = Settings(
        host=args.host,
        port=args.port,
        kubeconfig=args.kubeconfig,
        margin_bytes=args.margin,
        stale_after_seconds=args.report_stale_after,
        verify_after_seconds=args.verify_after,
        scheduler_name=args.scheduler_name,
        advertise_capacity=args.advertise_capacity,
        spread=args.device_plugin_policy == "distributed",
        choose=args.choose,
        preempt_budget_seconds=args.preempt_budget,
        leader_lease=args.leader_lease,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port or 0,
    )
    try:
        asyncio.run(serve(settings))
    except KubeConfigError as err:
        log.error("%s", err)
        return 2
    except OSError as err:
        where = f"{args.host}:{args.port}"
        if args.metrics_port:
            where += f" and {args.metrics_host}:{args.metrics_port}"
        log.error("cannot serve on %s: %s", where, err)
        return 1
    return 0
