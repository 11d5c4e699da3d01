"""The watch-lag metric: from our successful bind to the pod watch showing the pod bound.

Issue 7's over-commit came from a pod watch that lagged the extender's own
binds; ``headroom_extender_watch_lag_seconds`` makes that lag visible. And what a
read learns while the watch lags: a pod read as gone leaves as the watch's
deletion would have it leave.
"""

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from extender.state import ClusterState
from extender.verbs import Extender
from extender.wire import ExtenderBindingArgs
from headroom.reports import PodUsage, parse_report, report_object
from tests.extender.conftest import MARGIN, Clock, Harness, PodReader, RecordingBinder
from tests.extender.objects import GIB, gpu_node, gpu_pod, gpu_report, uid_of


def args(pod: dict[str, Any], node: str) -> ExtenderBindingArgs:
    meta = pod["metadata"]
    return ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=node
    )


def bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], "nodeName": node}}


async def test_the_lag_from_bind_to_watch_is_observed_once(harness: Harness) -> None:
    lags: list[float] = []
    harness.state.observe_watch_lag = lags.append
    harness.state.on_node("ADDED", gpu_node("gpu-a"))
    pod = gpu_pod("p", declared="10Gi")
    harness.state.on_pod("ADDED", pod)
    assert (await harness.extender.bind(args(pod, "gpu-a"))).Error == ""
    harness.clock.now += 2.5
    harness.state.on_pod("MODIFIED", bound(pod, "gpu-a"))
    harness.state.on_pod("MODIFIED", bound(pod, "gpu-a"))  # a later update is no new lag
    assert lags == [2.5]
    assert harness.state.bound_at == {}


async def test_a_pod_deleted_before_the_watch_shows_it_bound_leaves_nothing(
    harness: Harness,
) -> None:
    lags: list[float] = []
    harness.state.observe_watch_lag = lags.append
    harness.state.on_node("ADDED", gpu_node("gpu-a"))
    pod = gpu_pod("p", declared="10Gi")
    harness.state.on_pod("ADDED", pod)
    assert (await harness.extender.bind(args(pod, "gpu-a"))).Error == ""
    harness.state.on_pod("DELETED", pod)
    assert harness.state.bound_at == {}
    assert lags == []


@pytest.mark.parametrize("released_by", ["watch", "read"])
async def test_a_force_deleted_pod_a_read_finds_gone_still_holds_its_replica(
    released_by: str,
) -> None:
    """A review's case. kubelet keeps a force-deleted pod's replica while it stops it,
    up to its grace period; the watch's DELETED counts its departure that much later
    (headroom.spread). A read that found the pod gone ended its hold with no
    departure at all: the bound then took the GPU kubelet still held for emptier
    than the device plugin's allocator sees it, and two pods shared the other."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    binder = RecordingBinder()
    reader = PodReader(binder)
    extender = Extender(state, binder, reader=reader)
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))  # 2 x 40 GiB, 4 replicas each
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}))

    # z (1 GiB, grace period 600 s) is bound through the extender; the pod watch lags.
    z = gpu_pod("z", declared="1Gi")
    z["spec"]["terminationGracePeriodSeconds"] = 600
    reader.put(z)
    state.on_pod("ADDED", z)
    assert (await extender.bind(args(z, "gpu-a"))).Error == ""
    # kubelet gives z a replica of GPU 1; the agent reports it allocated there.
    clock.now += 5
    status = parse_report(gpu_report("gpu-a", {0: {}, 1: {}}))
    allocated = [PodUsage(uid=uid_of(z), used_bytes=0, allocated=True)]
    gpus = [replace(g, pods=allocated) if g.index == 1 else g for g in status.gpus]
    at = status.observed_at + timedelta(seconds=5)
    state.on_report("MODIFIED", report_object(replace(status, gpus=gpus, observed_at=at)))

    # kubectl delete --force: kubelet keeps z running, and its replica of GPU 1.
    del reader.pods[("research", "z")]
    clock.now += 6
    if released_by == "watch":
        state.on_pod("MODIFIED", bound(z, "gpu-a"))
        state.on_pod("DELETED", bound(z, "gpu-a"))
    else:  # the watch still lags; the verifier reads z 10 s after its bind: 404
        assert await extender.verify_due() == 1
    assert uid_of(z) not in state.assumed

    # The allocator (fewest replicas first) puts a on GPU 0, as GPU 1 still holds z's
    # replica; then b on either: with a on GPU 0, 40 GiB declared > 40 GiB - 512 MiB.
    a, b = gpu_pod("a", declared="20Gi"), gpu_pod("b", declared="20Gi")
    for pod in (a, b):
        reader.put(pod)
        state.on_pod("ADDED", pod)
    assert (await extender.bind(args(a, "gpu-a"))).Error == ""
    assert 2 * 20 * GIB > 40 * GIB - MARGIN
    refused = (await extender.bind(args(b, "gpu-a"))).Error
    assert "headroom < 20.0 GiB declared" in refused, refused
