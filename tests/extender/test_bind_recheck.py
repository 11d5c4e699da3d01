"""Storm and node churn: a bind after the node changed under its hold, a pod the pod GC
marks Failed while it still runs."""

from datetime import timedelta

import pytest

from extender.wire import ExtenderArgs, ExtenderBindingArgs
from tests.extender.conftest import Harness
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, uid_of


@pytest.mark.parametrize("change", ["node-recreated-smaller", "leak-reported", "report-stale"])
async def test_bind_rechecks_a_pod_the_filter_held(harness: Harness, change: str) -> None:
    """The filter (choose) holds A (30 GiB) on a 40 GiB GPU. Before kube-scheduler's bind
    arrives, the node changes under it: deleted and re-created with a 24 GiB GPU, or its
    report shows 20 GiB of unattributed memory, or the report turns stale while the
    GPU's other pod was measured. The bind verb re-checks under the latest accounting,
    for a pod its filter held too."""
    state, extender = harness.state, harness.extender
    extender.choose = True
    state.on_node("ADDED", gpu_node("n"))
    state.on_report("ADDED", gpu_report("n", {0: {}}))
    a = gpu_pod("a", declared="30Gi")
    state.on_pod("ADDED", a)
    assert extender.filter(ExtenderArgs(Pod=a, NodeNames=["n"])).NodeNames == ["n"]
    assert set(state.assumed[uid_of(a)]) == {"n"}

    if change == "node-recreated-smaller":
        state.on_node("DELETED", gpu_node("n"))
        state.on_report("DELETED", gpu_report("n", {0: {}}))
        state.on_node("ADDED", gpu_node("n", memory_mib=24576))
    elif change == "leak-reported":
        harness.clock.now += 2
        at = EPOCH + timedelta(seconds=2)
        state.on_report("MODIFIED", gpu_report("n", {0: {}}, unattributed={0: 20 * GIB}, at=at))
    else:
        # A running neighbour b, last seen holding 20 GiB over its 1 GiB declaration.
        b = gpu_pod("b", node="n", declared="1Gi", phase="Running")
        state.on_pod("ADDED", b)
        state.on_report("MODIFIED", gpu_report("n", {0: {uid_of(b): 20 * GIB}}))
        harness.clock.now += 91  # the report turns stale: b keeps its 20 GiB charge
    account = state.account("n")
    assert account is not None
    # The latest accounting: A's 30 GiB does not fit beside what else is there.
    assert not state.fit(state.parse(a), "n", without=uid_of(a)).fits

    result = await extender.bind(
        ExtenderBindingArgs(PodName="a", PodNamespace="research", PodUID=uid_of(a), Node="n")
    )
    assert result.Error != "", f"bound onto {account.gpus[0].headroom / GIB:.1f} GiB headroom"
    assert harness.binder.calls == []


def test_a_pod_the_pod_gc_marks_failed_while_running_still_holds_its_replica() -> None:
    """Node churn: the Node object is deleted while kubelet still runs P. After its 40 s
    quarantine the pod GC (markFailedAndDeletePodWithCondition) patches P's phase to
    Failed -- containers still running -- then force-deletes it. The Failed phase must
    not read as "stopped": only kubelet's container statuses say so. Otherwise P
    leaves with no linger, and A and B (25 GiB each) are admitted where the device
    plugin can put both on one 40 GiB GPU (as in
    test_a_pod_deleted_before_kubelet_stopped_it_still_counts_on_its_gpu)."""
    from tests.extender.test_state import admit, fresh_state

    state, clock = fresh_state()
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=4))
    p = gpu_pod("p", node="gpu-a", declared="2Gi", phase="Running")
    p["spec"]["terminationGracePeriodSeconds"] = 300
    p["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    state.on_pod("ADDED", p)
    state.on_report("ADDED", gpu_report("gpu-a", {0: {}, 1: {uid_of(p): 2 * GIB}}))
    clock.now += 5
    state.on_node("DELETED", gpu_node("gpu-a", gpus=2, replicas=4))
    marked = {**p, "status": {**p["status"], "phase": "Failed", "reason": "NodeLost"}}
    state.on_pod("DELETED", marked)  # left the watch's field selector; containers running
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2, replicas=4))  # kubelet re-registers
    clock.now += 100
    late = EPOCH + timedelta(seconds=105)
    state.on_report(
        "MODIFIED", gpu_report("gpu-a", {0: {}, 1: {}}, unattributed={1: 2 * GIB}, at=late)
    )
    assert admit(state, "25Gi", "a", "b", created=late) == [True, False]
