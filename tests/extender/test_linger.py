"""The charge of a pod deleted, or ended, before kubelet reported it stopped: not ended
early by a wall-clock step, kept where a read found the pod, started once, and ended by
kubelet's word that its containers stopped."""

import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from extender.state import HISTORY_SECONDS, ClusterState
from headroom.claims import PodClaim
from headroom.reports import parse_report, report_object
from tests.extender.conftest import MARGIN, Clock, Harness
from tests.extender.objects import (
    EPOCH,
    GIB,
    Object,
    gpu_node,
    gpu_pod,
    gpu_report,
    stopped,
    uid_of,
)
from tests.extender.test_bind_storm import args, setup
from tests.extender.test_state import admit, fresh_state, headroom

MIB = 2**20


def test_touching_an_ended_pod_does_not_keep_it_charged_forever() -> None:
    # kubelet rejected the pod at admission (e.g. spec.os.name: windows ->
    # PodOSNotSupported): phase Failed, no containerStatuses, so never "stopped".
    # ResourceQuota no longer counts it. Its owner may still patch its labels (edit
    # role): every MODIFIED event starts the linger over, so the 10 GiB stay charged
    # for as long as someone touches the pod.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pod = gpu_pod("rejected", node="gpu-a", declared="10Gi", phase="Pending")
    state.on_pod("ADDED", pod)
    failed = {**pod, "status": {"phase": "Failed", "reason": "PodOSNotSupported"}}
    state.on_pod("MODIFIED", failed)
    assert headroom(state) == empty - 10 * GIB  # grace 30 s + allowance 30 s: fine
    for i in range(24):  # 20 minutes of a label patch every 50 s
        clock.now += 50
        touched = {**failed, "metadata": {**failed["metadata"], "labels": {"touch": str(i)}}}
        state.on_pod("MODIFIED", touched)
    assert headroom(state) == empty, (
        f"an ended pod is still charged {len(state.lingering.get('gpu-a', {}))} claim(s) "
        "1200 s after it failed (grace 30 s + allowance 30 s)"
    )


def test_a_wall_clock_step_does_not_end_a_linger_early() -> None:
    # The pod is force-deleted while it runs (grace 300 s): kubelet may run it for
    # 5 more minutes. NTP then steps the wall clock 10 minutes ahead. No time has
    # passed on the monotonic clock, yet the charge is gone.
    wall, steady = Clock(), Clock(now=1000.0)
    state = ClusterState(margin=MARGIN, stale_after=1e9, clock=wall, hold_clock=steady)
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pod = gpu_pod("p", node="gpu-a", declared="30Gi", phase="Running")
    pod["spec"]["terminationGracePeriodSeconds"] = 300
    pod["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    state.on_pod("ADDED", pod)
    state.on_pod("DELETED", pod)  # kubectl delete --force
    assert headroom(state) == empty - 30 * GIB
    wall.now += 600  # NTP step; steady clock unchanged
    steady.now += 1
    assert headroom(state) == empty - 30 * GIB, (
        "a wall-clock step released a pod kubelet may still run for ~330 s"
    )


async def test_a_pod_read_bound_then_read_gone_stays_charged_where_the_read_saw_it(
    harness: Harness,
) -> None:
    # The watch lags (or is broken). A bind of p to gpu-b is answered 409: the read
    # finds p bound to gpu-a (an earlier binder's POST), so the extender charges it
    # there (ClusterState.hold, no POST of its own: posts=0). p is then force-deleted
    # and the next read finds it gone. README/gone(): "its declaration stays charged
    # where it was bound"; but gone() lingers only the cache's node and POSTed holds.
    state = harness.state
    state.on_node("ADDED", gpu_node("gpu-b"))
    pod = gpu_pod("p", declared="30Gi")
    setup(harness, pod)  # gpu-a, p pending in the cache, readable
    harness.binder.bound[("research", "p")] = "gpu-a"  # stored by someone else
    result = await harness.extender.bind(args(pod, "gpu-b"))
    assert result.Error  # 409: bound elsewhere
    assert set(state.assumed[uid_of(pod)]) == {"gpu-a"}
    assert [c.uid for c in state.claims_on("gpu-a")] == [uid_of(pod)]
    harness.reader.pods.clear()  # force-deleted; the watch has not delivered it
    harness.clock.now += 11
    await harness.extender.verify_due()
    assert state.assumed == {}
    assert [c.uid for c in state.claims_on("gpu-a")] == [uid_of(pod)], (
        "read bound to gpu-a, then read gone: no longer charged on gpu-a although "
        "kubelet may run it for its grace period"
    )


def test_kubelets_word_that_the_pod_stopped_ends_its_linger() -> None:
    # The pod GC marks p Failed (NodeLost) while its containers still show running:
    # charged for its grace period (300 s) + 30 s. The node comes back and kubelet
    # reports every container terminated -- the proof _stopped() looks for -- but
    # the lingering claim is not let go: 30 GiB stay charged for 5 more minutes.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    empty = headroom(state)
    pod = gpu_pod("p", node="gpu-a", declared="30Gi", phase="Running")
    pod["spec"]["terminationGracePeriodSeconds"] = 300
    pod["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    state.on_pod("ADDED", pod)
    lost = {**pod, "status": {**pod["status"], "phase": "Failed", "reason": "NodeLost"}}
    state.on_pod("MODIFIED", lost)
    assert headroom(state) == empty - 30 * GIB
    clock.now += 10
    state.on_pod("MODIFIED", stopped(lost))  # kubelet: every container terminated
    assert headroom(state) == empty, "still charged after kubelet reported it stopped"


def test_a_pod_asking_for_no_gpu_never_lingers() -> None:
    state, _ = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a"))
    web = gpu_pod("web", node="gpu-a", declared=None, shared=0, phase="Running")
    web["metadata"]["annotations"] = {}
    state.on_pod("ADDED", web)
    state.on_pod("DELETED", web)  # force-deleted, containers not shown stopped
    assert state.lingering == {}


def test_the_admission_policy_bounds_grace_periods_where_the_linger_does() -> None:
    # A force-deleted pod is charged for its grace period up to HISTORY_SECONDS, and
    # kubelet may run it for all of its own: headroom-shared-gpu-pods refuses a shared
    # pod asking more. The two figures are one bound, in two files.
    path = Path(__file__).resolve().parents[2] / "manifests/base/admission/shared-gpu-pods.yaml"
    policy = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"].endswith("Policy"))
    bounds = [
        int(m.group(1))
        for v in policy["spec"]["validations"]
        if (m := re.search(r"terminationGracePeriodSeconds <= (\d+)", v["expression"]))
    ]
    assert bounds == [int(HISTORY_SECONDS)]


def running(name: str, declared: str) -> Object:
    """A shared pod bound to gpu-a whose containers kubelet shows running (grace 600 s)."""
    pod = gpu_pod(name, node="gpu-a", declared=declared, phase="Running")
    pod["spec"]["terminationGracePeriodSeconds"] = 600
    pod["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    return pod


@pytest.mark.parametrize("located", [True, False], ids=["located", "not-located"])
def test_a_force_deleted_pod_kubelet_no_longer_counts_keeps_its_gpu_full(located: bool) -> None:
    # Three 40 GiB GPUs: f (20 GiB) and n (19 GiB) on GPU 0, m1 and m2 (1 GiB) on GPUs
    # 1 and 2. The tenant force-deletes f, which traps SIGTERM and runs out its 600 s
    # grace period, free to use all it declared. kubelet drops a force-deleted pod from
    # its active pods at once, and its device manager frees the pod's replica before
    # the next allocation (UpdateAllocatedDevices; kubelet's own GetActivePods warns of
    # it, kubernetes#104824): the device plugin then counts GPUs 0, 1, 2 at 1, 1, 1 and
    # may give a 19 GiB newcomer GPU 0 -- 58 GiB declared on a 40 GiB GPU. Counted as
    # a replica the allocator still holds, f let the bound say GPU 0 takes f or the
    # newcomer, not both. Unlocated (deleted before a report placed it) f may be on
    # any GPU.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=3, replicas=4))
    pods = {n: running(n, size) for n, size in (("f", "20Gi"), ("n", "19Gi"), ("m1", "1Gi"))}
    pods["m2"] = running("m2", "1Gi")
    for pod in pods.values():
        state.on_pod("ADDED", pod)
    uid = {name: uid_of(pod) for name, pod in pods.items()}
    held = {0: {uid["n"]: MIB}, 1: {uid["m1"]: MIB}, 2: {uid["m2"]: MIB}}
    before = {0: {**held[0], uid["f"]: MIB}, 1: held[1], 2: held[2]}
    state.on_report("ADDED", gpu_report("gpu-a", before if located else held))
    clock.now += 5
    state.on_pod("DELETED", pods["f"])  # kubectl delete --force --grace-period=0
    clock.now += 5
    late = EPOCH + timedelta(seconds=10)
    # The agent no longer knows f: what it holds is unattributed.
    state.on_report("MODIFIED", gpu_report("gpu-a", held, unattributed={0: MIB}, at=late))
    assert admit(state, "19Gi", "a", created=late) == [False]
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].accounted >= 39 * GIB


def test_a_force_deleted_pods_gpu_is_found_again_once_the_gpus_are_numbered_anew() -> None:
    # Three 40 GiB GPUs: f (30 GiB) and n (9 GiB) located on GPU 1, m (1 GiB) on GPU 2.
    # f is force-deleted: it runs out its 600 s grace period on GPU 1, charged in full
    # there only (PodClaim.home). GPU 0 then falls off the bus and the driver numbers
    # the rest anew: f and n are on GPU 0 now, m on GPU 1. The agent no longer knows f
    # (what it holds is unattributed). f's home, kept by the old index, charged it
    # beside m, and its own GPU n's 9 GiB only: an 8 GiB newcomer fitted (8.5 GiB of
    # room beside m), and the device plugin, counting one replica on each, may give
    # it f's GPU: 47 GiB declared on 40.
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=3, replicas=4))
    f, n, m = running("f", "30Gi"), running("n", "9Gi"), running("m", "1Gi")
    for pod in (f, n, m):
        state.on_pod("ADDED", pod)
    f_n = {uid_of(f): MIB, uid_of(n): MIB}
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: f_n, 2: {uid_of(m): MIB}}))
    clock.now += 5
    state.on_pod("DELETED", f)  # kubectl delete --force --grace-period=0
    clock.now += 5
    later = EPOCH + timedelta(seconds=10)
    held = {0: {}, 1: {uid_of(n): MIB}, 2: {uid_of(m): MIB}}
    status = parse_report(gpu_report("gpu-a", held, at=later))
    _, old1, old2 = status.gpus
    renumbered = replace(
        status, gpus=[replace(old1, index=0, unattributed_bytes=MIB), replace(old2, index=1)]
    )
    state.on_report("MODIFIED", report_object(renumbered))
    state.refresh(state.clock())
    account = state.account("gpu-a")
    assert account is not None
    charged = {gpu.index: gpu.accounted for gpu in account.gpus}
    assert charged[0] >= 39 * GIB, f"f's GPU (now GPU 0) charged {charged[0] / GIB:.3f} GiB"
    assert admit(state, "8Gi", "a", created=later) == [False]


def _p_posted_to_gpu_a() -> tuple[ClusterState, Clock, PodClaim]:
    """p (30 GiB) held on gpu-a (three 40 GiB GPUs, none used), its binding POST out."""
    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=3, replicas=4))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {}, 2: {}}))
    pod = gpu_pod("p", declared="30Gi")
    state.on_pod("ADDED", pod)
    claim = state.parse(pod)
    assert state.assume(claim, "gpu-a").fits
    state.posting(claim.uid, "gpu-a")
    return state, clock, claim


def test_a_pod_force_deleted_while_its_bind_is_answered_stays_charged_as_deleted() -> None:
    # p (30 GiB) is held on gpu-a (three 40 GiB GPUs, none used) and its binding POST
    # lands; the tenant force-deletes it at once, and the watch delivers the binding
    # and the deletion before the POST's answer: p lingers, charged in full on every
    # GPU (no report placed it), its replica no longer one the allocator counts. Then
    # the answer comes, and the bind charges p there again (ClusterState.hold), as a
    # pod not deleted: one the allocator counts, unlocated. Until a read finds it gone
    # (verify_after later), the bound said p and a newcomer cannot share a GPU, and
    # a 20 GiB newcomer fitted; the device plugin, counting none on any GPU, may give
    # it p's: 50 GiB declared on 40.
    state, clock, claim = _p_posted_to_gpu_a()
    bound = gpu_pod("p", node="gpu-a", declared="30Gi")
    state.on_pod("MODIFIED", bound)  # the binding, stored
    state.on_pod("DELETED", bound)  # kubectl delete --force --grace-period=0
    clock.now += 1
    state.hold(claim, "gpu-a")  # the POST's answer: stored
    account = state.account("gpu-a")
    assert account is not None
    assert all(gpu.accounted >= 30 * GIB for gpu in account.gpus)
    assert admit(state, "20Gi", "a", created=EPOCH + timedelta(seconds=1)) == [False]


def test_a_pod_read_gone_stays_charged_as_deleted_when_the_lagging_watch_shows_it_bound() -> None:
    # p (30 GiB) is held on gpu-a (three 40 GiB GPUs, none used); its binding POST
    # timed out, and it landed. The tenant force-deletes p. The watch lags: the read
    # that verifies the hold finds p gone (ClusterState.gone): it lingers, charged in
    # full on every GPU and no replica of the spread bound. Then the watch delivers
    # the binding: the cache showed p bound there, a pod the allocator counts, and the
    # lingering charge went unused until the watch delivered the deletion too. The
    # bound said p and a newcomer cannot share a GPU, and a 20 GiB newcomer fitted.
    state, clock, claim = _p_posted_to_gpu_a()
    clock.now += 11
    state.gone(claim.uid)  # the verifying read: 404
    state.on_pod("MODIFIED", gpu_pod("p", node="gpu-a", declared="30Gi"))  # lagging
    account = state.account("gpu-a")
    assert account is not None
    assert all(gpu.accounted >= 30 * GIB for gpu in account.gpus)
    assert admit(state, "20Gi", "a", created=EPOCH + timedelta(seconds=11)) == [False]


async def test_the_bind_verb_charges_a_pod_deleted_while_its_post_was_out_as_deleted(
    harness: Harness,
) -> None:
    # As test_a_pod_force_deleted_while_its_bind_is_answered_stays_charged_as_deleted,
    # through the bind verb: the watch delivers the binding and the forced deletion
    # while the POST is out, and the verb holds the pod again once it is answered.
    state = harness.state
    state.on_node("ADDED", gpu_node("gpu-c", gpus=3, replicas=4))
    state.on_report("ADDED", gpu_report("gpu-c", {0: {}, 1: {}, 2: {}}))
    pod = gpu_pod("p", declared="30Gi")
    state.on_pod("ADDED", pod)
    post = harness.binder

    async def binder(namespace: str, name: str, uid: str, node: str) -> None:
        await post(namespace, name, uid, node)
        bound = gpu_pod("p", node=node, declared="30Gi")
        state.on_pod("MODIFIED", bound)  # stored, and the watch is quick
        state.on_pod("DELETED", bound)  # kubectl delete --force --grace-period=0

    harness.extender.binder = binder
    assert not (await harness.extender.bind(args(pod, "gpu-c"))).Error
    newcomer = gpu_pod("a", declared="20Gi")
    newcomer["metadata"]["creationTimestamp"] = "2025-06-01T12:00:01Z"
    state.on_pod("ADDED", newcomer)
    assert not state.assume(state.parse(newcomer), "gpu-c").fits
