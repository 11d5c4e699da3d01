"""The node capacity of headroom.dev/gpu-memory: what it should be, and the advertiser."""

import asyncio
from typing import Any

import pytest

from extender.capacity import PATCH_WORKERS, CapacityAdvertiser
from headroom import names
from headroom.capacity import advertised, capacity_patch, desired_capacity
from headroom.nodes import parse_node
from headroom.quantity import MIB
from kube.rest import ApiError, Unreachable
from tests.extender.objects import GIB, gpu_node

MARGIN = 512 * 2**20


def test_a_shared_node_advertises_its_gpus_memory_less_the_margin() -> None:
    node = gpu_node("a", gpus=2)
    assert desired_capacity(parse_node(node), MARGIN) == 2 * (40 * GIB - MARGIN)
    patch = capacity_patch(node, parse_node(node), MARGIN)
    assert patch == {
        "status": {
            "capacity": {names.GPU_MEMORY: "79Gi"},
            "allocatable": {names.GPU_MEMORY: "79Gi"},
        }
    }
    node["status"]["capacity"][names.GPU_MEMORY] = "79Gi"
    node["status"]["allocatable"][names.GPU_MEMORY] = str(2 * (40 * GIB - MARGIN))
    assert capacity_patch(node, parse_node(node), MARGIN) == {}  # same value, other spelling


def test_gpus_only_the_count_label_shows_advertise_nothing() -> None:
    # Label raised to 4 on a node whose device plugin has 2 GPUs: room for 2.
    node = gpu_node("a", gpus=2)
    node["metadata"]["labels"][names.LABEL_COUNT] = "4"
    assert desired_capacity(parse_node(node), MARGIN) == 2 * (40 * GIB - MARGIN)


def test_a_zeroed_capacity_is_put_back() -> None:
    # kubelet zeroes extended resources it does not know when it restarts afresh.
    node = gpu_node("a")
    node["status"]["capacity"][names.GPU_MEMORY] = "0"
    node["status"]["allocatable"][names.GPU_MEMORY] = "0"
    assert capacity_patch(node, parse_node(node), MARGIN)["status"]["capacity"] == {
        names.GPU_MEMORY: "40448Mi"
    }


def test_a_node_without_shared_gpus_advertises_none() -> None:
    node = gpu_node("m", mig={"3g.20gb": 1})
    assert desired_capacity(parse_node(node), MARGIN) == 0
    assert capacity_patch(node, parse_node(node), MARGIN) == {}


def test_a_restarted_kubelet_without_its_device_plugin_yet_keeps_the_capacity() -> None:
    # kubelet reports nvidia.com/gpu.shared as 0 until the device plugin registers
    # again, and re-admits the running pods meanwhile: lowered to 0, the GPU memory
    # resource would fail every one of them (OutOfheadroom.dev/gpu-memory).
    node = gpu_node("a")
    for resources in (node["status"]["capacity"], node["status"]["allocatable"]):
        resources[names.GPU_MEMORY] = "40448Mi"  # advertised before the restart
        resources[names.GPU_SHARED] = "0"
    assert advertised(node) == (40448 * MIB, 40448 * MIB)
    assert capacity_patch(node, parse_node(node), MARGIN) == {}


async def test_the_advertiser_patches_once_and_retries_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("extender.capacity.RETRY_SECONDS", (0.01,))
    calls: list[tuple[str, dict[str, Any]]] = []
    failures = [Unreachable("connection reset", sent=True)]

    async def patcher(node: str, body: dict[str, Any]) -> None:
        calls.append((node, body))
        if failures:
            raise failures.pop()

    advertiser = CapacityAdvertiser(patcher, MARGIN)
    node = gpu_node("a")
    advertiser.on_node("ADDED", node)
    advertiser.on_node("MODIFIED", node)  # already being patched: no second task
    for _ in range(100):
        if advertiser.patched:
            break
        await asyncio.sleep(0.01)
    assert advertiser.patched == 1
    assert [name for name, _ in calls] == ["a", "a"]  # one failure, one retry


async def test_a_storm_of_nodes_is_patched_a_few_at_a_time_and_a_retry_holds_no_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 8: a first list of 5,000 nodes made 5,000 tasks, each waiting for a thread.
    monkeypatch.setattr("extender.capacity.RETRY_SECONDS", (0.3,))
    in_flight = 0
    most = 0
    calls: list[str] = []
    failures = {"n-0": ApiError(503, "etcd leader changed")}

    async def patcher(node: str, body: dict[str, Any]) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        calls.append(node)
        try:
            if node in failures:
                raise failures.pop(node)
            await asyncio.sleep(0.002)
        finally:
            in_flight -= 1

    advertiser = CapacityAdvertiser(patcher, MARGIN)
    for i in range(200):
        advertiser.on_node("ADDED", gpu_node(f"n-{i}"))
    for _ in range(300):
        if advertiser.patched == 200:
            break
        await asyncio.sleep(0.01)
    assert advertiser.patched == 200
    assert most <= PATCH_WORKERS
    assert calls.count("n-0") == 2
    # The other 199 did not wait out n-0's backoff: its retry came last.
    assert calls[-1] == "n-0"
    assert advertiser._busy == set()
