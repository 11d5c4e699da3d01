"""Faults never raise headroom (issue 7): stale, unavailable, failing, forged reports."""

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.state import ClusterState
from headroom import names
from headroom.claims import parse_claim
from headroom.reports import (
    CONDITION_NVML_AVAILABLE,
    Condition,
    PodUsage,
    parse_report,
    report_object,
)
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, stopped, uid_of

T4_MIB = 16 * 1024


def state_with(node: dict[str, Any], *pods: dict[str, Any]) -> tuple[ClusterState, Clock]:
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", node)
    for pod in pods:
        state.on_pod("ADDED", pod)
    return state, clock


def headroom(state: ClusterState, node: str = "gpu-a") -> int:
    state.refresh(state.clock())
    account = state.account(node)
    assert account is not None
    return account.shared_headroom


def unavailable(node: str, at_age: float = 0.0) -> dict[str, Any]:
    status = parse_report(gpu_report(node, {}, age=at_age))
    condition = Condition(type=CONDITION_NVML_AVAILABLE, status="False", reason="DriverGone")
    return report_object(replace(status, gpus=[], conditions=[condition]))


def test_nvml_unavailable_or_silence_keeps_what_was_observed() -> None:
    # The figures: a 6Gi pod holding 30Gi plus 4Gi unattributed on a 40 GiB GPU.
    pod = gpu_pod("leaky", node="gpu-a", declared="6Gi")
    state, clock = state_with(gpu_node("gpu-a"), pod)
    state.on_report(
        "ADDED", gpu_report("gpu-a", {0: {uid_of(pod): 30 * GIB}}, unattributed={0: 4 * GIB})
    )
    measured = headroom(state)
    assert measured == 40 * GIB - 34 * GIB - MARGIN  # 5.5 GiB
    state.on_report("MODIFIED", unavailable("gpu-a"))
    assert headroom(state) == measured  # was 33.5 GiB in 0.1
    clock.now += 91  # and 91 s of silence
    assert headroom(state) == measured
    state.on_report("DELETED", gpu_report("gpu-a", {}))
    assert headroom(state) == measured


def test_a_forged_total_is_capped_at_the_label() -> None:
    state, _ = state_with(gpu_node("gpu-a", memory_mib=T4_MIB))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}}, total_mib=1024 * 1024))
    assert headroom(state) == 16 * GIB - MARGIN  # was 1023.5 GiB in 0.1
    account = state.account("gpu-a")
    assert account is not None
    assert "above nvidia.com/gpu.memory are not trusted" in account.note


def test_a_phantom_gpu_cannot_take_pods_off_the_real_one() -> None:
    pod = gpu_pod("p", node="gpu-a", declared="30Gi")
    state, _ = state_with(gpu_node("gpu-a"), pod)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 7: {uid_of(pod): GIB}}))
    assert headroom(state) == 10 * GIB - MARGIN  # charged to GPU 0, the only one
    account = state.account("gpu-a")
    assert account is not None
    assert [gpu.index for gpu in account.gpus] == [0]


Reading = tuple[int, int, bool]
"""One GPU in one report: (its pod's usage GiB, unattributed GiB, NVML error)."""
Report = tuple[str, tuple[Reading, Reading], int, int | None, int]
"""(kind, GPU 0 and GPU 1, total GiB, phantom GPU index or None, seconds before it),
kind fresh|stale|unavailable|gone."""

readings = st.tuples(st.integers(0, 40), st.integers(0, 8), st.booleans())
reports = st.lists(
    st.tuples(
        st.sampled_from(["fresh", "stale", "unavailable", "gone"]),
        st.tuples(readings, readings),
        # Forged totals: above the label (40 GiB) are not trusted; below it are believed.
        st.sampled_from([16, 40, 80, 1024]),
        # Forged GPUs: an index beyond nvidia.com/gpu.count=2, holding both pods.
        st.one_of(st.none(), st.integers(2, 7)),
        st.integers(0, 60),
    ),
    min_size=1,
    max_size=8,
)


def forged_or_failing(
    obj: dict[str, Any], errors: tuple[bool, bool], phantom: int | None, uids: list[str]
) -> dict[str, Any]:
    """``obj`` with NVML failing on the GPUs ``errors`` marks (zero figures, as the
    agent writes them) and, with ``phantom``, a GPU the node does not have that
    claims to hold both pods."""
    status = parse_report(obj)
    gpus = [
        replace(g, error="NVMLError_Unknown", pods=[], unattributed_bytes=0, used_bytes=0)
        if errors[g.index]
        else g
        for g in status.gpus
    ]  # fmt: skip
    if phantom is not None:
        fake = parse_report(gpu_report(status.node_name, {phantom: dict.fromkeys(uids, GIB)}))
        gpus += fake.gpus
    return report_object(replace(status, gpus=gpus))


@given(reports, st.integers(1, 20), st.integers(1, 20), st.integers(0, 120))
def test_no_sequence_of_reports_raises_headroom_above_the_last_observation(
    sequence: list[Report], declared0: int, declared1: int, wait: int
) -> None:
    """Oracle, per GPU: label total - margin - max(declared, last good usage) - last good
    unattributed, where a GPU's last good reading is the last fresh report that read it
    without an NVML error. Checked after every report, as filter would read it."""
    pods = [
        gpu_pod("p0", node="gpu-a", declared=f"{declared0}Gi"),
        gpu_pod("p1", node="gpu-a", declared=f"{declared1}Gi"),
    ]
    uids = [uid_of(pod) for pod in pods]
    declared = [declared0, declared1]
    state, clock = state_with(gpu_node("gpu-a", gpus=2), *pods)
    last = [(0, 0), (0, 0)]  # per GPU: (its pod's usage, unattributed) last read well

    def check() -> None:
        state.refresh(state.clock())
        account = state.account("gpu-a")
        assert account is not None
        # A phantom GPU never appears, and a failing one never blanks the node.
        assert [gpu.index for gpu in account.gpus] == [0, 1]
        for gpu in account.gpus:
            usage, spare = last[gpu.index]
            held = max(declared[gpu.index], usage) + spare
            assert gpu.headroom <= 40 * GIB - MARGIN - held * GIB, (gpu.index, account.note)

    for kind, gpus, total, phantom, gap in sequence:
        clock.now += gap
        if kind == "gone":
            state.on_report("DELETED", gpu_report("gpu-a", {}))
        elif kind == "unavailable":
            state.on_report("MODIFIED", unavailable("gpu-a"))
        else:
            report = gpu_report(
                "gpu-a",
                {i: {uids[i]: usage * GIB} for i, (usage, _, _) in enumerate(gpus)},
                unattributed={i: spare * GIB for i, (_, spare, _) in enumerate(gpus)},
                total_mib=total * 1024,
                at=EPOCH + timedelta(seconds=clock.now - Clock().now),
                age=0.0 if kind == "fresh" else 200.0,
            )
            errors = (gpus[0][2], gpus[1][2])
            state.on_report("MODIFIED", forged_or_failing(report, errors, phantom, uids))
            if kind == "fresh":
                for i, (usage, spare, error) in enumerate(gpus):
                    if not error:
                        last[i] = (usage, spare)
        check()
    clock.now += wait
    check()


def failing_gpu(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """``obj`` with NVML failing to read GPU ``index``: zero figures and an error."""
    status = parse_report(obj)
    gpus = [
        replace(g, error="NVMLError_Unknown", pods=[], unattributed_bytes=0, used_bytes=0)
        if g.index == index
        else g
        for g in status.gpus
    ]
    return report_object(replace(status, gpus=gpus))


def test_one_failing_gpu_keeps_its_last_reading_and_the_others_stay_measured() -> None:
    leaky = gpu_pod("leaky", node="gpu-a", declared="6Gi")
    small = gpu_pod("small", node="gpu-a", declared="2Gi")
    state, clock = state_with(gpu_node("gpu-a", gpus=2), leaky, small)
    usage = {0: {uid_of(leaky): 30 * GIB}, 1: {uid_of(small): GIB}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, unattributed={0: 4 * GIB}))
    clock.now += 5
    state.on_report(
        "MODIFIED", failing_gpu(gpu_report("gpu-a", usage, at=EPOCH + timedelta(seconds=5)), 0)
    )
    state.refresh(state.clock())
    account = state.account("gpu-a")
    assert account is not None
    gpu0, gpu1 = account.gpus
    # GPU 0: what it was last seen holding (30Gi + 4Gi) stays there, whichever GPU
    # kubelet gave leaky; and one more pod may be there: of two pods on two GPUs the
    # device plugin put one on each (headroom.spread), and with leaky on GPU 1 (its
    # 30Gi reaching GPU 0 through NVIDIA_VISIBLE_DEVICES) small is on GPU 0.
    assert gpu0.headroom == 40 * GIB - 36 * GIB - MARGIN
    # GPU 1 is still measured: its own pod at its declaration. The pod no readable GPU
    # shows any more was created once small was already on GPU 1, so the device
    # plugin gave it the emptier GPU 0 (headroom.spread) -- unless kubelet had
    # freed small first (its end reaches the report later): then leaky can be
    # here instead of small, 6Gi where 2Gi is charged, and GPU 1 is charged that.
    assert gpu1.headroom == 40 * GIB - 6 * GIB - MARGIN
    assert [p.charged for p in gpu1.pods] == [2 * GIB, 4 * GIB]
    assert "NVML error on GPU 0" in account.note
    # A second failing report does not forget GPU 0's last reading.
    clock.now += 5
    state.on_report(
        "MODIFIED", failing_gpu(gpu_report("gpu-a", usage, at=EPOCH + timedelta(seconds=10)), 0)
    )
    state.refresh(state.clock())
    again = state.account("gpu-a")
    assert again is not None
    assert again.gpus[0].headroom == gpu0.headroom


def test_a_gpu_missing_from_a_fresh_report_keeps_its_last_reading() -> None:
    # GPU 1 holds 34 GiB of a foreign process; a report that leaves GPU 1 out (an
    # agent bug, NVML listing 1 of 2, a forgery) must not read as GPU 1 empty.
    pod = gpu_pod("a", node="gpu-a", declared="2Gi")
    state, clock = state_with(gpu_node("gpu-a", gpus=2), pod)
    state.on_report(
        "ADDED", gpu_report("gpu-a", {0: {uid_of(pod): GIB}, 1: {}}, unattributed={1: 34 * GIB})
    )
    before = headroom(state)
    assert before == 40 * GIB - 34 * GIB - MARGIN
    for seconds in (5, 10):  # and a second such report does not forget it either
        clock.now += 5
        at = EPOCH + timedelta(seconds=seconds)
        state.on_report("MODIFIED", gpu_report("gpu-a", {0: {uid_of(pod): GIB}}, at=at))
        assert headroom(state) <= before
    account = state.account("gpu-a")
    assert account is not None
    assert [gpu.index for gpu in account.gpus] == [0, 1]
    assert "GPU 1 missing from the GPUNodeReport" in account.note


def carrying(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """``obj`` with NVML failing on GPU ``index``, the agent carrying its last figures."""
    status = parse_report(obj)
    gpus = [replace(g, error="NVMLError_Unknown") if g.index == index else g for g in status.gpus]
    return report_object(replace(status, gpus=gpus))


def test_a_restarted_extender_counts_the_figures_an_agent_carries() -> None:
    # The running extender remembers GPU 1's last reading; a restarted one only has
    # what the report carries for the GPU NVML fails on, and must count it.
    pod = gpu_pod("a", node="gpu-a", declared="2Gi")
    usage = {0: {uid_of(pod): GIB}, 1: {}}
    state, _ = state_with(gpu_node("gpu-a", gpus=2), pod)
    state.on_report("ADDED", carrying(gpu_report("gpu-a", usage, unattributed={1: 34 * GIB}), 1))
    assert headroom(state) <= 40 * GIB - 34 * GIB - MARGIN
    # NVML unavailable for the whole node: the agent carries every GPU, marked.
    status = parse_report(gpu_report("gpu-a", usage, unattributed={1: 34 * GIB}))
    down = Condition(type=CONDITION_NVML_AVAILABLE, status="False", reason="NVMLQueryFailed")
    gpus = [replace(g, error="NVMLQueryFailed") for g in status.gpus]
    restarted, _ = state_with(gpu_node("gpu-a", gpus=2), pod)
    restarted.on_report("ADDED", report_object(replace(status, gpus=gpus, conditions=[down])))
    assert headroom(restarted) <= 40 * GIB - 34 * GIB - MARGIN


def test_a_node_deleted_and_recreated_keeps_its_last_good_reading() -> None:
    # kubelet re-registers within pod GC's 40 s: the pods and the report stay, and
    # the 30 GiB leak the last good report saw must stay charged.
    pod = gpu_pod("leaky", node="gpu-a", declared="6Gi")
    node = gpu_node("gpu-a")
    state, _ = state_with(node, pod)
    state.on_report(
        "ADDED", gpu_report("gpu-a", {0: {uid_of(pod): 30 * GIB}}, unattributed={0: 4 * GIB})
    )
    state.on_report("MODIFIED", unavailable("gpu-a"))
    measured = headroom(state)
    assert measured == 40 * GIB - 34 * GIB - MARGIN
    state.on_node("DELETED", node)
    state.on_node("ADDED", node)
    assert headroom(state) == measured
    # Gone for good, with its pods and report: nothing of it is kept.
    state.on_node("DELETED", node)
    state.on_pod("DELETED", stopped(pod))
    state.on_report("DELETED", unavailable("gpu-a"))
    assert "gpu-a" not in state.last_good


def test_a_node_deleted_and_recreated_keeps_the_departures_it_saw() -> None:
    # Two GPUs, four unlocated 19Gi pods spread 2 + 2 by the device plugin; u2 and
    # u4 (both on GPU 1) leave. The departures tell the spread bound GPU 0 may
    # still hold two. Forgotten with the Node object, GPU 0 would be charged one.
    pods = [gpu_pod(f"u{i}", node="gpu-a", declared="19Gi") for i in (1, 2, 3, 4)]
    node = gpu_node("gpu-a", gpus=2)
    state, clock = state_with(node, *pods)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}))
    clock.now += 10
    state.on_pod("DELETED", stopped(pods[1]))
    state.on_pod("DELETED", stopped(pods[3]))
    later = EPOCH + timedelta(seconds=10)
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {}, 1: {}}, at=later))
    before = state.account("gpu-a")
    assert before is not None
    assert before.gpus[0].accounted == 38 * GIB
    state.on_node("DELETED", node)
    state.on_node("ADDED", node)
    after = state.account("gpu-a")
    assert after is not None
    assert [g.accounted for g in after.gpus] == [g.accounted for g in before.gpus]
    # A pod still held there (its bind not yet seen) keeps them too.
    waiting = gpu_pod("w", declared="1Gi")
    state.on_pod("ADDED", waiting)
    assert state.assume(parse_claim(waiting), "gpu-a").fits
    state.on_node("DELETED", node)
    for pod in (pods[0], pods[2]):
        state.on_pod("DELETED", stopped(pod))
    state.on_report("DELETED", gpu_report("gpu-a", {}))
    assert "gpu-a" in state.departures
    # Gone for good, with its pods and holds: nothing of it is kept.
    state.forget(uid_of(waiting))
    assert "gpu-a" not in state.departures


def relabelled(node: dict[str, Any], count: int) -> dict[str, Any]:
    """``node`` with its nvidia.com/gpu.count label changed, its capacity not."""
    labels = {**node["metadata"]["labels"], "nvidia.com/gpu.count": str(count)}
    return {**node, "metadata": {**node["metadata"], "labels": labels}}


def test_a_count_label_lowered_drops_no_measured_gpu() -> None:
    # GFD relabels 2 -> 1 while the device plugin still offers both GPUs (capacity 8
    # = 2 x 4 replicas): GPU 1's 34 GiB (a foreign process) still counts.
    pod = gpu_pod("a", node="gpu-a", declared="2Gi")
    node = gpu_node("gpu-a", gpus=2)
    state, _ = state_with(node, pod)
    state.on_report(
        "ADDED", gpu_report("gpu-a", {0: {uid_of(pod): GIB}, 1: {}}, unattributed={1: 34 * GIB})
    )
    before = headroom(state)
    state.on_node("MODIFIED", relabelled(node, 1))
    assert headroom(state) <= before == 40 * GIB - 34 * GIB - MARGIN
    account = state.account("gpu-a")
    assert account is not None
    assert [gpu.index for gpu in account.gpus] == [0, 1]


def test_a_count_label_raised_adds_no_room() -> None:
    # GFD relabels 2 -> 4 on a node with 2 GPUs: two phantom empty GPUs must not
    # loosen the bound on where four unlocated 15Gi pods can be.
    pods = [gpu_pod(f"p{i}", node="gpu-a", declared="15Gi") for i in range(4)]
    node = gpu_node("gpu-a", gpus=2)
    state, _ = state_with(node, *pods)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}))
    before = headroom(state)
    assert before < 15 * GIB  # a fifth could be the third on one GPU: 45 GiB of 40
    state.on_node("MODIFIED", relabelled(node, 4))
    assert headroom(state) <= before


def test_a_departure_from_a_gpu_the_node_does_not_have_is_counted_anywhere() -> None:
    # The device plugin put a, b, c (10Gi) on GPU 0 and p, q (512Mi) on GPU 1 of a
    # 2-GPU node; a report (a bug, a forgery) places p and q on "GPU 5". Their
    # departures, recorded there, would be counted nowhere, and GPU 0 charged 20Gi.
    node = gpu_node("gpu-a", gpus=2)
    sizes = {"a": "10Gi", "p": "512Mi", "b": "10Gi", "q": "512Mi", "c": "10Gi"}
    pods = {name: gpu_pod(name, node="gpu-a", declared=size) for name, size in sizes.items()}
    state, clock = state_with(node, *pods.values())
    beyond = {5: {uid_of(pods["p"]): 2**20, uid_of(pods["q"]): 2**20}}
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}, **beyond}))
    clock.now += 1
    for name in ("p", "q"):
        state.on_pod("DELETED", pods[name])
    assert [index for _, index in state.history("gpu-a").departures] == [None, None]
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].accounted >= 30 * GIB


def test_departures_count_across_a_skew_between_the_extender_and_the_apiserver() -> None:
    # The device plugin put a, b, c (10Gi) on GPU 0 and p, q on GPU 1; p and q left.
    # Departures carry the extender's clock, here 2 s behind the apiserver's that
    # stamps creations: they must still count, or GPU 0 is charged 20Gi, not 30.
    node = gpu_node("gpu-a", gpus=2)
    state, clock = state_with(node)
    sizes = {"a": "10Gi", "p": "512Mi", "b": "10Gi", "q": "512Mi", "c": "10Gi"}
    pods = {}
    for name, size in sizes.items():
        created = EPOCH + timedelta(seconds=10)  # the apiserver's clock
        pods[name] = gpu_pod(name, node="gpu-a", declared=size)
        pods[name]["metadata"]["creationTimestamp"] = created.isoformat()
        state.on_pod("ADDED", pods[name])
    clock.now = (EPOCH + timedelta(seconds=8)).timestamp()  # the extender's, 2 s behind
    for name in ("p", "q"):
        state.on_pod("DELETED", pods[name])
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].accounted >= 30 * GIB


def test_gpus_once_reported_on_different_numa_nodes_stay_apart() -> None:
    # Two 40 GiB GPUs reported on NUMA nodes 0 and 1; p0 (30 GiB) is held and not
    # located yet (the agent lost its PodResources socket, say). With the Topology
    # Manager on, p1 (30 GiB) could land beside it on GPU 0, and is refused. One
    # report putting both GPUs on NUMA node 0 (a firmware or agent fault) undid the
    # split: it replaced the last good report too, and p1 was admitted (60 GiB on 40).
    # A GPU is grouped with another only while no report since the node appeared
    # has said otherwise.
    state, clock = state_with(gpu_node("gpu-a", gpus=2))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}}, numa={0: 0, 1: 1}))
    p0, p1 = gpu_pod("p0", declared="30Gi"), gpu_pod("p1", declared="30Gi")
    for pod in (p0, p1):
        state.on_pod("ADDED", pod)
    assert state.assume(state.parse(p0), "gpu-a").fits
    assert not state.fit(state.parse(p1), "gpu-a").fits
    for i in (1, 2):
        clock.now += 10
        merged = gpu_report(
            "gpu-a", {0: {}, 1: {}}, numa={0: 0, 1: 0}, at=EPOCH + timedelta(seconds=10 * i)
        )
        state.on_report("MODIFIED", merged)
        assert not state.fit(state.parse(p1), "gpu-a").fits


def duplicated(obj: dict[str, Any], *, same_uuid: bool) -> dict[str, Any]:
    """The report with GPU 1's entry read from GPU 0 (its UUID and figures), or
    carrying GPU 0's index: a GPU listed twice."""
    status = parse_report(obj)
    g0, g1 = status.gpus
    twice = replace(g0, index=1) if same_uuid else replace(g1, index=0)
    return report_object(replace(status, gpus=[g0, twice]))


@pytest.mark.parametrize("same_uuid", [False, True], ids=["index-twice", "uuid-twice"])
def test_a_gpu_listed_twice_is_not_measured(same_uuid: bool) -> None:
    # 30 GiB held by a process of no known pod on the GPU the faulty report lists
    # twice or leaves out. Taking the last entry for an index, or GPU 0's reading for
    # GPU 1, raised its headroom from 9.5 to 39.5 GiB: the memory is still there.
    gpu = 1 if same_uuid else 0
    state, clock = state_with(gpu_node("gpu-a", gpus=2))
    good = gpu_report("gpu-a", {0: {}, 1: {}}, unattributed={gpu: 30 * GIB})
    state.on_report("ADDED", good)
    before = gpu_headroom(state, gpu)
    clock.now += 1
    state.on_report("MODIFIED", duplicated(good, same_uuid=same_uuid))
    assert gpu_headroom(state, gpu) <= before
    clock.now += 1  # and the good reading it kept is not replaced by the faulty one
    state.on_report("MODIFIED", duplicated(good, same_uuid=same_uuid))
    assert gpu_headroom(state, gpu) <= before


def gpu_headroom(state: ClusterState, index: int) -> int:
    state.refresh(state.clock())
    account = state.account("gpu-a")
    assert account is not None
    return {g.index: g.headroom for g in account.gpus}[index]


def test_departures_count_from_any_gpu_once_the_gpus_are_numbered_anew() -> None:
    # GPU 1 lost two located pods; then GPU 0 fell off the bus and the driver numbered
    # the rest anew (the old GPU 1 is now GPU 0). The departures, kept by index,
    # pointed at the wrong GPU: its neighbours' bound shrank. They now count from
    # any GPU, which never charges less (headroom.spread).
    pods = [gpu_pod(f"u{i}", node="gpu-a", declared="4Gi") for i in range(3)]
    state, clock = state_with(gpu_node("gpu-a", gpus=3), *pods)
    located = {0: {}, 1: {uid_of(pods[0]): GIB, uid_of(pods[1]): GIB}, 2: {}}
    state.on_report("ADDED", gpu_report("gpu-a", located))
    clock.now += 10
    for pod in pods[:2]:
        state.on_pod("DELETED", pod)
    assert [gpu for _, gpu in state.departures["gpu-a"]] == [1, 1]
    status = parse_report(gpu_report("gpu-a", {0: {}, 1: {}, 2: {}}))
    _, old1, old2 = status.gpus
    renumbered = replace(status, gpus=[replace(old1, index=0), replace(old2, index=1)])
    clock.now += 10
    state.on_report("MODIFIED", report_object(renumbered))
    assert [gpu for _, gpu in state.departures["gpu-a"]] == [None, None]


def test_a_gpu_index_no_node_has_makes_the_report_unreadable() -> None:
    # Index 2,000,000 with a NUMA node: the groups kept for the node, and worked out
    # again for every account of it, were two million GPUs long (seconds of the event
    # loop per account). Such a report is unreadable: it vouches for nothing.
    state, _ = state_with(gpu_node("gpu-a", gpus=2))
    good = gpu_report("gpu-a", {0: {}, 1: {}}, unattributed={0: 10 * GIB})
    state.on_report("ADDED", good)
    far = copy.deepcopy(good)
    far["status"]["gpus"][1].update(index=2_000_000, numaNode=0)
    state.on_report("MODIFIED", far)
    assert "gpu-a" not in state.reports
    account = state.account("gpu-a")
    assert account is not None
    assert account.source != "report"


def in_mig_mode(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """The report with GPU ``index`` said to be in MIG mode."""
    status = parse_report(obj)
    gpus = [replace(g, mig_enabled=True) if g.index == index else g for g in status.gpus]
    return report_object(replace(status, gpus=gpus))


def test_a_gpu_the_device_plugin_shares_is_not_taken_out_of_the_fit_by_a_mig_flag() -> None:
    # A time-slicing node (no MIG slice offered, both GPUs in nvidia.com/gpu.shared):
    # a 30 GiB pod on GPU 0, a 5 GiB one on GPU 1, each allocated there. A report
    # calling GPU 0 MIG-enabled made it no shared GPU: its 30 GiB pod stayed charged
    # there, but no newcomer was checked against it, and a second 30 GiB pod fitted
    # although the device plugin, balancing one replica each, may give it GPU 0.
    a = gpu_pod("a", node="gpu-a", declared="30Gi", phase="Running")
    b = gpu_pod("b", node="gpu-a", declared="5Gi", phase="Running")
    state, _ = state_with(gpu_node("gpu-a", gpus=2), a, b)
    status = parse_report(gpu_report("gpu-a", {0: {}, 1: {}}))
    allocated = [
        replace(g, pods=[PodUsage(uid=uid_of(p), used_bytes=0, allocated=True)])
        for g, p in zip(status.gpus, (a, b), strict=True)
    ]
    honest = report_object(replace(status, gpus=allocated))
    newcomer = parse_claim(gpu_pod("c", declared="30Gi"))
    state.on_report("ADDED", honest)
    assert not state.fit(newcomer, "gpu-a").fits
    state.on_report("MODIFIED", in_mig_mode(honest, 0))
    assert not state.fit(newcomer, "gpu-a").fits
    account = state.account("gpu-a")
    assert account is not None
    assert [g.index for g in account.gpus if g.shared] == [0, 1]
    assert "MIG mode" in account.note


def test_a_mig_flag_on_a_mixed_node_takes_no_located_shared_pod_out_of_the_fit() -> None:
    # A mixed node (MIG strategy mixed): GPU 0 in MIG mode (7 x 1g.5gb), GPU 1
    # time-sliced (4 replicas of nvidia.com/gpu.shared). A 30 GiB pod kubelet gave a
    # replica of GPU 1. A report swapping the MIG flags (GPU 0 shared, GPU 1 in MIG
    # mode) kept the pod located on GPU 1, which no newcomer is checked against: a
    # second 30 GiB pod fitted "GPU 0", and the device plugin, which shares GPU 1
    # only, gave it GPU 1: 60 GiB declared on a 40 GiB GPU. The device plugin hands
    # no replica of a GPU in MIG mode, so such a pod is read as not located.
    node = gpu_node("gpu-a", gpus=2, mig={"1g.5gb": 7})
    node["status"]["capacity"][names.GPU_SHARED] = "4"
    node["status"]["allocatable"][names.GPU_SHARED] = "4"
    a = gpu_pod("a", node="gpu-a", declared="30Gi", phase="Running")
    state, _ = state_with(node, a)
    status = parse_report(gpu_report("gpu-a", {0: {}, 1: {}}))
    located = PodUsage(uid=uid_of(a), used_bytes=0, allocated=True)
    honest = replace(
        status,
        gpus=[replace(status.gpus[0], mig_enabled=True), replace(status.gpus[1], pods=[located])],
    )
    newcomer = parse_claim(gpu_pod("c", declared="30Gi"))
    state.on_report("ADDED", report_object(honest))
    assert not state.fit(newcomer, "gpu-a").fits
    swapped = replace(
        honest,
        gpus=[
            replace(honest.gpus[0], mig_enabled=False),
            replace(honest.gpus[1], mig_enabled=True),
        ],
    )
    state.on_report("MODIFIED", report_object(swapped))
    assert not state.fit(newcomer, "gpu-a").fits
