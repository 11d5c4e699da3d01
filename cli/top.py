"""``headroom top``: GPU memory per node and GPU, as the extender accounts it.

Lists nodes, pods and GPUNodeReports once and prints, per GPU: total memory,
what pods declared, what the node agent observed, the headroom left for a new
shared pod (after the margin), the pods charged to it, and where the figures
come from (``report``, ``stale-report`` or ``declarations``). MIG slices are
listed per profile. The accounting is the extender's own code.
"""

import argparse
import json
import logging
from collections.abc import Iterable
from typing import Any

from cli.options import add_kubeconfig, duration, memory, one_line, quiet_retries
from headroom.accounting import (
    DEFAULT_MARGIN_BYTES,
    DEFAULT_STALE_AFTER_SECONDS,
    NodeAccount,
    PodCharge,
)
from headroom.quantity import human_bytes

log = logging.getLogger(__name__)

COLUMNS = ("NODE", "GPU", "PRODUCT", "TOTAL", "DECLARED", "OBSERVED", "HEADROOM", "SOURCE", "PODS")
PODS_WIDTH = 60
"""Pod names beyond this are counted, not listed: the table must stay readable."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="show GPU memory per node and GPU: total, declared, observed, headroom, pods",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kubeconfig(parser)
    parser.add_argument(
        "--margin",
        type=memory,
        default=DEFAULT_MARGIN_BYTES,
        metavar="QUANTITY",
        help="the extender's --margin, for the same headroom figures (default 512Mi)",
    )
    parser.add_argument(
        "--report-stale-after",
        type=duration,
        default=DEFAULT_STALE_AFTER_SECONDS,
        metavar="DURATION",
        help="the extender's --report-stale-after (default 90s)",
    )
    parser.add_argument("--all", action="store_true", help="also list nodes without GPUs")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from extender.cache import LIVE_PODS
    from extender.state import ClusterState
    from headroom import names
    from kube.config import KubeConfigError, api_client

    quiet_retries()
    try:
        api = api_client(args.kubeconfig)
    except KubeConfigError as err:
        log.error("%s", err)
        return 2
    state = ClusterState(margin=args.margin, stale_after=args.report_stale_after)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    try:
        for node in _items(core.list_node(_preload_content=False)):
            state.on_node("ADDED", node)
        pods = core.list_pod_for_all_namespaces(field_selector=LIVE_PODS, _preload_content=False)
        for pod in _items(pods):
            state.on_pod("ADDED", pod)
        try:
            reports = custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, names.REPORT_PLURAL, _preload_content=False
            )
        except ApiException as err:
            if err.status != 404:
                raise
            log.warning("no GPUNodeReport CRD installed: showing declarations only")
        else:
            for report in _items(reports):
                state.on_report("ADDED", report)
    except (ApiException, HTTPError, OSError) as err:
        log.error("cannot read the cluster: %s", one_line(err))
        return 1
    finally:
        api.close()
    now = state.clock()
    accounts = [state.account(name, now) for name in sorted(state.nodes)]
    print(render([a for a in accounts if a is not None], show_all=args.all))
    return 0


def _items(response: Any) -> list[dict[str, Any]]:
    items = json.loads(response.data).get("items") or []
    return [item for item in items if isinstance(item, dict)]


def render(accounts: Iterable[NodeAccount], *, show_all: bool = False) -> str:
    """The table, columns aligned; notes (why figures are declarations only) below it."""
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for account in accounts:
        if not account.gpus and not account.mig and not show_all:
            continue
        if account.note:
            notes.append(f"{account.node}: {account.note}")
        for gpu in account.gpus:
            # A pod the device plugin cannot have put here with the ones charged is not listed.
            pods = pods_cell(sorted(pod_label(p) for p in gpu.pods if p.charged or not p.spread))
            rows.append(
                (
                    account.node,
                    str(gpu.index) + ("" if gpu.shared else " (MIG)"),
                    gpu.product or "?",
                    human_bytes(gpu.total),
                    human_bytes(gpu.declared),
                    human_bytes(gpu.observed) if account.source == "report" else "-",
                    human_bytes(gpu.headroom),
                    account.source,
                    pods,
                )
            )
        for profile, slices in sorted(account.mig.items()):
            rows.append(
                (
                    account.node,
                    f"mig {profile}",
                    f"{slices.free}/{slices.capacity} free",
                    human_bytes(slices.memory_bytes),
                    "-",
                    "-",
                    "-",
                    account.source,
                    str(slices.used),
                )
            )
        if not account.gpus and not account.mig:
            rows.append((account.node, "-", "no GPUs", "-", "-", "-", "-", account.source, "-"))
    if not rows:
        return "no GPU nodes found"
    widths = [max(len(row[i]) for row in (COLUMNS, *rows)) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (COLUMNS, *rows)
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def pod_label(pod: PodCharge) -> str:
    """The pod's name; ``(legacy)`` after a known pod that declares no memory resource.

    On a shared GPU such a pod was admitted by Headroom 0.1 and is charged the
    whole GPU until it is recreated (README, "Declared memory is a resource").
    """
    name = pod.key.split("/", 1)[-1]
    return f"{name} (legacy)" if pod.known and pod.declared is None else name


def pods_cell(names: list[str]) -> str:
    """``3: a, b, c``, or ``12: a, b (+10 more)`` when the names would not fit."""
    if not names:
        return "-"
    shown: list[str] = []
    for name in names:
        if shown and len(", ".join([*shown, name])) > PODS_WIDTH:
            break
        shown.append(name)
    more = len(names) - len(shown)
    return f"{len(names)}: {', '.join(shown)}" + (f" (+{more} more)" if more else "")
