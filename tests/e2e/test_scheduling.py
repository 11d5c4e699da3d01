"""headroom-scheduler with the extender, under load and faults, on the seeds' nodes.

With 10Gi declared per pod and the extender's default 512Mi margin, each
A100 40GB takes 3 pods (30Gi; a 4th would leave -0.5Gi) although its device
plugin offers 4 time-slicing replicas, and the T4 (15360Mi) takes 1: 7 in all.
"""

import datetime
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from headroom import names
from tests.e2e import workloads
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import (
    GIB,
    declared_by_node,
    eventually,
    failed_scheduling,
    gpu_deployment,
    node_memory,
    placement,
    pods,
    running,
    settle,
    wait_idle,
)

pytestmark = pytest.mark.e2e

MARGIN = GIB // 2
CAPACITY_AT_10GI = 7
TIME_SLICED = ("a100-shared-0", "a100-shared-1", "t4-shared-0")
"""The nodes the policy gpu-shared places on: idle before a test counts what fits."""


def _assert_no_gpu_over_declared(cluster: Cluster) -> None:
    memory = node_memory(cluster)
    for node, declared in declared_by_node(cluster).items():
        assert declared <= memory[node] - MARGIN, (
            f"{node}: {declared / GIB:.1f}Gi declared on a {memory[node] / GIB:.1f}Gi GPU"
        )


def test_a_burst_of_100_pods_never_over_commits_a_gpu(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    # An earlier test's pods keep counting until their agent reports them gone; a
    # burst that came first would leave one refused and bound a moment later.
    wait_idle(cluster, TIME_SLICED)
    ns = namespace("gpu-shared")
    cluster.apply([gpu_deployment(ns, "burst", replicas=100, memory="10Gi")])

    settle(cluster, ns, total=100, timeout=240)
    _assert_no_gpu_over_declared(cluster)
    # Settled is not final: a bind refused or timed out under load leaves its pod
    # unbound with an event until its retry.
    _until_running(cluster, ns, CAPACITY_AT_10GI, f"{CAPACITY_AT_10GI} pods Running", timeout=90)
    items = pods(cluster, ns)
    _assert_no_gpu_over_declared(cluster)
    assert len(running(items)) == CAPACITY_AT_10GI
    reasons = failed_scheduling(cluster, ns)
    pending = [p["metadata"]["name"] for p in items if p["status"]["phase"] != "Running"]
    assert len(pending) == 100 - CAPACITY_AT_10GI
    for name in pending:
        # Refused for GPU memory: by kube-scheduler's own NodeResourcesFit when the
        # node-level headroom.dev/gpu-memory is spent, else by the extender per GPU.
        assert memory_refusal(reasons[name], "10.0 GiB declared"), reasons[name]
    # The summary failure messages use: every pod counted, no pod without a reason.
    summary = placement(cluster, ns)
    assert summary.startswith("100 pods, Running per node: {"), summary
    assert "no event yet" not in summary, summary


def test_the_extender_knows_its_kube_scheduler_holds_the_lease(cluster: Cluster) -> None:
    # The real headroom-scheduler elects itself leader of headroom-system/headroom-scheduler;
    # the extender watches that one Lease with the manifests' RBAC (list and watch by
    # resourceNames, through a metadata.name field selector) and recognises its own
    # kube-scheduler by the hostname its identity starts with (extender/leadership.py).
    holder = cluster.kubectl(
        "get", "lease", "-n", "headroom-system", "headroom-scheduler",
        "-o", "jsonpath={.spec.holderIdentity}",
    ).stdout.strip()  # fmt: skip
    assert holder.startswith(socket.gethostname() + "_"), holder
    log = Path(cluster.components["extender"].log).read_text(errors="replace")
    assert f"scheduler lease headroom-system/headroom-scheduler: held by {holder}" in log
    assert "leases" not in "".join(line for line in log.splitlines() if "403" in line)


def test_extender_restarted_mid_burst_loses_and_double_books_nothing(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    wait_idle(cluster, TIME_SLICED)
    ns = namespace("gpu-shared")
    cluster.apply([gpu_deployment(ns, "restart", replicas=40, memory="10Gi")])
    eventually(
        "the first pod bound",
        lambda: any(p["spec"].get("nodeName") for p in pods(cluster, ns)),
        explain=lambda: (
            placement(cluster, ns)
            + "\n"
            + extender_state(cluster)
            + "\n".join(
                line
                for line in cluster.components["extender"].log_tail(400).splitlines()
                if "stamp" in line or "ERROR" in line or "Traceback" in line
            )
        ),
    )

    cluster.restart("extender")

    settle(cluster, ns, total=40, timeout=180)
    _assert_no_gpu_over_declared(cluster)
    # Every pod a refusal parked, by this extender or the one before the restart, is
    # retried once the new one has synced (it stamps a node: extender/requeue.py), so
    # the rest fill well before kube-scheduler's 5-minute unschedulable flush would.
    _until_running(
        cluster,
        ns,
        CAPACITY_AT_10GI,
        f"{CAPACITY_AT_10GI} pods Running after the restart",
        timeout=90,
    )
    assert len(pods(cluster, ns)) == 40


def _until_running(
    cluster: Cluster, ns: str, count: int, description: str, *, timeout: float
) -> None:
    """Until ``count`` of the namespace's pods run: settle() also holds while a bind
    refused or timed out waits for its retry."""
    eventually(
        description,
        lambda: len(running(pods(cluster, ns))) == count,
        timeout=timeout,
        explain=lambda: placement(cluster, ns) + "\n" + extender_state(cluster),
    )


def _make_stale(report: dict[str, Any], *, total_bytes: int) -> dict[str, Any]:
    """The report an hour old, claiming a bigger GPU than the node's label says."""
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    report["status"]["observedAt"] = old.isoformat().replace("+00:00", "Z")
    for gpu in report["status"]["gpus"]:
        gpu["totalBytes"] = total_bytes
        gpu["freeBytes"] = total_bytes - gpu["usedBytes"]
    report["metadata"].pop("managedFields", None)
    return report


def extender_state(cluster: Cluster) -> str:
    """The extender's /state (its accounting), for failure messages."""
    return json.dumps(workloads.extender_state(cluster))[:8000]


def memory_refusal(reason: str, extender_words: str) -> bool:
    """A FailedScheduling message refusing for GPU memory, at node level or per GPU."""
    return f"Insufficient {names.GPU_MEMORY}" in reason or (
        "headroom" in reason and extender_words in reason
    )


def test_stale_report_makes_placement_conservative(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    node = "a100-shared-0"
    agent = f"agent-{node}"

    def idle() -> bool:
        status = cluster.kubectl_json("get", "gpunodereport", node)["status"]
        return not any(gpu["pods"] for gpu in status["gpus"])

    # What a stale report saw keeps counting, earlier tests' pods included: start from
    # a report that shows none, as the agent writes once they are gone, and from an
    # extender that charges nothing there. A pod deleted before kubelet said it stopped
    # (an earlier Deployment's pending pod, bound into the room its deleted replicas
    # freed as the namespace was emptied) keeps its declaration charged through its
    # grace period, unseen by the agent: the third pod here would wait that out.
    eventually("the agent to report no pods", idle, timeout=60)
    wait_idle(cluster, [node])
    cluster.stop(agent)  # nobody refreshes the report now
    try:
        report = cluster.kubectl_json("get", "gpunodereport", node)
        stale = _make_stale(report, total_bytes=80 * GIB)
        cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(stale))
        ns = namespace("gpu-shared")
        cluster.apply(
            [
                gpu_deployment(
                    ns,
                    "pinned",
                    replicas=5,
                    memory="10Gi",
                    node_selector={"kubernetes.io/hostname": node},
                )
            ]
        )
        settle(cluster, ns, total=5, timeout=120)
    finally:
        cluster.start(agent)

    # The stale report's 80Gi is not believed: the label's 40960Mi holds 3 pods,
    # not the 4 the device plugin's replicas (or the report) would allow.
    _until_running(cluster, ns, 3, "3 pods Running", timeout=60)
    items = pods(cluster, ns)
    assert len(running(items)) == 3
    assert {p["spec"]["nodeName"] for p in running(items)} == {node}
    reasons = failed_scheduling(cluster, ns)
    pending = [p["metadata"]["name"] for p in items if p["status"]["phase"] != "Running"]
    assert len(pending) == 2
    for name in pending:
        assert memory_refusal(reasons[name], "stale"), reasons[name]
