"""Room on a node is told to kube-scheduler through one coalesced node annotation."""

import asyncio
import time
from typing import Any

from extender.requeue import RoomNotifier, Stamper
from extender.state import ClusterState
from kube.rest import ApiError, Unreachable
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report


def recording(stamped: list[str]) -> Stamper:
    async def stamp(node: str, when: str) -> None:
        stamped.append(node)

    return stamp


async def test_room_is_stamped_once_per_burst_of_events() -> None:
    stamped: list[str] = []
    notifier = RoomNotifier(recording(stamped), every=0.05)
    for _ in range(5):
        notifier.room("gpu-a")
    notifier.room("gpu-b")  # one Node event moves every pod refused, wherever it waits
    for _ in range(50):
        if stamped:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert stamped == ["gpu-a"]


async def settled() -> None:
    """Long enough for a due stamp to be made."""
    await asyncio.sleep(0.2)


async def test_room_on_many_nodes_at_once_is_one_stamp() -> None:
    # The storm: 1,000 pods waiting, 100 nodes freeing room every second. Stamped per
    # node that is 100 node PATCHes a second, each stored in etcd, sent to every
    # watcher of nodes, and taking one of the 32 connections the binds go out on.
    # One Node event moves every pod the extender refused, wherever it waits (the
    # pseudo-plugin takes any; kube-scheduler 1.34 runs no node pre-check with
    # queueing hints, locked on): one stamp per interval does all they did.
    stamped: list[str] = []
    notifier = RoomNotifier(recording(stamped), every=0.05)
    for index in range(100):
        notifier.room(f"gpu-{index:03}")
    await settled()
    assert stamped == ["gpu-000"]
    began = time.monotonic()
    for index in range(100, 200):
        notifier.room(f"gpu-{index:03}")
        await asyncio.sleep(0.001)
    lasted = time.monotonic() - began
    await settled()
    more = len(stamped) - 1
    assert 2 <= more <= lasted / 0.05 + 2  # room after a stamp began is stamped again


async def test_a_stamp_on_a_node_gone_is_made_on_another_with_room() -> None:
    attempts: list[str] = []

    async def stamp(node: str, when: str) -> None:
        attempts.append(node)
        if node == "gpu-a":
            raise ApiError(404, "Not Found")

    notifier = RoomNotifier(stamp, every=0.02)
    notifier.room("gpu-b")
    notifier.room("gpu-a")
    await settled()
    assert attempts == ["gpu-a", "gpu-b"]
    assert notifier.stamped == 1


async def test_a_stamp_that_failed_is_tried_again() -> None:
    # In a storm API Priority and Fairness refuses the PATCH (429), or it times out:
    # the room is still untold, and with nothing else happening the refused pod
    # waited for kube-scheduler's 5-minute flush.
    attempts: list[str] = []
    stamped: list[str] = []

    async def flaky(node: str, when: str) -> None:
        attempts.append(node)
        if len(attempts) == 1:
            raise Unreachable("no answer within 5.0s", sent=True)
        if len(attempts) == 2:
            raise ApiError(429, "Too Many Requests")
        stamped.append(node)

    notifier = RoomNotifier(flaky, every=0.05)
    notifier.room("gpu-a")
    for _ in range(50):
        if stamped:
            break
        await asyncio.sleep(0.01)
    assert stamped == ["gpu-a"]
    assert notifier.stamped == 1


async def test_a_node_failing_for_good_does_not_hold_back_the_stamps_on_others() -> None:
    # One node's PATCH answers 500 every time (a webhook on nodes failing for it, an
    # etcd key it cannot write): retried first on each round as the least name, no
    # stamp was ever made while it had room, and every refused pod waited for the
    # 5-minute flush. One Node event on any node moves them all: stamp another one,
    # and keep trying the failing one while it is the only one with room.
    attempts: list[str] = []
    stamped: list[str] = []

    async def broken_a(node: str, when: str) -> None:
        attempts.append(node)
        if node == "gpu-a":
            raise ApiError(500, "Internal Server Error")
        stamped.append(node)

    notifier = RoomNotifier(broken_a, every=0.02)
    notifier.room("gpu-a")
    notifier.room("gpu-b")
    await settled()
    assert stamped == ["gpu-b"]
    assert attempts[:2] == ["gpu-a", "gpu-b"]
    notifier.room("gpu-c")
    notifier.room("gpu-a")
    await settled()
    assert stamped == ["gpu-b", "gpu-c"]
    before = len(attempts)
    notifier.room("gpu-a")  # room on it alone: still due, tried again and again
    await settled()
    assert set(attempts[before:]) == {"gpu-a"}
    assert len(attempts) - before >= 2


async def test_a_stamp_refused_for_good_is_not_tried_again() -> None:
    # A node deleted (404), or a stamp the admission policy refuses: retrying helps nobody.
    attempts: list[str] = []

    async def refused(node: str, when: str) -> None:
        attempts.append(node)
        raise ApiError(404, "Not Found")

    notifier = RoomNotifier(refused, every=0.02)
    notifier.room("gpu-gone")
    await settled()
    assert attempts == ["gpu-gone"]


async def test_before_the_caches_sync_room_is_kept_and_one_node_is_stamped_after() -> None:
    # On a start or restart every report listed is new, so every reporting node
    # "shows room": stamping each would be one patch per node (5,000 on a large
    # cluster) before the extender can even answer. One Node event moves every pod
    # the extender refused, wherever it waits (the pseudo-plugin Extender takes any).
    stamped: list[str] = []
    notifier = RoomNotifier(recording(stamped), every=0.05, started=False)
    for index in range(1000):
        notifier.room(f"gpu-{index:04}")
    await settled()
    assert stamped == []
    notifier.start(["gpu-0000", "gpu-0001"])
    await settled()
    assert stamped == ["gpu-0000"]
    notifier.room("gpu-0002")  # from now on, room is stamped where it appears
    await settled()
    assert stamped == ["gpu-0000", "gpu-0002"]


async def test_a_start_with_no_room_seen_still_stamps_a_gpu_node() -> None:
    # Room may have appeared anywhere while no extender was watching (a pod
    # refused by the one before this restart): retry what it refused, now.
    stamped: list[str] = []
    notifier = RoomNotifier(recording(stamped), every=0.05, started=False)
    notifier.start(["gpu-b", "gpu-a"])
    await settled()
    assert stamped == ["gpu-a"]
    empty = RoomNotifier(recording(stamped), started=False)
    empty.start([])  # a cluster without GPU nodes: nobody waits for GPU memory
    await settled()
    assert stamped == ["gpu-a"]


def watched(*nodes: dict[str, Any]) -> tuple[ClusterState, list[str]]:
    """A state with ``nodes`` added, at :data:`EPOCH`; the rooms it tells from now on."""
    now = EPOCH.timestamp()
    state = ClusterState(margin=0, stale_after=90.0, clock=lambda: now)
    rooms: list[str] = []
    state.on_room = rooms.append
    for node in nodes:
        state.on_node("ADDED", node)
    rooms.clear()
    return state, rooms


def test_a_pod_leaving_a_node_or_a_released_charge_is_room() -> None:
    # A node added is room too (test_a_node_added_or_offering_more_is_room...).
    state, rooms = watched(gpu_node("gpu-a"))
    pod = gpu_pod("p", node="gpu-a", declared="1Gi")
    state.on_pod("ADDED", pod)
    state.on_pod("MODIFIED", pod)  # an update is not room
    assert rooms == []
    state.on_pod("DELETED", pod)
    assert rooms == ["gpu-a"]
    waiting = gpu_pod("w", declared="1Gi")
    state.on_pod("ADDED", waiting)
    claim = state.lookup(waiting["metadata"]["uid"], "research", "w")
    assert claim is not None
    assert state.assume(claim, "gpu-a").fits
    state.forget(claim.uid)
    assert rooms == ["gpu-a", "gpu-a"]


def test_a_report_showing_usage_fall_is_room_and_a_heartbeat_is_not() -> None:
    # The memory of a deleted pod (a preemption victim) is released when the
    # agent's next report says so, after the pod's deletion was seen: without
    # this the preemptor waited for kube-scheduler's 5-minute flush.
    state, rooms = watched(gpu_node("gpu-a"))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {"u1": 18 * GIB, "u2": 10 * GIB}}))
    assert rooms == ["gpu-a"]  # the first measured figures may show room
    rooms.clear()
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u1": 18 * GIB, "u2": 10 * GIB}}))
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u1": 19 * GIB, "u2": 10 * GIB}}))
    assert rooms == []  # a heartbeat and a rise are not room
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u2": 10 * GIB}}))
    assert rooms == ["gpu-a"]
    rooms.clear()
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u2": 10 * GIB}}, age=600))
    assert rooms == []  # a stale report frees nothing


def two_gpus_reporting_one_pod() -> tuple[ClusterState, list[str]]:
    """A 2-GPU node whose report shows pod u1 on GPU 0; the rooms told from now on."""
    state, rooms = watched(gpu_node("gpu-a", gpus=2))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {"u1": GIB}, 1: {}}))
    rooms.clear()
    return state, rooms


def test_a_report_locating_a_pod_for_the_first_time_is_room() -> None:
    # A located pod is charged to its GPU only, no longer to every GPU it could be on.
    state, rooms = two_gpus_reporting_one_pod()
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u1": 2 * GIB}, 1: {"u2": GIB}}))
    assert rooms == ["gpu-a"]
    rooms.clear()
    state.on_report("MODIFIED", gpu_report("gpu-a", {0: {"u1": 3 * GIB}, 1: {"u2": GIB}}))
    assert rooms == []


def test_a_pod_located_by_its_allocation_alone_is_room_too() -> None:
    state, rooms = two_gpus_reporting_one_pod()
    allocated = gpu_report("gpu-a", {0: {"u1": GIB}, 1: {"u2": 0}})
    allocated["status"]["gpus"][1]["pods"][0]["allocated"] = True
    state.on_report("MODIFIED", allocated)
    assert rooms == ["gpu-a"]


def two_gpus_one_pod_bound() -> tuple[ClusterState, list[str], str, float]:
    """A 2-GPU node with one 10 GiB pod bound, using 12 GiB of GPU 0; its UID."""
    state, rooms = watched(gpu_node("gpu-a", gpus=2))
    pod = gpu_pod("p", node="gpu-a", declared="10Gi", phase="Running")
    state.on_pod("ADDED", pod)
    return state, rooms, pod["metadata"]["uid"], EPOCH.timestamp()


def test_a_gpu_read_again_after_an_nvml_error_is_room() -> None:
    # NVML failed on GPU 0 for a moment (adversary: the fault): the pod it held is
    # no longer located, so it is charged on GPU 1 too. The next report reads GPU 0
    # again with the same figures: GPU 1 has its room back, and nothing else
    # happens in the cluster that kube-scheduler would retry the waiting pod on.
    state, rooms, uid, now = two_gpus_one_pod_bound()
    usage = {0: {uid: 12 * GIB}, 1: {}}
    failed = gpu_report("gpu-a", usage)
    failed["status"]["gpus"][0]["error"] = "Unknown Error"
    state.on_report("ADDED", failed)
    state.prepare(now)
    before = state.shared_headroom["gpu-a"]
    rooms.clear()
    state.on_report("MODIFIED", gpu_report("gpu-a", usage))
    state.prepare(now)
    assert state.shared_headroom["gpu-a"] > before
    assert rooms == ["gpu-a"]


def test_replicas_listed_again_by_the_device_plugin_is_room() -> None:
    # While the agent saw replicas kubelet allocated that the plugin no longer lists,
    # every unlocated pod counted on every GPU (ClusterState._predates_cut); once the
    # report shows none, the spread bound holds again and the other GPU has room.
    state, rooms, uid, now = two_gpus_one_pod_bound()
    state.on_pod("ADDED", gpu_pod("q", node="gpu-a", declared="10Gi", phase="Running"))
    usage = {0: {uid: 12 * GIB}, 1: {}}
    unlisted = gpu_report("gpu-a", usage)
    unlisted["status"]["gpus"][1]["unlistedReplicas"] = 1
    state.on_report("ADDED", unlisted)
    state.prepare(now)
    before = state.shared_headroom["gpu-a"]
    rooms.clear()
    state.on_report("MODIFIED", gpu_report("gpu-a", usage))
    state.prepare(now)
    assert state.shared_headroom["gpu-a"] > before
    assert rooms == ["gpu-a"]


def test_a_node_added_or_offering_more_is_room_and_a_stamp_is_not() -> None:
    # kube-scheduler retries a waiting pod on the Node event itself, but its watch may
    # deliver it before the extender's (a lagging watch, a re-list): the extender
    # refuses the pod with the node it knows, and when its own watch shows the node
    # nothing retries the pod again until the 5-minute flush.
    state = ClusterState(margin=0, stale_after=90.0)
    rooms: list[str] = []
    state.on_room = rooms.append
    node = gpu_node("gpu-a", replicas=4)
    state.on_node("ADDED", node)
    assert rooms == ["gpu-a"]
    rooms.clear()
    stamped = {
        **node,
        "metadata": {**node["metadata"], "annotations": {"headroom.dev/room-at": "x"}},
    }
    state.on_node("MODIFIED", stamped)
    assert rooms == []  # its own stamp is no room: no stamp answers it
    state.on_node("MODIFIED", gpu_node("gpu-a", replicas=8))
    assert rooms == ["gpu-a"]


def test_a_nomination_ended_is_room_where_it_was() -> None:
    # The room a preemptor was nominated to is kept from pods of no higher priority
    # (ClusterState.ahead). kube-scheduler retries those pods when the preemptor is
    # deleted or its nomination moves, but may before the extender's watch shows it:
    # refused again, they waited for the 5-minute flush.
    state, rooms = watched(gpu_node("gpu-a"), gpu_node("gpu-b"))
    urgent = gpu_pod("urgent", declared="30Gi")
    urgent["spec"]["priority"] = 1000
    urgent["status"]["nominatedNodeName"] = "gpu-a"
    state.on_pod("ADDED", urgent)
    assert rooms == []
    moved = {**urgent, "status": {**urgent["status"], "nominatedNodeName": "gpu-b"}}
    state.on_pod("MODIFIED", moved)
    assert rooms == ["gpu-a"]
    rooms.clear()
    state.on_pod("DELETED", moved)
    assert rooms == ["gpu-b"]
