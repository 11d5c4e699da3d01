"""Benchmark (not a test): the extender's CPU per bound pod in a storm, in-process.

A replay of what the extender does in ``bench/scheduler_bench.py``'s storm,
without the cluster: ``--nodes`` GPU nodes of ``--gpus-per-node`` time-sliced
A100-40GB GPUs (``--replicas`` each) and no node agent (the KWOK nodes run
none, so every account is worked out from declarations), ``--pods`` pods of
``--memory`` created before the storm (the pod watch shows each one pending),
then, per pod in turn, what kube-scheduler and the apiserver send:

* the filter verb (``choose``, as shipped) over every node kube-scheduler's
  own count of slots still finds feasible;
* the bind verb, against a binder that stores the binding at once;
* the pod watch's event that shows the pod bound, ``--lag`` pods later (the
  watch trails the binds), and then kubelet's status update (Running).

Parsing of the request bodies and the HTTP server are left out: they cost the
same whatever the node. What is timed (``time.process_time``, the process's
CPU) is the verbs and the state, over the whole storm; the figure is CPU per
bound pod. ``--profile N`` prints cProfile's top N functions by their own time.

Prints one JSON object on its last line. Run:
``.venv/bin/python bench/extender_storm_bench.py --nodes 100 --gpus-per-node 8``.
"""

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender.state import ClusterState
from extender.verbs import Extender
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from headroom.accounting import DEFAULT_MARGIN_BYTES
from tests.extender.objects import gpu_node, gpu_pod, uid_of

CREATED = "2025-06-01T12:00:00Z"
"""Every pod's creationTimestamp; the extender's clock starts before it."""
START = 1748779200.0 - 60.0
"""A minute before CREATED, in epoch seconds: the extender has watched since then."""


class StepClock:
    """The extender's clock: a millisecond further at every read, so time moves on."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


async def _store(namespace: str, name: str, uid: str, node: str) -> None:
    return None


def storm(
    nodes: int, gpus: int, replicas: int, pods: int, memory: str, lag: int
) -> tuple[float, int, dict[str, str]]:
    """Replay one storm: (CPU seconds, pods bound, pod name -> node)."""
    return asyncio.run(_storm(nodes, gpus, replicas, pods, memory, lag))


async def _storm(
    nodes: int, gpus: int, replicas: int, pods: int, memory: str, lag: int
) -> tuple[float, int, dict[str, str]]:
    clock = StepClock()
    state = ClusterState(margin=DEFAULT_MARGIN_BYTES, stale_after=90.0, clock=clock)
    extender = Extender(state, _store, choose=True)
    names = [f"bench-{i:04d}" for i in range(nodes)]
    for name in names:
        state.on_node("ADDED", gpu_node(name, gpus=gpus, replicas=replicas))
    objects = []
    for i in range(pods):
        pod = gpu_pod(f"p-{i:05d}", namespace="bench", declared=memory)
        pod["metadata"]["creationTimestamp"] = CREATED
        state.on_pod("ADDED", pod)
        objects.append(pod)
    slots = dict.fromkeys(names, gpus * replicas)
    where: dict[str, str] = {}
    watched: list[dict[str, Any]] = []

    def watch(pod: dict[str, Any]) -> None:
        bound = {**pod, "spec": {**pod["spec"], "nodeName": where[pod["metadata"]["name"]]}}
        state.on_pod("MODIFIED", bound)
        running = {**bound, "status": {**bound["status"], "phase": "Running"}}
        state.on_pod("MODIFIED", running)

    started = time.process_time()
    for pod in objects:
        feasible = [name for name in names if slots[name] > 0]
        answer = extender.filter(
            ExtenderArgs.model_construct(Pod=pod, Nodes=None, NodeNames=feasible)
        )
        if answer.NodeNames:
            node = answer.NodeNames[0]
            meta = pod["metadata"]
            result = await extender.bind(
                ExtenderBindingArgs.model_construct(
                    PodName=meta["name"],
                    PodNamespace=meta["namespace"],
                    PodUID=uid_of(pod),
                    Node=node,
                )
            )
            if not result.Error:
                slots[node] -= 1
                where[meta["name"]] = node
                watched.append(pod)
        while len(watched) > lag:
            watch(watched.pop(0))
    for pod in watched:
        watch(pod)
    return time.process_time() - started, len(where), where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--memory", default="8Gi")
    parser.add_argument("--lag", type=int, default=4, help="binds the pod watch trails by")
    parser.add_argument("--rounds", type=int, default=5, help="storms; the median is reported")
    parser.add_argument("--profile", type=int, default=0, help="print the top N by own time")
    options = parser.parse_args()
    shape = (
        options.nodes,
        options.gpus_per_node,
        options.replicas,
        options.pods,
        options.memory,
        options.lag,
    )
    if options.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        storm(*shape)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(options.profile)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(options.profile)
        print(out.getvalue())
    rounds = []
    bound = 0
    for _ in range(options.rounds):
        seconds, bound, _ = storm(*shape)
        rounds.append(seconds * 1000 / max(bound, 1))
    print(
        json.dumps(
            {
                "benchmark": "extender storm replay, CPU per bound pod",
                "nodes": options.nodes,
                "gpus_per_node": options.gpus_per_node,
                "replicas": options.replicas,
                "pods": options.pods,
                "bound": bound,
                "lag": options.lag,
                "ms_per_pod": round(statistics.median(rounds), 4),
                "rounds_ms_per_pod": [round(r, 4) for r in rounds],
            }
        )
    )


if __name__ == "__main__":
    main()
