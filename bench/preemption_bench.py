"""Benchmark (not a test): the preempt verb on many candidate nodes, and what it does
to the filter requests that arrive meanwhile.

kube-scheduler hands the verb the candidate nodes its dry run found (up to 100,
or 10% of a larger cluster: ``minCandidateNodesAbsolute`` and
``minCandidateNodesPercentage`` of DefaultPreemption) and waits its
``httpTimeout`` (5 s as shipped) for the answer, then fails the whole
preemption. While the verb works, binds, watch events and probes wait on the
same event loop; the bench sends filters as that other work (kube-scheduler
itself sends none while it preempts).

The state: ``--nodes`` candidate nodes of 8 x 40 GiB GPUs, each with
``--pods-per-gpu`` 9 GiB pods of priority 0 per GPU, half of them located by
the node's report (the others, older than the departure history, are charged
wherever the device plugin could have put them, so most pods must go: the
heavy case). kube-scheduler's victims per node are three pods on three
GPUs (27 GiB at node level, enough for the 20 GiB preemptor by its own count,
not on any one GPU), so every node needs victims added and reprieved.

The real aiohttp app serves both verbs on 127.0.0.1; a client keeps sending a
small filter (10 candidate nodes) one after another, before, during and after
the preempt request. The floor is that filter's latency with no preemption in
flight, in the same run. Prints a line of figures, then one JSON object:
``preempt_s`` (the verb's answer, over HTTP), ``kept`` (nodes offered),
``filter_max_ms_during`` (the longest filter while the verb worked: how long
the event loop was held), ``filter_p50_ms_idle`` and ``stall_ratio``.
Run: ``.venv/bin/python bench/preemption_bench.py [--nodes N]``.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender.preemption import Budgets
from extender.server import make_app
from extender.state import ClusterState
from extender.verbs import Extender
from tests.extender.objects import GIB, gpu_node, gpu_pod, gpu_report, uid_of

GPUS = 8
HIGH = 100000


async def _refuse_binds(namespace: str, name: str, uid: str, node: str) -> None:
    raise AssertionError("the benchmark does not bind")


def populate(state: ClusterState, nodes: int, per_gpu: int) -> dict[str, list[str]]:
    """The candidate nodes; returns kube-scheduler's victims per node."""
    proposed = {}
    for i in range(nodes):
        name = f"gpu-{i:04d}"
        state.on_node("ADDED", gpu_node(name, gpus=GPUS, replicas=per_gpu + 2))
        usage: dict[int, dict[str, int]] = {g: {} for g in range(GPUS)}
        first: dict[int, str] = {}
        for g in range(GPUS):
            for p in range(per_gpu):
                pod = gpu_pod(f"w-{i}-{g}-{p}", node=name, declared="9Gi", phase="Running")
                pod["spec"]["priority"] = 0
                state.on_pod("ADDED", pod)
                if p % 2 == 0:
                    usage[g][uid_of(pod)] = 4 * GIB
                first.setdefault(g, uid_of(pod))
        state.on_report("ADDED", gpu_report(name, usage))
        proposed[name] = [first[0], first[1], first[2]]
    return proposed


async def main(nodes: int, per_gpu: int) -> dict[str, Any]:
    state = ClusterState(margin=512 * 2**20, stale_after=1e9)
    proposed = populate(state, nodes, per_gpu)
    extender = Extender(state, _refuse_binds)
    extender.budgets = Budgets()
    urgent = gpu_pod("urgent", declared="20Gi")
    urgent["spec"]["priority"] = HIGH
    preempt_body = json.dumps(
        {
            "Pod": urgent,
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
                for node, uids in proposed.items()
            },
        }
    ).encode()
    small = gpu_pod("small", declared="1Gi")
    filter_body = json.dumps(
        {"Pod": small, "Nodes": None, "NodeNames": sorted(proposed)[:10]}
    ).encode()
    runner = web.AppRunner(make_app(extender, max_body=64 * 2**20), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    headers = {"Content-Type": "application/json"}
    idle: list[float] = []
    during: list[float] = []
    phase = "idle"
    stop = False
    try:
        async with ClientSession() as session:

            async def filters() -> None:
                while not stop:
                    started = time.perf_counter()
                    async with session.post(
                        f"{url}/filter", data=filter_body, headers=headers
                    ) as r:
                        await r.read()
                    spent = (time.perf_counter() - started) * 1000
                    if phase == "idle":
                        idle.append(spent)
                    elif phase == "during":
                        during.append(spent)

            client = asyncio.create_task(filters())
            await asyncio.sleep(1.0)
            phase = "during"
            started = time.perf_counter()
            async with session.post(f"{url}/preempt", data=preempt_body, headers=headers) as r:
                answer = await r.json()
            preempt_s = time.perf_counter() - started
            phase = "after"
            await asyncio.sleep(0.2)
            stop = True
            await client
    finally:
        await runner.cleanup()
    kept = answer.get("NodeNameToMetaVictims") or {}
    victims = [len(v["Pods"]) for v in kept.values()]
    p50 = statistics.median(idle)
    worst = max(during, default=preempt_s * 1000)
    return {
        "benchmark": "extender preempt verb, filters alongside",
        "nodes": nodes,
        "gpus_per_node": GPUS,
        "pods_per_node": GPUS * per_gpu,
        "preempt_s": round(preempt_s, 3),
        "kept": len(kept),
        "victims_per_node_median": statistics.median(victims) if victims else 0,
        "filters_during": len(during),
        "filter_max_ms_during": round(worst, 2),
        "filter_p50_ms_idle": round(p50, 3),
        "stall_ratio": round(worst / p50, 1),
        "load_average": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="candidate nodes (default 100)")
    parser.add_argument("--pods-per-gpu", type=int, default=4, help="9 GiB pods per GPU")
    options = parser.parse_args()
    result = asyncio.run(main(options.nodes, options.pods_per_gpu))
    print(
        f"preempt over {result['nodes']} nodes: {result['preempt_s']} s, "
        f"{result['kept']} kept; longest filter meanwhile {result['filter_max_ms_during']} ms "
        f"({result['filters_during']} answered), idle p50 {result['filter_p50_ms_idle']} ms"
    )
    print(json.dumps(result))
