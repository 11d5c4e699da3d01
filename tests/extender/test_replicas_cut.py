"""Time-slicing replicas cut on a live node: the allocator no longer sees the old replicas.

The NVIDIA device plugin's ``distributed`` policy balances by the replicas it lists
(``total - available`` per GPU, internal/rm/allocate.go). Cut from 8 replicas per GPU
to 4, it lists ``::0..::3``; a pod kubelet gave ``::4..::7`` before the cut keeps it
and runs on, but the plugin counts it nowhere. So a GPU whose four pods all sit on
old replicas looks empty to it, and the next pod may land there.
"""

from datetime import UTC, datetime

from extender.state import ClusterState
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import GIB, Object, gpu_node, gpu_pod, gpu_report, stopped, uid_of


def _state(node: Object) -> tuple[ClusterState, Clock]:
    """The extender's state with ``node`` known, on a clock the test moves."""
    clock = Clock()
    state = ClusterState(margin=MARGIN, stale_after=90.0, clock=clock)
    state.on_node("ADDED", node)
    return state, clock


def _running(state: ClusterState, count: int) -> list[Object]:
    """``count`` pods of 9 GiB running on gpu-a, created before the test's moves."""
    pods = [gpu_pod(f"a{i}", node="gpu-a", declared="9Gi", phase="Running") for i in range(count)]
    for pod in pods:
        state.on_pod("ADDED", pod)
    return pods


def test_a_gpu_whose_pods_hold_replicas_cut_away_still_takes_new_pods() -> None:
    # Two 40 GiB GPUs, 8 replicas each. Four 9 GiB pods run on GPU 0 (36 GiB),
    # located by the agent; GPU 1 is empty. The replicas are cut to 4. The spread
    # bound reads GPU 0 as 4 allocated against GPU 1's 0 and says q (9 GiB) cannot
    # land on GPU 0; the plugin, which lists only ::0..::3, sees GPU 0 at 0 in use
    # (its pods hold ::4..::7) and may give q GPU 0: 45 GiB on 40.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=8))
    pods = _running(state, 4)
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    state.on_report("ADDED", gpu_report("gpu-a", usage))
    clock.now += 60
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = _created(gpu_pod("q", declared="9Gi"), clock)
    state.on_pod("ADDED", q)
    verdict = state.assume(state.parse(q), "gpu-a")
    assert not verdict.fits, "q may land on GPU 0 beside 36 GiB"
    assert "headroom" in verdict.reason


def test_an_extender_started_after_the_cut_reads_it_from_the_agents_report() -> None:
    # The same node, seen first by an extender (re)started after the cut: 4 replicas
    # per GPU from its first sight, so nothing here stamps a cut. The agent, asking
    # kubelet which replicas its plugin lists (GetAllocatableResources), counts 4 on
    # GPU 0 allocated beyond them; without that q would be let onto the node.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=4))
    pods = _running(state, 4)
    clock.now += 60
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    report = gpu_report("gpu-a", usage, at=_at(clock))
    state.on_report("ADDED", report)
    q = _created(gpu_pod("q", declared="9Gi"), clock)
    state.on_pod("ADDED", q)
    assert state.fit(state.parse(q), "gpu-a").fits  # a 4-of-4 GPU 0 bounds q to GPU 1
    report["status"]["gpus"][0]["unlistedReplicas"] = 4
    state.on_report("MODIFIED", report)
    verdict = state.fit(state.parse(q), "gpu-a")
    assert not verdict.fits, "q may land on GPU 0 beside 36 GiB"
    report["status"]["gpus"][0]["unlistedReplicas"] = 0  # those pods gone, or moved
    state.on_report("MODIFIED", report)
    assert state.fit(state.parse(q), "gpu-a").fits


def test_once_the_pods_from_before_the_cut_are_gone_the_bound_counts_again() -> None:
    # Packing is not lost for good: pods created after the cut were given replicas the
    # plugin lists, and with those alone on GPU 0 it holds 4 of 4, so q goes to GPU 1.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=8))
    old = gpu_pod("old", node="gpu-a", declared="9Gi", phase="Running")
    state.on_pod("ADDED", old)
    clock.now += 60
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    clock.now += 60
    new = [
        _created(gpu_pod(f"b{i}", node="gpu-a", declared="9Gi", phase="Running"), clock)
        for i in range(4)
    ]
    for pod in new:
        state.on_pod("ADDED", pod)
    usage = {0: {uid_of(p): 9 * GIB for p in new}, 1: {uid_of(old): 9 * GIB}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = _created(gpu_pod("q", declared="9Gi"), clock)
    state.on_pod("ADDED", q)
    assert not state.assume(state.parse(q), "gpu-a").fits  # old may sit on GPU 1's ::4..::7
    state.on_pod("DELETED", stopped(old))
    usage[1] = {}
    state.on_report("MODIFIED", gpu_report("gpu-a", usage, at=_at(clock)))
    assert state.assume(state.parse(q), "gpu-a").fits


def test_without_a_cut_a_full_gpu_still_takes_no_new_pod() -> None:
    # The same pods under 4 replicas from the start: GPU 0 holds 4 of 4, the plugin
    # can only give q GPU 1, and the bound lets q onto the node (no packing lost).
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=4))
    pods = _running(state, 4)
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    clock.now += 60
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = gpu_pod("q", declared="9Gi")
    state.on_pod("ADDED", q)
    assert state.assume(state.parse(q), "gpu-a").fits


def _at(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.now, UTC)


def _created(pod: Object, clock: Clock) -> Object:
    pod["metadata"]["creationTimestamp"] = _at(clock).isoformat().replace("+00:00", "Z")
    return pod


def test_a_kubelet_restart_zeroing_the_capacity_is_no_cut() -> None:
    # kubelet reports nvidia.com/gpu.shared as 0 until the plugin registers again,
    # with the same replicas: nothing was cut, and the bound keeps counting.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=4))
    pods = _running(state, 4)
    clock.now += 60
    restarting = gpu_node("gpu-a", gpus=2, replicas=4)
    restarting["status"]["capacity"]["nvidia.com/gpu.shared"] = "0"
    state.on_node("MODIFIED", restarting)
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = _created(gpu_pod("q", declared="9Gi"), clock)
    state.on_pod("ADDED", q)
    assert state.assume(state.parse(q), "gpu-a").fits


def _joining(name: str, *, gpus: int, replicas: int) -> Object:
    # A node as it joins: the device plugin has registered its replicas, GPU Feature
    # Discovery (nfd-worker's next pass) has not labelled it yet.
    node = gpu_node(name, gpus=gpus, replicas=replicas)
    for key in list(node["metadata"]["labels"]):
        if key.startswith("nvidia.com/"):
            del node["metadata"]["labels"][key]
    return node


def test_a_joining_node_labelled_after_its_capacity_is_no_cut() -> None:
    # The common order on a new (autoscaled) node: capacity 8 (2 GPUs x 4) before
    # GFD's labels; "1 GPU assumed" reads 8 replicas on it, the labels then say 4 per
    # GPU. Nothing was cut: the pods pending since before the node came must not turn
    # its spread bound off for as long as they run.
    state, clock = _state(_joining("gpu-a", gpus=2, replicas=4))
    clock.now += 30
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    pods = _running(state, 4)
    clock.now += 60
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = gpu_pod("q", declared="9Gi")
    state.on_pod("ADDED", q)
    assert state.assume(state.parse(q), "gpu-a").fits


def test_a_re_created_node_labelled_after_its_capacity_is_no_cut() -> None:
    # kubelet re-registers a deleted Node: its capacity comes back before GFD's labels.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=4))
    pods = _running(state, 4)
    clock.now += 60
    state.on_node("DELETED", gpu_node("gpu-a", gpus=2, replicas=4))
    state.on_node("ADDED", _joining("gpu-a", gpus=2, replicas=4))
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=2, replicas=4))
    usage = {0: {uid_of(p): 9 * GIB for p in pods}, 1: {}}
    state.on_report("ADDED", gpu_report("gpu-a", usage, at=_at(clock)))
    q = _created(gpu_pod("q", declared="9Gi"), clock)
    state.on_pod("ADDED", q)
    assert state.assume(state.parse(q), "gpu-a").fits


def test_a_gpu_count_label_ahead_of_the_capacity_is_no_cut() -> None:
    # A GPU lost (fallen off the bus): GFD's count moves to 1 before the plugin
    # re-registers, so capacity 8 over the 1 GPU "confirmed" reads 8 per GPU; then
    # capacity 4 over 1 reads 4 again. No replica was cut.
    state, clock = _state(gpu_node("gpu-a", gpus=2, replicas=4))
    _running(state, 4)
    clock.now += 60
    labelled = gpu_node("gpu-a", gpus=2, replicas=4)
    labelled["metadata"]["labels"]["nvidia.com/gpu.count"] = "1"
    state.on_node("MODIFIED", labelled)
    state.on_node("MODIFIED", gpu_node("gpu-a", gpus=1, replicas=4))
    assert "gpu-a" not in state._replicas_cut
