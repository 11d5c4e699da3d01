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
from extender.verbs import BindError, Extender
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
    assert uid_of(pod) not in harness.state.pods
    # Where the read said it was bound it is charged for its grace period, as a pod
    # deleted before kubelet stopped it; then nothing of it is left.
    assert [c.uid for c in harness.state.claims_on("gpu-a")] == [uid_of(pod)]
    harness.clock.now += 60
    harness.state.refresh(harness.clock.now)
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


def filled(h: Harness, pod: dict[str, Any]) -> list[str]:
    """The nodes a 30Gi pod still fits on, by the filter: none while 30Gi is charged."""
    other = gpu_pod("q", declared="30Gi")
    h.state.on_pod("ADDED", other)
    return h.extender.filter(ExtenderArgs(Pod=other, NodeNames=["gpu-a"])).NodeNames or []


async def test_a_conflict_keeps_the_charge_when_the_read_cannot_say_where(
    harness: Harness,
) -> None:
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain, harness.binder.lands = TIMEOUT, True, True
    await harness.extender.bind(args(pod, "gpu-a"))  # stored, its answer lost
    harness.binder.fail_with = ""
    harness.reader.fail = True  # the slow apiserver cannot answer the read after the 409
    retry = await harness.extender.bind(args(pod, "gpu-a"))
    assert "409" in retry.Error
    # A 409 says the pod is bound: the charge stays until something says where.
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert filled(harness, pod) == []


async def test_a_refused_retry_keeps_the_charge_of_an_earlier_try_still_in_flight(
    harness: Harness,
) -> None:
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)
    gate = asyncio.Event()
    answers = iter(["wait", "refuse"])

    async def binder(namespace: str, name: str, uid: str, node: str) -> None:
        if next(answers) == "refuse":  # API Priority and Fairness: a definite 429
            raise BindError("HTTP 429: Too many requests", uncertain=False)
        await gate.wait()  # the first POST: kube-scheduler gave up on it long ago
        harness.binder.bound[(namespace, name)] = node

    harness.extender.binder = binder
    first = asyncio.create_task(harness.extender.bind(args(pod, "gpu-a")))
    await asyncio.sleep(0)
    assert "429" in (await harness.extender.bind(args(pod, "gpu-a"))).Error
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}  # the first may still land
    gate.set()
    assert (await first).Error == ""
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert filled(harness, pod) == []


async def test_a_read_waits_for_the_last_binding_post_not_the_first_hold(
    harness: Harness,
) -> None:
    # kube-scheduler retries after 1, 2, 4 s; each POST times out unanswered and
    # the last is still queued at the apiserver when the first hold turns 10 s old.
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    for backoff in (0, 4, 5):
        harness.clock.now += backoff
        await harness.extender.bind(args(pod, "gpu-a"))
    harness.clock.now += 1.5  # 10.5 s after the first POST, 1.5 s after the last
    assert await harness.extender.verify_due() == 0
    assert harness.reader.reads == 0
    harness.binder.bound[("research", "p")] = "gpu-a"  # the last POST is stored now
    assert filled(harness, pod) == []
    harness.clock.now += 10
    assert await harness.extender.verify_due() == 0  # read: bound there, charged there
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}


async def test_a_read_answered_before_a_bind_that_landed_meanwhile_releases_nothing(
    harness: Harness,
) -> None:
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-a"))  # lost: unbound, held
    harness.binder.fail_with = ""
    harness.clock.now += 11
    sent, answer = asyncio.Event(), asyncio.Event()
    stale = {**pod, "spec": {**pod["spec"]}}  # unbound, as the apiserver had it

    async def slow_read(namespace: str, name: str) -> dict[str, Any] | None:
        sent.set()
        await answer.wait()
        return stale

    harness.extender.reader = slow_read
    verify = asyncio.create_task(harness.extender.verify_due())
    await sent.wait()
    assert (await harness.extender.bind(args(pod, "gpu-a"))).Error == ""  # lands now
    answer.set()
    assert await verify == 0
    assert set(harness.state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert filled(harness, pod) == []


async def test_a_pod_the_watch_shows_bound_while_its_read_is_out_is_not_bound_again(
    harness: Harness,
) -> None:
    pod = gpu_pod("p", declared="10Gi")
    setup(harness, pod)
    harness.binder.fail_with, harness.binder.uncertain = TIMEOUT, True
    await harness.extender.bind(args(pod, "gpu-b"))  # lost: held on gpu-b
    harness.binder.fail_with = ""

    async def slow_read(namespace: str, name: str) -> dict[str, Any] | None:
        # Another binder (a scheduler replica mid hand-over) bound it; the watch says
        # so before the read, served earlier, comes back unbound.
        harness.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "gpu-a"}})
        return pod

    harness.extender.reader = slow_read
    assert (await harness.extender.bind(args(pod, "gpu-a"))).Error == ""
    assert harness.binder.calls == []  # no second binding POST
    assert harness.state.assumed == {}  # the cache charges it on gpu-a now


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
"""(what, pod index, node index). Binds: ok; lost (timed out, not stored); landed
(timed out, stored); late (timed out, stored at a later ``commit`` unless it comes
``LATE_LIMIT`` s after the POST); refused (a definite 429). Then the watch
catching up, a verify tick (time passes), a deletion, reads starting or ending
to fail, and the late POSTs being stored."""

LATE = "apiserver unreachable: no answer within 3.0s"
LATE_LIMIT = 7.0
"""How long after its start a timed-out POST may still be stored, in this model:
the binder gives up after 3 s, and the apiserver's storage with it."""

KINDS = ["bind-ok", "bind-lost", "bind-landed", "bind-late", "bind-refused"]
KINDS += ["watch", "verify", "delete", "reads", "commit"]

steps = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
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
    late: list[tuple[tuple[str, str], str, float]] = []  # POSTs the apiserver may yet store

    async def post(namespace: str, name: str, uid: str, node: str) -> None:
        if binder.fail_with == LATE and (namespace, name) not in binder.bound:
            late.append(((namespace, name), node, clock.now))
        await binder(namespace, name, uid, node)

    extender = Extender(state, post, reader=reader)
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
        if what == "reads":
            reader.fail = not reader.fail
        elif what == "commit":
            for late_key, late_node, _ in late:
                binder.bound.setdefault(late_key, late_node)
            late.clear()
        if index in deleted:
            continue
        if what.startswith("bind"):
            binder.fail_with = {
                "bind-ok": "", "bind-late": LATE, "bind-refused": "HTTP 429: Too many requests"
            }.get(what, TIMEOUT)  # fmt: skip
            binder.uncertain = what not in ("bind-ok", "bind-refused")
            binder.lands = what == "bind-landed"
            await extender.bind(args(pod, node))
        elif what == "watch" and key in binder.bound:  # the watch catches up, late
            state.on_pod(
                "MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": binder.bound[key]}}
            )
        elif what == "verify":
            clock.now += rng.choice([1, 11, 600])
            late = [(k, n, sent) for k, n, sent in late if sent + LATE_LIMIT > clock.now]
            await extender.verify_due()
        elif what == "delete":
            deleted.add(index)
            late = [(k, n, sent) for k, n, sent in late if k != key]
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


async def test_a_wall_clock_step_does_not_make_a_timed_out_post_due_for_its_read() -> None:
    # NTP steps the wall clock a minute ahead just after a binding POST timed out,
    # still queued at the apiserver: a read now finds the pod unbound, and releasing
    # on it would let q onto the room the POST is about to take.
    wall, steady = Clock(), Clock(now=1000.0)
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=wall, hold_clock=steady)
    binder = RecordingBinder(fail_with=TIMEOUT, uncertain=True)
    reader = PodReader(binder)
    extender = Extender(state, binder, ready=lambda: True, reader=reader)
    pod = gpu_pod("p", declared="30Gi")
    state.on_node("ADDED", gpu_node("gpu-a"))
    state.on_pod("ADDED", pod)
    reader.put(pod)
    await extender.bind(args(pod, "gpu-a"))
    wall.now += 60
    assert await extender.verify_due() == 0
    assert reader.reads == 0
    assert set(state.assumed[uid_of(pod)]) == {"gpu-a"}
    steady.now += 10  # verify_after by the monotonic clock: now a read may release it
    assert await extender.verify_due() == 1
    assert state.assumed == {}
