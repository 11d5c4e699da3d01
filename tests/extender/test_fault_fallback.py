"""Faults (a stale report, NVML failing on one GPU) never raise headroom above what a fresh
report gave: the fallback to declarations keeps what reports saw, where they saw it."""

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from headroom import names
from headroom.reports import PodUsage, parse_report, report_object
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, uid_of
from tests.extender.test_report_faults import headroom, state_with


def with_error(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """NVML fails on GPU ``index``; the agent carries its last figures (agent.attribution)."""
    status = parse_report(obj)
    gpus = [replace(g, error="NVMLError_Unknown") if g.index == index else g for g in status.gpus]
    return report_object(replace(status, gpus=gpus))


def allocated(obj: dict[str, Any], where: dict[str, int]) -> dict[str, Any]:
    """Mark pod UID -> GPU index as kubelet's allocation (PodResources), adding a 0-byte
    line where the report has none."""
    status = parse_report(obj)
    gpus = []
    for g in status.gpus:
        pods = [replace(p, allocated=where.get(p.uid) == g.index) for p in g.pods]
        listed = {p.uid for p in pods}
        pods += [
            PodUsage(uid=uid, used_bytes=0, allocated=True)
            for uid, index in where.items()
            if index == g.index and uid not in listed
        ]
        gpus.append(replace(g, pods=pods))
    return report_object(replace(status, gpus=gpus))


def fault(kind: str, clock: Clock, make: Callable[[datetime], dict[str, Any]]) -> dict[str, Any]:
    clock.now += 5
    if kind == "nvml-error":
        return with_error(make(EPOCH + timedelta(seconds=5)), 0)
    clock.now += 90  # the agent went silent: same report, now stale
    return make(EPOCH)


@pytest.mark.parametrize("kind", ["nvml-error", "stale"])
def test_exclusive_pods_observed_memory_survives_a_fault(kind: str) -> None:
    # The webhook's mode=exclusive pod (annotated, no shared replica) holding 20 GiB
    # on the node's GPU. The extender caches it (has_headroom_annotations) and a fresh
    # report charges it what it holds; a fault must not forget that memory.
    exclusive = gpu_pod("whole", node="gpu-a", declared=None, shared=0)
    exclusive["metadata"]["annotations"][names.ANNOTATION_MODE] = "exclusive"
    state, clock = state_with(gpu_node("gpu-a"), exclusive)

    def make(at: datetime) -> dict[str, Any]:
        return gpu_report("gpu-a", {0: {uid_of(exclusive): 20 * GIB}}, at=at)

    state.on_report("ADDED", make(EPOCH))
    measured = headroom(state)
    assert measured == 40 * GIB - 20 * GIB - MARGIN
    state.on_report("MODIFIED", fault(kind, clock, make))
    assert headroom(state) <= measured  # was 39.5 GiB: the 20 GiB vanish


@pytest.mark.parametrize("kind", ["nvml-error", "stale"])
def test_memory_a_pod_holds_off_its_own_gpu_survives_a_fault(kind: str) -> None:
    # Two GPUs. kubelet gave a GPU 0 and b GPU 1; b also holds 14 GiB on GPU 0 (a
    # container reaching GPU 0 through NVIDIA_VISIBLE_DEVICES). Fresh, GPU 0 is charged
    # a's 15 GiB + b's 14 GiB there. A fault makes every pod unlocated and the spread
    # bound charges GPU 0 only its largest pod line: 15 GiB.
    a = gpu_pod("a", node="gpu-a", declared="15Gi")
    b = gpu_pod("b", node="gpu-a", declared="15Gi")
    state, clock = state_with(gpu_node("gpu-a", gpus=2), a, b)

    def make(at: datetime) -> dict[str, Any]:
        usage = {0: {uid_of(a): 5 * GIB, uid_of(b): 14 * GIB}, 1: {uid_of(b): GIB}}
        return allocated(gpu_report("gpu-a", usage, at=at), {uid_of(a): 0, uid_of(b): 1})

    state.on_report("ADDED", make(EPOCH))
    measured = headroom(state)
    assert measured == 40 * GIB - 29 * GIB - MARGIN
    state.on_report("MODIFIED", fault(kind, clock, make))
    assert headroom(state) <= measured  # was 24.5 GiB on GPU 0
