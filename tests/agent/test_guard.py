"""The guard: one Event per episode, eviction only under ``evict``, spikes ignored,
and the policy taken from the pod's namespace, never from what a tenant may patch."""

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from agent.gpuspec import GPUSpec
from agent.guard import WARN_EVERY_SECONDS, Guard, guard_action
from agent.reporter import Reporter
from agent.service import Agent
from agent.simulated import SimulatedProbe
from headroom import names
from headroom.policy import GPUSharingPolicy, parse_policy
from headroom.quantity import GIB
from headroom.reports import GPUUsage, MigDeviceUsage, PodUsage, ReportStatus
from tests.agent.doubles import ActionsDouble, Clock, WriterDouble, pod


def policy(name: str, guard: str) -> GPUSharingPolicy:
    return parse_policy(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.POLICY_KIND,
            "metadata": {"name": name},
            "spec": {"guard": guard},
        }
    )


POLICIES = {
    p.name: p for p in (policy("strict", "evict"), policy("lax", "off"), policy("std", "warn"))
}


def namespace(name: str, policy_name: str | None) -> dict[str, Any]:
    labels = {names.LABEL_POLICY: policy_name} if policy_name else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


NAMESPACES = {
    f"ns-{name}": namespace(f"ns-{name}", name)
    for name in ("strict", "lax", "std", "no-such-policy")
} | {"plain": namespace("plain", None)}


def guarded(uid: str, policy_name: str, declared: str = "10Gi") -> dict[str, Any]:
    """A pod in the namespace labelled ``policy_name``, annotated as the webhook does."""
    return pod(
        uid,
        uid,
        namespace=f"ns-{policy_name}",
        annotations={names.ANNOTATION_POLICY: policy_name},
        memory=declared,
    )


def report(usage: dict[str, int], *, mig: bool = False) -> ReportStatus:
    pods = [PodUsage(uid=uid, namespace="ns", name=uid, used_bytes=b) for uid, b in usage.items()]
    gpu = GPUUsage(
        index=0,
        uuid="GPU-1",
        product="NVIDIA A100-PCIE-40GB",
        total_bytes=40 * GIB,
        used_bytes=sum(usage.values()),
        free_bytes=0,
        pods=[] if mig else pods,
        mig_enabled=mig,
        mig_devices=[
            MigDeviceUsage(
                uuid="MIG-1", profile="3g.20gb", total_bytes=20 * GIB, used_bytes=0, pods=pods
            )
        ]
        if mig
        else [],
    )
    return ReportStatus(
        node_name="gpu-node-1",
        backend="nvml",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        gpus=[gpu],
    )


def test_a_single_spike_is_ignored() -> None:
    guard = Guard(grace=2)
    pods = {"a": guarded("a", "strict")}
    assert guard.observe(report({"a": 12 * GIB}), pods, POLICIES, NAMESPACES) == []
    assert guard.observe(report({"a": 8 * GIB}), pods, POLICIES, NAMESPACES) == []
    assert guard.observe(report({"a": 8 * GIB}), pods, POLICIES, NAMESPACES) == []
    assert (
        guard.observe(report({"a": 12 * GIB}), pods, POLICIES, NAMESPACES) == []
    )  # the count restarted


def test_a_pod_over_every_other_observation_is_acted_on() -> None:
    # 30 GiB for one observation, 8 for the next, over and over: the episode ended on
    # every low one, so the streak never reached the grace, and the neighbours starved
    # at every burst (a review's case; the seed's spiky pod).
    guard = Guard(grace=2)
    pods = {"a": guarded("a", "strict")}
    verdicts = []
    for used in (30, 8, 30, 8, 30):
        verdicts += guard.observe(report({"a": used * GIB}), pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts][:2] == ["event", "evict"]


def test_figures_carried_for_a_gpu_nvml_cannot_read_are_not_judged() -> None:
    # The agent reports such a GPU with its last good figures: evidence for the
    # extender, not a measurement of what a pod holds now.
    guard = Guard(grace=1)
    pods = {"a": guarded("a", "strict")}
    failing = report({"a": 12 * GIB})
    failing = replace(failing, gpus=[replace(failing.gpus[0], error="NVMLError_Unknown")])
    assert guard.observe(failing, pods, POLICIES, NAMESPACES) == []


def test_warn_records_one_event_per_episode_and_one_per_five_minutes_a_pod() -> None:
    clock = Clock()
    guard = Guard(grace=2, clock=clock.monotonic)
    pods = {"a": guarded("a", "std")}
    over, under = report({"a": 12 * GIB}), report({"a": 9 * GIB})

    def episode() -> list[list[str]]:
        for _ in range(2):  # back within bounds, as long as it took to act: the episode ends
            guard.observe(under, pods, POLICIES, NAMESPACES)
        return [[v.kind for v in guard.observe(r, pods, POLICIES, NAMESPACES)] for r in (over,) * 3]

    kinds = [
        [v.kind for v in guard.observe(r, pods, POLICIES, NAMESPACES)]
        for r in (over, over, over, over)
    ]
    assert kinds == [[], ["event"], [], []]
    # A pod whose episodes come and go: one Event per five minutes, not one per episode
    # (500 such notebooks, an episode each half minute: 1,000 Events a minute).
    clock.advance(30)
    assert episode() == [[], [], []]
    clock.advance(WARN_EVERY_SECONDS - 30)
    assert episode() == [[], ["event"], []]
    clock.advance(60)
    assert episode() == [[], [], []]


def test_an_event_saying_the_guard_evicts_is_never_held_back() -> None:
    clock = Clock()
    guard = Guard(grace=1, clock=clock.monotonic)
    pods = {"e": guarded("e", "strict")}
    over, under = report({"e": 12 * GIB}), report({"e": 9 * GIB})
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event", "evict"]
    guard.observe(under, pods, POLICIES, NAMESPACES)  # the eviction is refused; it comes back
    clock.advance(10)
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event", "evict"]


def test_event_names_the_usage_the_declaration_and_the_gpu() -> None:
    guard = Guard(grace=1)
    (verdict,) = guard.observe(
        report({"a": 12 * GIB}), {"a": guarded("a", "std")}, POLICIES, NAMESPACES
    )
    assert (verdict.namespace, verdict.name, verdict.uid) == ("ns-std", "a", "a")
    assert "12.0 GiB" in verdict.message
    assert "10.0 GiB" in verdict.message
    assert "gpu 0 (NVIDIA A100-PCIE-40GB)" in verdict.message
    assert names.GPU_MEMORY in verdict.message


def test_evict_only_under_an_evict_policy() -> None:
    guard = Guard(grace=1)
    pods = {uid: guarded(uid, name) for uid, name in (("e", "strict"), ("w", "std"), ("o", "lax"))}
    pods["n"] = guarded("n", "no-such-policy")
    verdicts = guard.observe(report(dict.fromkeys(pods, 12 * GIB)), pods, POLICIES, NAMESPACES)
    assert sorted((v.uid, v.kind) for v in verdicts) == [
        ("e", "event"),
        ("e", "evict"),
        ("n", "event"),  # a missing policy never evicts
        ("w", "event"),
    ]
    again = guard.observe(report(dict.fromkeys(pods, 12 * GIB)), pods, POLICIES, NAMESPACES)
    assert again == []  # evicted once, warned once


def test_refused_eviction_is_retried() -> None:
    guard = Guard(grace=1)
    pods = {"e": guarded("e", "strict")}
    over = report({"e": 12 * GIB})
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event", "evict"]
    guard.eviction_refused("e")  # the API failed
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["evict"]


def test_an_event_that_could_not_be_recorded_is_retried() -> None:
    guard = Guard(grace=1, clock=Clock().monotonic)
    pods = {"w": guarded("w", "std")}
    over = report({"w": 12 * GIB})
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event"]
    guard.event_failed("w")  # the apiserver was unreachable: not held back as just sent
    assert [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)] == ["event"]
    assert guard.observe(over, pods, POLICIES, NAMESPACES) == []  # recorded now: once per episode


def test_mig_usage_and_pods_without_declarations() -> None:
    guard = Guard(grace=1)
    undeclared = pod("u", "u")
    verdicts = guard.observe(
        report({"a": 12 * GIB, "u": 30 * GIB}, mig=True),
        {"a": guarded("a", "std"), "u": undeclared},
        POLICIES,
        NAMESPACES,
    )
    assert [(v.uid, v.kind) for v in verdicts] == [("a", "event")]
    assert "MIG 3g.20gb" in verdicts[0].message


def test_memory_in_a_pods_own_mig_slice_is_not_held_against_its_shared_declaration() -> None:
    # "train" has a shared replica and declares 10Gi; "infer" has its own MIG slice,
    # which declares nothing (the webhook declares for shared containers only).
    guard = Guard(grace=1)
    mixed = guarded("m", "strict")
    infer = copy.deepcopy(mixed["spec"]["containers"][0])
    infer["name"] = "infer"
    infer["resources"] = {"limits": {"nvidia.com/mig-3g.20gb": "1"}}
    mixed["spec"]["containers"].append(infer)
    status = report({"m": 15 * GIB}, mig=True)  # in the slice: its own memory
    shared_gpu = replace(status.gpus[0], index=1, uuid="GPU-2", mig_enabled=False,
                         mig_devices=[], pods=[PodUsage(uid="m", namespace="ns", name="m",
                                                        used_bytes=4 * GIB)])  # fmt: skip
    status = replace(status, gpus=[status.gpus[0], shared_gpu])
    assert guard.observe(status, {"m": mixed}, POLICIES, NAMESPACES) == []
    # Over its declaration on the shared GPU, it is still judged there.
    over = replace(shared_gpu, pods=[replace(shared_gpu.pods[0], used_bytes=12 * GIB)])
    status = replace(status, gpus=[status.gpus[0], over])
    verdicts = guard.observe(status, {"m": mixed}, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event", "evict"]
    assert "on gpu 1" in verdicts[0].message


def test_terminating_pods_are_not_evicted_again() -> None:
    guard = Guard(grace=1)
    leaving = guarded("e", "strict")
    leaving["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    leaving["metadata"]["deletionGracePeriodSeconds"] = 30  # within the guard's bound
    verdicts = guard.observe(report({"e": 12 * GIB}), {"e": leaving}, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event"]


def test_guard_action_defaults_to_warn() -> None:
    assert guard_action(pod("x", "x", namespace="plain"), POLICIES, NAMESPACES) == "warn"
    assert guard_action(guarded("x", "no-such-policy"), POLICIES, NAMESPACES) == "warn"
    assert guard_action(guarded("x", "strict"), POLICIES, NAMESPACES) == "evict"
    with pytest.raises(ValueError, match="grace"):
        Guard(grace=0)


def patched(uid: str, namespace_policy: str, annotated: str) -> dict[str, Any]:
    """A pod whose tenant (role ``edit``) rewrote the policy annotation after admission."""
    tampered = guarded(uid, namespace_policy)
    tampered["metadata"]["annotations"][names.ANNOTATION_POLICY] = annotated
    return tampered


def test_a_patched_policy_annotation_does_not_switch_the_guard_off() -> None:
    # Issue 7: "changing headroom.dev/policy on a pod switches the guard off".
    guard = Guard(grace=1)
    pods = {"e": patched("e", "strict", annotated="lax")}
    verdicts = guard.observe(report({"e": 12 * GIB}), pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event", "evict"]
    assert "policy guard is evict" in verdicts[0].message


def test_the_namespace_decides_even_against_a_stricter_annotation() -> None:
    # The annotation is the tenant's to write, so it says nothing about the admin's
    # intent: a namespace relabelled to a laxer policy applies to its running pods.
    guard = Guard(grace=1)
    pods = {"w": patched("w", "std", annotated="strict")}
    verdicts = guard.observe(report({"w": 12 * GIB}), pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event"]
    relabelled = NAMESPACES | {"ns-std": namespace("ns-std", "lax")}
    pods = {"o": patched("o", "std", annotated="strict")}
    assert guard.observe(report({"o": 12 * GIB}), pods, POLICIES, relabelled) == []


def test_a_namespace_not_yet_seen_defers_the_verdict_never_weakens_it() -> None:
    # Before the namespace informer has listed, the policy is unknown: acting as
    # warn could be weaker than the namespace's evict, so the guard waits.
    guard = Guard(grace=2)
    pods = {"e": patched("e", "strict", annotated="lax")}
    over = report({"e": 12 * GIB})
    assert guard.observe(over, pods, POLICIES, {}) == []
    assert guard.observe(over, pods, POLICIES, {}) == []
    kinds = [v.kind for v in guard.observe(over, pods, POLICIES, NAMESPACES)]
    assert kinds == ["event", "evict"]  # the streak kept counting meanwhile
    assert guard_action(pods["e"], POLICIES, {}) is None


async def test_agent_evicts_a_pod_that_outgrows_its_declaration() -> None:
    """End to end through the agent's loop, on the simulated backend."""
    clock = Clock()
    leaky = guarded("nb", "strict", declared="4Gi")
    leaky["metadata"]["annotations"][names.ANNOTATION_SIMULATED_USAGE] = json.dumps(
        {"pattern": "leak", "base": "1Gi", "ratePerMinute": "6Gi"}
    )
    leaky["status"]["startTime"] = "2025-01-01T00:00:00Z"
    pods = {"ns-strict/nb": leaky}
    actions = ActionsDouble(refuse_evictions=1)
    agent = Agent(
        node_name="gpu-node-1",
        probe=SimulatedProbe(
            "gpu-node-1", pods=lambda: pods.values(), spec=GPUSpec(1, 40 * GIB), clock=clock.now
        ),
        reporter=Reporter(WriterDouble(), clock=clock.monotonic),
        guard=Guard(grace=2),
        actions=actions,
        pods=lambda: pods,
        policies=lambda: POLICIES,
        namespaces=lambda: NAMESPACES,
        clock=clock.now,
    )
    for _ in range(10):  # 4 GiB is passed at t = 30 s; ticks every 5 s
        await agent.tick()
        clock.advance(5)
    assert len(actions.events) == 1
    where, uid, reason, message = actions.events[0]
    assert (where, uid, reason) == ("ns-strict/nb", "nb", names.EVENT_REASON_OVER_MEMORY)
    assert "evicting" in message
    # t=35 s over, t=40 s confirmed: evicted, refused by a PodDisruptionBudget (a tenant
    # may write one over their own pod), so deleted: the namespace's policy says evict.
    assert actions.evictions == [("ns-strict", "nb", "nb")]
    assert actions.deletions == [("ns-strict", "nb", "nb")]
    assert actions.graces == [30, 30]
    rendered = agent.metrics.render().decode()
    assert 'headroom_agent_guard_actions_total{kind="evict-refused"} 1.0' in rendered
    assert 'headroom_agent_guard_actions_total{kind="delete"} 1.0' in rendered


def no_gpu(uid: str, namespace: str) -> dict[str, Any]:
    """A pod asking for no GPU resource, as one with NVIDIA_VISIBLE_DEVICES=all in its
    env or image would be (the runtime, not the device plugin, gives it the GPUs)."""
    bare = pod(uid, uid, namespace=namespace)
    bare["spec"]["containers"][0]["resources"] = {}
    return bare


def gpus(
    usage: dict[int, dict[str, int]], allocated: dict[int, set[str]] | None = None
) -> ReportStatus:
    """A node whose GPU ``index`` holds ``{uid: bytes}``; ``allocated``: what kubelet gave."""
    given = allocated or {}
    return ReportStatus(
        node_name="gpu-node-1",
        backend="nvml",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        gpus=[
            GPUUsage(
                index=index,
                uuid=f"GPU-{index}",
                total_bytes=40 * GIB,
                used_bytes=sum(held.values()),
                free_bytes=max(40 * GIB - sum(held.values()), 0),
                pods=[
                    PodUsage(
                        uid=uid,
                        namespace="ns",
                        name=uid,
                        used_bytes=used,
                        allocated=uid in given.get(index, set()),
                    )
                    for uid, used in held.items()
                ],
            )
            for index, held in usage.items()
        ],
    )


def test_a_pod_asking_for_no_gpu_counts_as_declaring_0_on_a_shared_node() -> None:
    # NVIDIA_VISIBLE_DEVICES=all reaches every GPU without a GPU resource (README,
    # "Hardening the NVIDIA stack"); the shared pod "a" makes this a shared GPU node.
    guard = Guard(grace=1)
    pods = {"a": guarded("a", "std"), "env": no_gpu("env", "ns-strict")}
    verdicts = guard.observe(gpus({0: {"a": 2 * GIB, "env": 20 * GIB}}), pods, POLICIES, NAMESPACES)
    assert [(v.uid, v.kind) for v in verdicts] == [("env", "event"), ("env", "evict")]
    assert verdicts[0].message.startswith(
        "uses 20.0 GiB of GPU memory on gpu 0 and asks for no GPU, so it counts as declaring 0"
    )


def test_a_pod_asking_for_no_gpu_in_a_namespace_without_a_policy_is_only_warned() -> None:
    # System pods (the device plugin, monitoring) live in namespaces no policy names.
    guard = Guard(grace=1)
    pods = {"a": guarded("a", "std"), "sys": no_gpu("sys", "plain")}
    verdicts = guard.observe(gpus({0: {"a": GIB, "sys": GIB}}), pods, POLICIES, NAMESPACES)
    assert [(v.uid, v.kind) for v in verdicts] == [("sys", "event")]


def test_pods_asking_for_no_gpu_are_left_alone_where_no_pod_shares_a_gpu() -> None:
    # A whole-GPU node: nothing there is charged by declared memory.
    guard = Guard(grace=1)
    whole = pod("w", "w", namespace="ns-strict", resource="nvidia.com/gpu")
    pods = {"w": whole, "env": no_gpu("env", "ns-strict")}
    assert (
        guard.observe(gpus({0: {"w": 30 * GIB, "env": 5 * GIB}}), pods, POLICIES, NAMESPACES) == []
    )


def test_a_failed_pod_asking_for_a_slot_does_not_make_a_whole_gpu_node_shared() -> None:
    # A tenant's MIG pod with nodeName preset on a whole-GPU node: kubelet fails it
    # (no such resource there), the apiserver keeps it.
    guard = Guard(grace=1)
    whole = pod("w", "w", namespace="ns-strict", resource="nvidia.com/gpu")
    failed = pod("f", "f", namespace="ns-lax", resource="nvidia.com/mig-1g.5gb", phase="Failed")
    pods = {"w": whole, "env": no_gpu("env", "ns-strict"), "f": failed}
    report = gpus({0: {"w": 30 * GIB, "env": 5 * GIB}})
    assert guard.observe(report, pods, POLICIES, NAMESPACES) == []


def test_usage_beside_a_plain_init_containers_gpu_is_not_judged_by_allocation() -> None:
    # kubelet's PodResources lists app and sidecar containers' devices only: a plain
    # init container's GPU looks unallocated, and holding memory there is no proof.
    guard = Guard(grace=1)
    warm = guarded("o", "strict")
    init = copy.deepcopy(warm["spec"]["containers"][0])
    init["name"] = "warm-up"
    warm["spec"]["initContainers"] = [init]
    report = gpus({0: {"o": 2 * GIB}, 1: {"o": 8 * GIB}}, allocated={0: {"o"}})
    assert guard.observe(report, {"o": warm}, POLICIES, NAMESPACES) == []


def test_usage_on_a_gpu_kubelet_did_not_allocate_counts_against_the_pod() -> None:
    # Within its 10 GiB on each GPU, but kubelet gave it gpu 0 only.
    guard = Guard(grace=1)
    pods = {"o": guarded("o", "strict")}
    report = gpus({0: {"o": 10 * GIB}, 1: {"o": 10 * GIB}}, allocated={0: {"o"}})
    verdicts = guard.observe(report, pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts] == ["event", "evict"]
    assert verdicts[0].message.startswith(
        "uses 10.0 GiB of GPU memory on gpu 1, a GPU kubelet did not allocate to it"
    )


def test_without_allocations_the_total_across_gpus_counts_against_the_pod() -> None:
    # kubelet's PodResources unreadable: one shared replica cannot hold 2 GPUs' worth.
    guard = Guard(grace=1)
    pods = {"o": guarded("o", "std")}
    verdicts = guard.observe(
        gpus({0: {"o": 6 * GIB}, 1: {"o": 6 * GIB}}), pods, POLICIES, NAMESPACES
    )
    assert [v.kind for v in verdicts] == ["event"]
    assert verdicts[0].message.startswith(
        "uses 12.0 GiB of GPU memory across 2 GPUs, above its declared 10.0 GiB per GPU"
    )


def test_a_pod_within_its_declaration_on_each_gpu_it_was_given_is_not_over() -> None:
    guard = Guard(grace=1)
    two = guarded("t", "strict")
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] = "2"
    report = gpus({0: {"t": 10 * GIB}, 1: {"t": 10 * GIB}}, allocated={0: {"t"}, 1: {"t"}})
    assert guard.observe(report, {"t": two}, POLICIES, NAMESPACES) == []
    unlocated = gpus({0: {"t": 10 * GIB}, 1: {"t": 10 * GIB}})
    assert guard.observe(unlocated, {"t": two}, POLICIES, NAMESPACES) == []


def test_a_pod_admitted_with_a_count_past_the_most_is_still_guarded() -> None:
    # A pod admitted before the admission policy refused counts above 1024: the
    # extender charges it as 1024; the guard must still hold it to its declaration.
    guard = Guard(grace=1)
    huge = guarded("a", "strict")
    for section in ("limits",):
        huge["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu.shared"] = str(
            2**64 + 1
        )
    actions = guard.observe(report({"a": 12 * GIB}), {"a": huge}, POLICIES, NAMESPACES)
    assert actions, "the guard had no measure for the pod"


def test_a_pod_that_frees_everything_between_bursts_is_acted_on() -> None:
    # Absent from the report on the low ticks (its processes exited), the pod's
    # episode was dropped each time, so the streak never reached the grace.
    guard = Guard(grace=2)
    pods = {"a": guarded("a", "strict")}
    verdicts = []
    for used in (30, None, 30, None, 30):
        usage = {} if used is None else {"a": used * GIB}
        verdicts += guard.observe(report(usage), pods, POLICIES, NAMESPACES)
    assert [v.kind for v in verdicts][:2] == ["event", "evict"]


def test_an_episode_that_lasts_is_warned_of_once_the_five_minutes_are_up() -> None:
    """A pod warned of a short episode, then over again at once and for good, is warned of
    the lasting one when the five minutes are up: a tenant's brief small overrun must not
    stand for the big one that follows (say, on a GPU kubelet never gave it)."""
    clock = Clock()
    guard = Guard(grace=2, clock=clock.monotonic)
    pods = {"a": guarded("a", "std")}
    over, under = report({"a": 12 * GIB}), report({"a": 9 * GIB})
    kinds = [[v.kind for v in guard.observe(r, pods, POLICIES, NAMESPACES)] for r in (over, over)]
    assert kinds == [[], ["event"]]
    for _ in range(2):
        clock.advance(5)
        guard.observe(under, pods, POLICIES, NAMESPACES)  # the episode ends
    bigger = report({"a": 30 * GIB})
    events = []
    for _ in range(120):  # ten minutes over, a tick every 5 s
        clock.advance(5)
        events += [
            (clock.seconds, v.message)
            for v in guard.observe(bigger, pods, POLICIES, NAMESPACES)
            if v.kind == "event"
        ]
    assert len(events) == 1, events
    assert events[0][0] >= WARN_EVERY_SECONDS
    assert "30" in events[0][1]
