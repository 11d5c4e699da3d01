"""The watch-lag metric: from our successful bind to the pod watch showing the pod bound.

Issue 7's over-commit came from a pod watch that lagged the extender's own
binds; ``headroom_extender_watch_lag_seconds`` makes that lag visible.
"""

from typing import Any

from extender.wire import ExtenderBindingArgs
from tests.extender.conftest import Harness
from tests.extender.objects import gpu_node, gpu_pod


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
