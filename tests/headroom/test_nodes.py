"""A node's GPUs from GPU Feature Discovery labels and device-plugin capacity."""

from typing import Any

from headroom.nodes import parse_node
from headroom.quantity import MIB
from tests.extender.objects import A100_40GB, gpu_node


def test_time_sliced_node() -> None:
    node = parse_node(gpu_node("gpu-a", gpus=2, replicas=4))
    assert node.name == "gpu-a"
    assert node.product == A100_40GB  # GFD's -SHARED suffix dropped
    assert node.count == 2
    assert node.memory_bytes == 40960 * MIB
    assert node.replicas == 4
    assert node.shared_capacity == 8
    assert node.mig == {}
    assert node.problems == ()


def test_mig_node_uses_advertised_memory_then_the_table() -> None:
    obj = gpu_node("mig-a", replicas=1, mig={"1g.5gb": 7, "3g.20gb": 2, "2g.10gb+me": 1})
    obj["metadata"]["labels"]["nvidia.com/mig-1g.5gb.memory"] = "4800"
    node = parse_node(obj)
    assert node.mig["1g.5gb"].capacity == 7
    assert node.mig["1g.5gb"].memory_bytes == 4800 * MIB  # the label wins
    assert node.mig["3g.20gb"].memory_bytes == 19968 * MIB  # DESIGN.md §7
    assert node.mig["2g.10gb+me"].capacity == 1  # the plugin's ".me" read back as "+me"


def test_missing_labels_are_conservative_and_said() -> None:
    obj = gpu_node("bare")
    labels = obj["metadata"]["labels"]
    del labels["nvidia.com/gpu.count"]
    labels["nvidia.com/gpu.memory"] = "forty"
    node = parse_node(obj)
    assert node.count == 1
    assert node.memory_bytes == 0
    assert any("nvidia.com/gpu.count" in p for p in node.problems)
    assert any("nvidia.com/gpu.memory" in p for p in node.problems)


def test_count_label_and_device_plugin_capacity_are_both_heard() -> None:
    # The label is GFD's word, the capacity the device plugin's (GPUs x replicas):
    # GPUs either shows are kept and charged; only GPUs both show are counted on.
    for label, charged, confirmed in (("1", 2, 1), ("4", 4, 2), ("2", 2, 2)):
        obj = gpu_node("gpu-a", gpus=2, replicas=4)
        obj["metadata"]["labels"]["nvidia.com/gpu.count"] = label
        node = parse_node(obj)
        assert (node.count, node.confirmed) == (charged, confirmed), label
        disagree = any("nvidia.com/gpu.shared capacity" in p for p in node.problems)
        assert disagree == (charged != confirmed), label
        assert node.counted == (not disagree), label


def test_capacity_alone_is_charged_but_counted_on_as_one_gpu() -> None:
    # No count label: the capacity (32 / replicas 4 = 8) is all there is, and a
    # wrong replicas label would multiply it. Charge every GPU it shows, count on one.
    for replicas, charged in ((4, 8), (1, 32)):
        obj = gpu_node("gpu-a", gpus=8, replicas=4)
        del obj["metadata"]["labels"]["nvidia.com/gpu.count"]
        obj["metadata"]["labels"]["nvidia.com/gpu.replicas"] = str(replicas)
        node = parse_node(obj)
        assert (node.count, node.confirmed) == (charged, 1), replicas
        assert any("counting on 1" in p for p in node.problems)
        assert not node.counted  # the 1 is a stand-in


def test_node_without_gpus() -> None:
    node = parse_node({"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "8"}}})
    assert (node.count, node.memory_bytes, node.shared_capacity, node.problems) == (0, 0, 0, ())


def test_malformed_node_never_raises() -> None:
    hostile: list[Any] = [
        {},
        {"metadata": None, "status": "x"},
        {"metadata": {"name": 5, "labels": {"nvidia.com/gpu.count": 3}}},
        {
            "metadata": {"name": "n", "labels": []},
            "status": {"capacity": {"nvidia.com/mig-x": "1"}},
        },
        {"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu.shared": "-4"}}},
        {"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu.shared": "٣"}}},
    ]
    for obj in hostile:
        node = parse_node(obj)
        assert node.count >= 0
        assert node.shared_capacity >= 0


def test_replicas_per_gpu_only_where_the_labels_and_the_device_plugin_agree() -> None:
    # The cap on what one GPU can hold (headroom.spread) is only as good as R: it is
    # taken where GFD's count and replicas labels and the device plugin's capacity
    # agree exactly, and on a node without MIG (whose GPUs the count label also counts).
    assert parse_node(gpu_node("n", gpus=8, replicas=4)).replicas_per_gpu == 4
    relabelled = gpu_node("n", gpus=8, replicas=4)
    relabelled["status"]["capacity"]["nvidia.com/gpu.shared"] = "64"  # the plugin has 8
    assert parse_node(relabelled).replicas_per_gpu is None
    unlabelled = gpu_node("n", gpus=8, replicas=4)
    del unlabelled["metadata"]["labels"]["nvidia.com/gpu.replicas"]
    assert parse_node(unlabelled).replicas_per_gpu is None
    assert parse_node(gpu_node("n", gpus=2, mig={"1g.5gb": 7})).replicas_per_gpu is None
