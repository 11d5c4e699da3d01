"""Binds through a storm (issue 7): timeouts, retries elsewhere, a lagging watch, reads.

The apiserver is :class:`tests.extender.conftest.RecordingBinder` (its ``bound``
is the truth: a binding lands at most once per pod, later ones get 409) and
:class:`~tests.extender.conftest.PodReader` (``GET pod``).
"""

import asyncio
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.state import ClusterState
from extender.verbs import Extender
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from headroom.claims import parse_claim
from tests.extender.conftest import MARGIN, Clock, Harness, PodReader, RecordingBinder
from tests.extender.objects import GIB, gpu_node, gpu_pod, uid_of

TIMEOUT = "apiserver unreachable: read timed out"


def args(pod: dict[str, Any], node: str) -> ExtenderBindingArgs:
    meta = pod["metadata"]
    return ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=node
    )


def setup(h: Harness, *pods: dict[str, Any]) -> None:
    for name in ("gpu-a", "gpu-b"):
        h.state.on_node("ADDED", gpu_node(name))
    for pod in pods:
        h.state.on_pod("ADDED", pod)
        h.reader.put(pod)


async def test_a_retry_after_a_timeout_that_landed_converges(harness: Harness) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain, harness.binder.lands = TIMEOUT, True, True
    first = await harness.extender.bind(args(pod, "gpu-a"))
    assert first.Error.endswith(TIMEOUT)
    harness.binder.fail_with = ""
    # kube-scheduler forgot the pod and retries: same node, it is told the bind stands.
    assert (await harness.extender.bind(args(pod, "gpu-a"))).Error == ""
    # Elsewhere: told where it is, not "already being bound" for a minute.
    again = await harness.extender.bind(args(pod, "gpu-b"))
    assert again.Error == "pod research/p is already bound to gpu-a"
    # Charged on gpu-a only, where the read found it, until the watch confirms it.
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert [c.uid for c in harness.state.claims_on("gpu-a")] == [uid_of(pod)]
    assert list(harness.state.claims_on("gpu-b")) == []
    harness.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "gpu-a"}})
    assert harness.state.assumed == {}


async def test_a_retry_elsewhere_after_a_lost_bind_charges_both_until_one_lands(
    harness: Harness,
) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-a"))
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    harness.binder.fail_with = ""
    assert (await harness.extender.bind(args(pod, "gpu-b"))).Error == ""
    # Landed on gpu-b: the earlier try can no longer land, so gpu-a is released.
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-b"}
    assert harness.binder.bound == {("research", "p"): "gpu-b"}


async def test_a_pod_is_not_refused_for_its_own_unconfirmed_bind(harness: Harness) -> None:
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-a"))
    other = gpu_pod("q", declared="30Gi")
    harness.state.on_pod("ADDED", other)
    filter_args = ExtenderArgs(Pod=pod, NodeNames=["gpu-a"])
    assert harness.extender.filter(filter_args).NodeNames == ["gpu-a"]  # its own hold
    assert harness.extender.filter(ExtenderArgs(Pod=other, NodeNames=["gpu-a"])).NodeNames == []


async def test_only_a_read_releases_a_lost_bind_never_the_clock(harness: Harness) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-a"))
    harness.clock.now += 3600
    harness.reader.fail = True  # the apiserver cannot say: nothing is released
    assert await harness.extender.verify_due() == 0
    assert uid_of(pod) in harness.state.assumed
    harness.reader.fail = False
    assert await harness.extender.verify_due() == 1  # read as unbound: released
    assert harness.state.assumed == {}


async def test_a_read_that_finds_the_pod_bound_charges_it_there(harness: Harness) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain, harness.binder.lands = TIMEOUT, True, True
    await harness.extender.bind(args(pod, "gpu-a"))
    harness.clock.now += 11
    assert await harness.extender.verify_due() == 0
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert [c.uid for c in harness.state.claims_on("gpu-a")] == [uid_of(pod)]


async def test_a_stale_read_never_brings_a_deleted_pod_back(harness: Harness) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.bound[("research", "p")] = "gpu-a"  # the read will say: bound to gpu-a
    harness.state.on_pod("DELETED", pod)  # ... but the watch has already seen it go
    harness.state.remember(parse_claim(pod))
    result = await harness.extender.bind(args(pod, "gpu-a"))  # 409, then the read
    assert result.Error == ""
    assert uid_of(pod) not in harness.state.pods
    harness.reader.pods.clear()  # the apiserver has no such pod any more
    harness.clock.now += 11
    await harness.extender.verify_due()
    assert harness.state.assumed == {}
    assert list(harness.state.claims_on("gpu-a")) == []


async def test_a_recreated_pod_releases_the_old_uid(harness: Harness) -> None:
    pod = gpu_pod("p", declared="10Gi", uid="old")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-a"))
    harness.reader.put(gpu_pod("p", declared="10Gi", uid="new"))  # a StatefulSet's next pod
    harness.clock.now += 11
    assert await harness.extender.verify_due() == 1
    assert harness.state.assumed == {}


async def test_bind_refuses_pods_of_other_schedulers_and_without_gpus(harness: Harness) -> None:
    foreign = gpu_pod("kai", declared="1Gi")
    foreign["spec"]["schedulerName"] = "kai-scheduler"
    plain = gpu_pod("cpu", declared=None, shared=0)
    setup(harness, foreign, plain)
    refused = await harness.extender.bind(args(foreign, "gpu-a"))
    assert "spec.schedulerName is kai-scheduler, not headroom-scheduler" in refused.Error
    harness.extender.state.remember(parse_claim(plain))  # as a filter request would
    refused = await harness.extender.bind(args(plain, "gpu-a"))
    assert "binds only pods asking for a shared GPU" in refused.Error
    assert harness.binder.calls == []


Step = tuple[str, int, int]
"""(what, pod index, node index): bind-ok, bind-lost, bind-landed, watch, verify, delete."""

steps = st.lists(
    st.tuples(
        st.sampled_from(["bind-ok", "bind-lost", "bind-landed", "watch", "verify", "delete"]),
        st.integers(0, 7),
        st.integers(0, 1),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.lists(st.sampled_from([6, 10, 16, 20]), min_size=8, max_size=8))
def test_no_interleaving_over_commits_a_gpu(sequence: list[Step], sizes: list[int]) -> None:
    """Whatever the apiserver answers and whenever the watch delivers, the bindings
    the apiserver holds never declare more than a GPU has."""
    asyncio.run(_interleave(sequence, sizes))


async def _interleave(sequence: list[Step], sizes: list[int]) -> None:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    binder = RecordingBinder()
    reader = PodReader(binder)
    extender = Extender(state, binder, reader=reader)
    nodes = ["gpu-a", "gpu-b"]
    for name in nodes:
        state.on_node("ADDED", gpu_node(name))
    pods = [gpu_pod(f"p{i}", declared=f"{size}Gi") for i, size in enumerate(sizes)]
    for pod in pods:
        state.on_pod("ADDED", pod)
        reader.put(pod)
    deleted: set[int] = set()
    rng = random.Random(len(sequence))
    for what, index, node_index in sequence:
        pod, node = pods[index], nodes[node_index]
        key = ("research", pod["metadata"]["name"])
        if index in deleted:
            continue
        if what.startswith("bind"):
            binder.fail_with = "" if what == "bind-ok" else TIMEOUT
            binder.uncertain = what != "bind-ok"
            binder.lands = what == "bind-landed"
            await extender.bind(args(pod, node))
        elif what == "watch" and key in binder.bound:  # the watch catches up, late
            state.on_pod(
                "MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": binder.bound[key]}}
            )
        elif what == "verify":
            clock.now += rng.choice([1, 11, 600])
            await extender.verify_due()
        elif what == "delete":
            deleted.add(index)
            binder.bound.pop(key, None)
            reader.pods.pop(key)
            state.on_pod("DELETED", pod)
        for name in nodes:
            on_node = [
                sizes[i]
                for i, p in enumerate(pods)
                if binder.bound.get(("research", p["metadata"]["name"])) == name
            ]
            assert sum(on_node) * GIB <= 40 * GIB - MARGIN, (name, on_node)
