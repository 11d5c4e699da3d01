"""The guard and pods that declare no memory but ask for a shared replica or a MIG
slice: what they hold outside the devices kubelet gave them is still over. And the
Event: it says the guard evicts when, and only when, an eviction follows."""

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent.guard import Guard
from headroom.quantity import GIB
from headroom.reports import GPUUsage, MigDeviceUsage, PodUsage, ReportStatus
from tests.agent.doubles import pod
from tests.agent.test_guard import NAMESPACES, POLICIES, gpus, guarded, namespace, report


def mixed_node(stray: int, *, allocated: bool = True) -> ReportStatus:
    """gpu 0 in MIG mode, its slice given to pod "m"; gpu 1 time-sliced, shared by
    pod "s" (10Gi declared) and, if ``stray``, holding that much of pod "m"."""
    slice_pods = [
        PodUsage(uid="m", namespace="ns-strict", name="m", used_bytes=GIB, allocated=allocated)
    ]
    shared_pods = [
        PodUsage(uid="s", namespace="ns-strict", name="s", used_bytes=10 * GIB, allocated=True)
    ]
    if stray:
        shared_pods.append(PodUsage(uid="m", namespace="ns-strict", name="m", used_bytes=stray))
    return ReportStatus(
        node_name="gpu-node-1",
        backend="nvml",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        gpus=[
            GPUUsage(
                index=0,
                uuid="GPU-0",
                total_bytes=40 * GIB,
                used_bytes=GIB,
                free_bytes=39 * GIB,
                mig_enabled=True,
                mig_devices=[
                    MigDeviceUsage(
                        uuid="MIG-0",
                        profile="3g.20gb",
                        total_bytes=20 * GIB,
                        used_bytes=GIB,
                        pods=slice_pods,
                    )
                ],
            ),
            GPUUsage(
                index=1,
                uuid="GPU-1",
                total_bytes=40 * GIB,
                used_bytes=10 * GIB + stray,
                free_bytes=30 * GIB - stray,
                pods=shared_pods,
            ),
        ],
    )


def mig_pod() -> dict[str, Any]:
    # The webhook declares memory as a resource for shared containers only: a pod of
    # MIG slices has none.
    return pod("m", "m", namespace="ns-strict", resource="nvidia.com/mig-3g.20gb")


def test_a_mig_pod_holding_memory_on_a_shared_gpu_it_was_not_given_is_over() -> None:
    guard = Guard(grace=1)
    pods = {"m": mig_pod(), "s": guarded("s", "strict")}
    assert guard.observe(mixed_node(0), pods, POLICIES, NAMESPACES) == []
    verdicts = guard.observe(mixed_node(25 * GIB), pods, POLICIES, NAMESPACES)
    assert [(v.uid, v.kind) for v in verdicts] == [("m", "event"), ("m", "evict")]
    assert verdicts[0].message.startswith(
        "uses 25.0 GiB of GPU memory on gpu 1, a GPU kubelet did not allocate to it"
    )


def test_a_mig_pod_whose_allocation_is_unknown_is_not_judged() -> None:
    # Without kubelet's word the slice proves nothing either way: no verdict.
    guard = Guard(grace=1)
    pods = {"m": mig_pod(), "s": guarded("s", "strict")}
    assert guard.observe(mixed_node(0, allocated=False), pods, POLICIES, NAMESPACES) == []


def test_a_legacy_shared_pod_is_held_to_the_gpu_kubelet_gave_it() -> None:
    # Admitted before declarations were resources: no measure of its memory, but the
    # replica kubelet gave it is on gpu 1, and gpu 0's memory is not its own.
    guard = Guard(grace=1)
    legacy = pod("l", "l", namespace="ns-strict")
    pods = {"l": legacy}
    report = gpus({0: {"l": 30 * GIB}, 1: {"l": 30 * GIB}}, allocated={1: {"l"}})
    verdicts = guard.observe(report, pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event", "evict"]
    assert "on gpu 0, a GPU kubelet did not allocate to it" in verdicts[0].message
    # On the GPU it was given alone, however much it holds, it is not judged.
    alone = replace(report, gpus=report.gpus[1:])
    assert Guard(grace=1).observe(alone, pods, POLICIES, NAMESPACES) == []


def test_the_event_says_evicting_only_when_the_guard_evicts() -> None:
    # Already stopping within the guard's bound: no eviction follows, so the Event
    # must not tell the tenant their pod is being evicted by the guard.
    guard = Guard(grace=1)
    leaving = guarded("e", "strict")
    leaving["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    leaving["metadata"]["deletionGracePeriodSeconds"] = 30
    (event,) = guard.observe(report({"e": 12 * GIB}), {"e": leaving}, POLICIES, NAMESPACES)
    assert "evicting" not in event.message


def test_a_policy_turned_to_evict_mid_episode_announces_the_eviction() -> None:
    # Warned under guard: warn; the namespace is relabelled to an evict policy: the
    # eviction that follows is announced by an Event of its own, once.
    guard = Guard(grace=1)
    pods = {"w": guarded("w", "std")}
    over = report({"w": 12 * GIB})
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event"]
    relabelled = NAMESPACES | {"ns-std": namespace("ns-std", "strict")}
    verdicts = guard.observe(over, pods, POLICIES, relabelled)
    assert [v.kind for v in verdicts] == ["event", "evict"]
    assert "evicting" in verdicts[0].message
    guard.eviction_refused("w")  # retried: no second announcement
    assert [v.kind for v in guard.observe(over, pods, POLICIES, relabelled)] == ["evict"]


def test_an_event_lost_beside_a_done_eviction_still_says_evicting() -> None:
    # The Event failed (the apiserver throttled it) but the eviction beside it went
    # through: the Event retried on the next observation (the pod still running out
    # its grace) must still tell the tenant the guard evicted their pod.
    guard = Guard(grace=1)
    pods = {"e": guarded("e", "strict")}
    over = report({"e": 12 * GIB})
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event", "evict"]
    guard.event_failed("e")
    (event,) = guard.observe(over, pods, POLICIES, NAMESPACES)
    assert event.kind == "event"
    assert "evicting" in event.message
