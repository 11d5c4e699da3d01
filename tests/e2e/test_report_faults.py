"""Faults never raise headroom (issue 7 §3), on the real control plane.

The node's agent is stopped, and the test writes its GPUNodeReport as the issue
measured it: fresh with a 6Gi pod holding 30Gi plus 4Gi unattributed, then
NVML unavailable, then an hour stale, then a forged total. The extender's
``/state`` must keep the fresh report's headroom through every fault.
"""

import copy
import datetime
import json
import urllib.request
from typing import Any

import yaml

from devcluster.cluster import Cluster
from headroom.reports import CONDITION_NVML_AVAILABLE
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import (
    GIB,
    eventually,
    gpu_deployment,
    pods,
    running,
    wait_idle,
)

NODE = "a100-shared-1"


def gpu_headroom(cluster: Cluster) -> int | None:
    url = f"http://127.0.0.1:{cluster.ports['extender']}/state?node={NODE}"
    with urllib.request.urlopen(url, timeout=10) as response:
        account = json.loads(response.read())["nodes"].get(NODE)
    if not account or not account["gpus"]:
        return None
    return min(int(gpu["headroom"]) for gpu in account["gpus"])


def stamp(at: datetime.datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def write(cluster: Cluster, report: dict[str, Any]) -> None:
    report["metadata"].pop("managedFields", None)
    report["metadata"].pop("resourceVersion", None)
    cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(report))


def test_nvml_unavailable_stale_and_forged_reports_keep_headroom(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    wait_idle(cluster, [NODE])  # an earlier test's pods there would refuse this one
    ns = namespace("gpu-shared")
    selector = {"kubernetes.io/hostname": NODE}
    cluster.apply([gpu_deployment(ns, "leaky", replicas=1, memory="6Gi", node_selector=selector)])
    eventually("the pod Running", lambda: len(running(pods(cluster, ns))) == 1, timeout=90)
    (pod,) = running(pods(cluster, ns))
    label = int(
        cluster.kubectl_json("get", "node", NODE)["metadata"]["labels"]["nvidia.com/gpu.memory"]
    )
    margin = 512 * 1024**2
    agent = f"agent-{NODE}"
    cluster.stop(agent)  # nobody else writes this node's report now
    try:
        base = cluster.kubectl_json("get", "gpunodereport", NODE)
        now = datetime.datetime.now(datetime.UTC)
        fresh = copy.deepcopy(base)
        fresh["status"]["observedAt"] = stamp(now)
        fresh["status"]["conditions"] = [
            c
            for c in fresh["status"].get("conditions", [])
            if c["type"] != CONDITION_NVML_AVAILABLE
        ]
        gpu = fresh["status"]["gpus"][0]
        fresh["status"]["gpus"] = [gpu]
        gpu["pods"] = [
            {
                "uid": pod["metadata"]["uid"],
                "namespace": ns,
                "name": pod["metadata"]["name"],
                "usedBytes": 30 * GIB,
            }
        ]
        gpu["unattributedBytes"] = 4 * GIB
        gpu["usedBytes"] = 34 * GIB
        gpu["freeBytes"] = max(gpu["totalBytes"] - 34 * GIB, 0)
        write(cluster, fresh)
        measured = label * 1024**2 - 34 * GIB - margin  # 5.5 GiB on a 40 GiB A100
        eventually(
            "the fresh report charged", lambda: gpu_headroom(cluster) == measured, timeout=60
        )

        unavailable = cluster.kubectl_json("get", "gpunodereport", NODE)
        unavailable["status"]["gpus"] = []
        unavailable["status"]["observedAt"] = stamp(datetime.datetime.now(datetime.UTC))
        unavailable["status"]["conditions"] = [
            {"type": CONDITION_NVML_AVAILABLE, "status": "False", "reason": "DriverGone"}
        ]
        write(cluster, unavailable)

        def seen_unavailable() -> bool:
            url = f"http://127.0.0.1:{cluster.ports['extender']}/state?node={NODE}"
            with urllib.request.urlopen(url, timeout=10) as response:
                return "NVML" in json.loads(response.read())["nodes"][NODE]["note"]

        eventually("the extender to read NVML unavailable", seen_unavailable, timeout=60)
        assert gpu_headroom(cluster) == measured  # 33.5 GiB in 0.1

        stale = cluster.kubectl_json("get", "gpunodereport", NODE)
        stale["status"]["observedAt"] = stamp(now - datetime.timedelta(hours=1))
        write(cluster, stale)
        assert gpu_headroom(cluster) == measured

        forged = copy.deepcopy(fresh)
        forged["status"]["observedAt"] = stamp(datetime.datetime.now(datetime.UTC))
        forged["status"]["gpus"][0].update(
            pods=[], unattributedBytes=0, usedBytes=0, totalBytes=1024 * GIB, freeBytes=1024 * GIB
        )
        write(cluster, forged)
        eventually(
            "the forged report read",
            lambda: (gpu_headroom(cluster) or 0) == label * 1024**2 - margin - 6 * GIB,
            timeout=60,
        )  # the label's 40 GiB, less the 6Gi declared: never the forged 1 TiB
    finally:
        cluster.start(agent)
