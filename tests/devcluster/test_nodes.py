"""The node file: the seeds' defaults, and clear errors for bad files."""

from pathlib import Path

import pytest

from devcluster import nodes
from headroom import names


def test_default_nodes_are_the_seeds_nodes() -> None:
    specs = {spec.name: spec for spec in nodes.load()}

    assert set(specs) == {"a100-shared-0", "a100-shared-1", "a100-mig-0", "t4-shared-0", "cpu-0"}
    shared = specs["a100-shared-0"]
    assert shared.capacity[names.GPU_SHARED] == "4"
    assert shared.labels[names.LABEL_PRODUCT] == "A100-PCIE-40GB-SHARED"
    assert shared.labels[names.LABEL_SHARING_STRATEGY] == "time-slicing"
    assert shared.labels[names.LABEL_MEMORY_MIB] == "40960"
    assert shared.labels[names.LABEL_REPLICAS] == "4"
    assert [t.model_dump() for t in shared.taints] == [
        {"key": "node-role.kubernetes.io/gpu", "value": "true", "effect": "NoSchedule"}
    ]
    mig = specs["a100-mig-0"]
    assert mig.capacity["nvidia.com/mig-3g.20gb"] == "1"
    assert mig.capacity["nvidia.com/mig-2g.10gb"] == "2"
    assert mig.labels[names.LABEL_MIG_STRATEGY] == "mixed"
    assert mig.labels["nvidia.com/mig-2g.10gb.count"] == "2"
    assert specs["t4-shared-0"].labels[names.LABEL_MEMORY_MIB] == "15360"
    assert [s.name for s in specs.values() if not s.has_gpu()] == ["cpu-0"]
    assert nodes.mig_resources(list(specs.values())) == [
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    ]


def test_node_object_is_managed_by_kwok_with_capacity_as_allocatable() -> None:
    spec = nodes.load()[0]
    obj = spec.to_object()

    assert obj["metadata"]["annotations"][nodes.KWOK_ANNOTATION] == "fake"
    assert obj["metadata"]["labels"]["kubernetes.io/hostname"] == spec.name
    assert obj["status"]["allocatable"] == obj["status"]["capacity"]
    assert obj["spec"]["taints"][0]["effect"] == "NoSchedule"


def test_numbers_in_yaml_become_strings(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(
        "nodes:\n- name: n1\n  labels: {nvidia.com/gpu.count: 1, nvidia.com/mig.capable: true}\n"
        "  capacity: {nvidia.com/gpu.shared: 4}\n"
    )
    (spec,) = nodes.load(path)

    assert spec.labels == {"nvidia.com/gpu.count": "1", "nvidia.com/mig.capable": "true"}
    assert spec.capacity == {"nvidia.com/gpu.shared": "4"}
    assert spec.has_gpu()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes: []\n", "nodes"),
        ("nodes:\n- name: Bad_Name\n  capacity: {cpu: '1'}\n", "name"),
        ("nodes:\n- name: n1\n  capacity: {cpu: 'lots'}\n", "cpu='lots'"),
        ("nodes:\n- name: n1\n  capacity: {}\n  extra: 1\n", "extra"),
        ("nodes:\n- {name: n1, capacity: {}}\n- {name: n1, capacity: {}}\n", "duplicate"),
        ("nodes: [\n", "cannot read"),
    ],
)
def test_bad_node_files_name_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(text)

    with pytest.raises(nodes.NodesError, match=expected):
        nodes.load(path)
