"""The simulated backend: usage patterns over time, finite GPUs, starvation."""

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from agent.attribution import build_status
from agent.gpuspec import GPUSpec, parse_gpu_spec, spec_from_node
from agent.probe import GPU, ProbeUnavailable
from agent.simulated import SimulatedProbe
from agent.usage import Leak, Spiky, Steady, UsageError, parse_usage
from headroom import names
from headroom.quantity import GIB, MIB
from tests.agent.doubles import Clock, pod


def usage(**pattern: Any) -> dict[str, str]:
    return {names.ANNOTATION_SIMULATED_USAGE: json.dumps(pattern)}


def a100_node(**labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-node-1",
            "labels": {
                names.LABEL_COUNT: "1",
                names.LABEL_MEMORY_MIB: "40960",
                names.LABEL_PRODUCT: "NVIDIA-A100-PCIE-40GB",
                **labels,
            },
        },
        "status": {"capacity": {names.GPU_SHARED: "4"}},
    }


# --- the patterns ---------------------------------------------------------------


def test_steady_oscillates_between_base_and_base_plus_amplitude() -> None:
    steady = parse_usage('{"pattern":"steady","base":"8Gi","amplitude":"2Gi","periodSeconds":20}')
    assert isinstance(steady, Steady)
    assert steady.demand(0) == 8 * GIB
    assert steady.demand(10) == 10 * GIB  # half a period: the peak
    assert steady.demand(5) == 9 * GIB
    assert steady.demand(20) == 8 * GIB
    assert all(8 * GIB <= steady.demand(t / 3) <= 10 * GIB for t in range(300))


def test_spiky_adds_the_amplitude_at_the_end_of_each_period() -> None:
    spiky = parse_usage(
        '{"pattern":"spiky","base":"2Gi","amplitude":"8Gi","periodSeconds":60,"spikeSeconds":15}'
    )
    assert isinstance(spiky, Spiky)
    assert [spiky.demand(t) // GIB for t in (0, 30, 44, 45, 59, 60, 105)] == [
        2,
        2,
        2,
        10,
        10,
        2,
        10,
    ]
    default = parse_usage('{"pattern":"spiky","base":"1Gi","amplitude":"1Gi","periodSeconds":40}')
    assert [default.demand(t) // GIB for t in (29, 30, 39)] == [1, 2, 2]  # a quarter period


def test_leak_grows_linearly_up_to_its_max() -> None:
    leak = parse_usage('{"pattern":"leak","base":"1Gi","ratePerMinute":"6Gi","max":"20Gi"}')
    assert isinstance(leak, Leak)
    assert [leak.demand(t) // GIB for t in (0, 60, 90, 180, 3600)] == [1, 7, 10, 19, 20]
    unbounded = parse_usage('{"pattern":"leak","base":1073741824,"ratePerMinute":"1Gi"}')
    assert unbounded.demand(6000) == 101 * GIB


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"pattern":"steady","base":"8Gx"}', "steady.base"),
        ('{"pattern":"steady","base":"8Gi","periodSeconds":0}', "periodSeconds"),
        ('{"pattern":"spiky","base":"2Gi"}', "spiky.amplitude"),
        ('{"pattern":"leak","base":"1Gi","rate":"1Gi"}', "leak.rate"),
        ('{"pattern":"wave","base":"1Gi"}', "wave"),
        ('{"pattern":"steady","base":true}', "steady.base"),
        ("not json", "not JSON"),
        ("[]", "(value)"),
    ],
)
def test_bad_annotations_name_the_annotation_and_field(text: str, field: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_usage(text)
    assert names.ANNOTATION_SIMULATED_USAGE in str(caught.value)
    assert field in str(caught.value)


# --- GPUs -----------------------------------------------------------------------


def test_gpus_from_the_node_labels() -> None:
    spec = spec_from_node(a100_node(**{names.LABEL_COUNT: "2"}))
    assert spec == GPUSpec(2, 40960 * MIB, "NVIDIA-A100-PCIE-40GB")


def test_a_node_without_gpu_labels_is_unavailable_not_a_crash() -> None:
    with pytest.raises(ProbeUnavailable) as caught:
        spec_from_node({"metadata": {"name": "cpu-node", "labels": {}}})
    assert caught.value.reason == "NoGPULabels"
    probe = SimulatedProbe("cpu-node", pods=list)  # node not read yet
    with pytest.raises(ProbeUnavailable):
        probe.snapshot()


def test_explicit_gpu_spec() -> None:
    assert parse_gpu_spec("2x40Gi") == GPUSpec(2, 40 * GIB)
    assert parse_gpu_spec("1x80Gi:NVIDIA-H100") == GPUSpec(1, 80 * GIB, "NVIDIA-H100")
    for bad in ("40Gi", "0x40Gi", "2x", "twox40Gi", "2x40Gx"):
        with pytest.raises(ValueError, match="GPU spec"):
            parse_gpu_spec(bad)


def test_mig_node_gets_mig_devices_and_mig_pods_get_a_device_each() -> None:
    node = a100_node(
        **{"nvidia.com/mig-3g.20gb.memory": "19968", names.LABEL_MIG_STRATEGY: "mixed"}
    )
    node["status"]["capacity"] = {"nvidia.com/mig-3g.20gb": "2"}
    pods = [
        pod(
            "a",
            "uid-a",
            resource="nvidia.com/mig-3g.20gb",
            annotations=usage(pattern="steady", base="4Gi"),
        ),
        pod(
            "b",
            "uid-b",
            resource="nvidia.com/mig-3g.20gb",
            annotations=usage(pattern="steady", base="30Gi"),
        ),
        pod("c", "uid-c", resource="nvidia.com/mig-3g.20gb"),  # no device left
    ]
    (gpu,) = SimulatedProbe("gpu-node-1", pods=lambda: pods, node=lambda: node).snapshot().gpus
    assert gpu.mig_enabled
    assert [(d.profile, d.total_bytes) for d in gpu.mig_devices] == [("3g.20gb", 19968 * MIB)] * 2
    first, second = gpu.mig_devices
    assert [(p.pod_uid, p.used_bytes, p.starved_bytes) for p in first.processes] == [
        ("uid-a", 4 * GIB, 0)
    ]
    # A MIG slice is isolated: the big pod starves inside its own slice only.
    ((uid, used, starved),) = [(p.pod_uid, p.used_bytes, p.starved_bytes) for p in second.processes]
    assert (uid, used, starved) == ("uid-b", 19968 * MIB, 30 * GIB - 19968 * MIB)
    assert gpu.used_bytes == 4 * GIB + 19968 * MIB


def test_a_deleted_mig_pods_device_goes_to_the_next_pod() -> None:
    node = a100_node(
        **{"nvidia.com/mig-3g.20gb.memory": "19968", names.LABEL_MIG_STRATEGY: "mixed"}
    )
    node["status"]["capacity"] = {"nvidia.com/mig-3g.20gb": "2"}
    mig = "nvidia.com/mig-3g.20gb"
    pods = [pod("a", "uid-a", resource=mig), pod("b", "uid-b", resource=mig)]
    probe = SimulatedProbe("gpu-node-1", pods=lambda: pods, node=lambda: node)
    probe.snapshot()
    pods[:] = [pod("b", "uid-b", resource=mig), pod("c", "uid-c", resource=mig)]
    (gpu,) = probe.snapshot().gpus
    assert sorted(uid for d in gpu.mig_devices for uid in d.allocated) == ["uid-b", "uid-c"]


def test_shared_pods_spread_deterministically_over_gpus() -> None:
    pods = [
        pod(f"p{i}", f"uid-{i}", annotations=usage(pattern="steady", base="1Gi")) for i in range(12)
    ]
    spec = GPUSpec(4, 40 * GIB)
    layouts = [
        [
            sorted(p.pod_uid or "" for p in g.processes)
            for g in SimulatedProbe("n", pods=lambda: pods, spec=spec).snapshot().gpus
        ]
        for _ in range(2)
    ]
    assert layouts[0] == layouts[1]
    assert sum(len(uids) for uids in layouts[0]) == 12
    assert sum(1 for uids in layouts[0] if uids) >= 2  # not all on one GPU


def test_pods_that_are_not_running_or_not_gpu_users_hold_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cpu_only = pod("cpu", "uid-cpu")
    cpu_only["spec"]["containers"][0]["resources"] = {}
    pods = [
        pod(
            "pending",
            "uid-pending",
            phase="Pending",
            annotations=usage(pattern="steady", base="5Gi"),
        ),
        cpu_only,
        pod("declared", "uid-declared", memory="3Gi"),
        pod("bad", "uid-bad", annotations={names.ANNOTATION_SIMULATED_USAGE: "{oops"}),
    ]
    probe = SimulatedProbe("n", pods=lambda: pods, spec=GPUSpec(1, 40 * GIB))
    with caplog.at_level(logging.WARNING):
        probe.snapshot()
        (gpu,) = probe.snapshot().gpus
    held = {p.pod_uid: p.used_bytes for p in gpu.processes}
    assert held == {"uid-declared": 3 * GIB, "uid-bad": 0}  # without a pattern: declared memory
    assert len([r for r in caplog.records if "uid-bad" in r.getMessage()]) == 1  # warned once


# --- the seed 001 story -----------------------------------------------------------


def seed_001_pods() -> list[dict[str, Any]]:
    return [
        pod(
            "simulation",
            "uid-sim",
            started="2025-01-01T00:00:00Z",
            annotations=usage(pattern="steady", base="8Gi", amplitude="2Gi", periodSeconds=120),
        ),
        pod(
            "inference",
            "uid-inf",
            started="2025-01-01T00:00:01Z",
            annotations=usage(
                pattern="spiky", base="2Gi", amplitude="8Gi", periodSeconds=60, spikeSeconds=15
            ),
        ),
        pod(
            "notebook",
            "uid-nb",
            started="2025-01-01T00:00:02Z",
            annotations=usage(pattern="leak", base="1Gi", ratePerMinute="6Gi"),
        ),
    ]


def by_pod(gpu: GPU) -> dict[str, tuple[int, int]]:
    return {p.pod_uid or "": (p.used_bytes or 0, p.starved_bytes or 0) for p in gpu.processes}


def test_seed_001_the_leaking_notebook_starves_the_other_two() -> None:
    pods = seed_001_pods()
    clock = Clock()
    probe = SimulatedProbe(
        "gpu-node-1", pods=lambda: pods, node=lambda: a100_node(), clock=clock.now
    )
    timeline = []
    for _ in range(int(15 * 60 / 5)):  # 15 minutes, a tick every 5 s
        (gpu,) = probe.snapshot().gpus
        assert gpu.used_bytes <= gpu.total_bytes == 40960 * MIB
        assert gpu.used_bytes + gpu.free_bytes == gpu.total_bytes
        assert gpu.used_bytes == sum(p.used_bytes or 0 for p in gpu.processes)
        timeline.append((clock.seconds, by_pod(gpu)))
        clock.advance(5)
    first_minute = [state for t, state in timeline if t <= 60]
    assert all(starved == 0 for state in first_minute for _, starved in state.values())
    late = [state for t, state in timeline if t >= 10 * 60]
    assert any(state["uid-sim"][1] > 0 for state in late), "the simulation never starved"
    assert any(state["uid-inf"][1] > 0 for state in late), "the inference never starved"
    final = timeline[-1][1]
    # The notebook holds everything but the others' baselines (8 + 2 GiB).
    assert final["uid-nb"][0] > 29 * GIB
    assert final["uid-inf"][0] == 2 * GIB
    assert final["uid-nb"][1] > 0  # and its own next allocation fails too

    # The notebook goes away: its memory is released and the others get theirs again.
    pods.pop()
    clock.advance(5)
    probe.snapshot()
    clock.advance(5)
    (gpu,) = probe.snapshot().gpus
    assert set(by_pod(gpu)) == {"uid-sim", "uid-inf"}
    assert all(starved == 0 for _, starved in by_pod(gpu).values())


def test_first_come_first_served_when_two_pods_want_the_last_memory() -> None:
    pods = [
        pod(
            "late",
            "uid-late",
            started="2025-01-01T00:01:00Z",
            annotations=usage(pattern="steady", base="6Gi"),
        ),
        pod(
            "early",
            "uid-early",
            started="2025-01-01T00:00:00Z",
            annotations=usage(pattern="steady", base="6Gi"),
        ),
    ]
    (gpu,) = SimulatedProbe("n", pods=lambda: pods, spec=GPUSpec(1, 10 * GIB)).snapshot().gpus
    assert by_pod(gpu) == {"uid-early": (6 * GIB, 0), "uid-late": (4 * GIB, 2 * GIB)}


def test_shared_pods_get_the_gpu_with_fewest_pods_and_keep_it() -> None:
    # The stand-in for the device plugin's distributed policy (headroom.spread).
    pods = [
        pod(f"p{i}", f"uid-{i:02}", annotations=usage(pattern="steady", base="1Gi"))
        for i in range(10)
    ]
    probe = SimulatedProbe("n", pods=lambda: pods, spec=GPUSpec(8, 40 * GIB))

    def layout() -> dict[str, int]:
        return {p.pod_uid or "": g.index for g in probe.snapshot().gpus for p in g.processes}

    first = layout()
    per_gpu = [list(first.values()).count(g) for g in range(8)]
    assert sorted(per_gpu) == [1] * 6 + [2] * 2, per_gpu
    del pods[0:3]  # three leave; the rest stay where they are
    pods.append(pod("new", "uid-new", annotations=usage(pattern="steady", base="1Gi")))
    second = layout()
    assert all(second[uid] == first[uid] for uid in second if uid != "uid-new")
    emptied = [g for g in range(8) if g not in second.values() or g == second["uid-new"]]
    assert second["uid-new"] in emptied
    assert list(second.values()).count(second["uid-new"]) == 1


def test_a_pod_is_allocated_its_gpu_before_it_holds_memory() -> None:
    # What kubelet's PodResources says on a real node: the extender locates it at once.
    cpu_only = pod("cpu", "uid-3-cpu", annotations=usage(pattern="steady", base="1Gi"))
    cpu_only["spec"]["containers"][0]["resources"] = {}
    pods = [
        pod("busy", "uid-1-busy", annotations=usage(pattern="steady", base="2Gi")),
        pod("idle", "uid-2-idle", annotations=usage(pattern="steady", base="0")),
        cpu_only,
    ]
    probe = SimulatedProbe("n", pods=lambda: pods, spec=GPUSpec(3, 40 * GIB))
    gpus = probe.snapshot().gpus
    assert [sorted(g.allocated) for g in gpus] == [["uid-1-busy"], ["uid-2-idle"], []]
    assert {p.pod_uid: p.used_bytes for p in gpus[1].processes} == {"uid-2-idle": 0}
    status = build_status(
        node_name="n",
        backend="simulated",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        snapshot=probe.snapshot(),
        failure=None,
        pods={p["metadata"]["uid"]: p for p in pods},
        resolve=lambda pid: None,
    )
    listed = {(g.index, p.uid): (p.used_bytes, p.allocated) for g in status.gpus for p in g.pods}
    assert listed == {
        (0, "uid-1-busy"): (2 * GIB, True),
        (1, "uid-2-idle"): (0, True),
        (2, "uid-3-cpu"): (GIB, False),  # a pattern and no GPU resource: nothing to allocate
    }


def test_a_mig_pod_is_allocated_its_device() -> None:
    node = a100_node(
        **{"nvidia.com/mig-3g.20gb.memory": "19968", names.LABEL_MIG_STRATEGY: "mixed"}
    )
    node["status"]["capacity"] = {"nvidia.com/mig-3g.20gb": "2"}
    pods = [pod("a", "uid-a", resource="nvidia.com/mig-3g.20gb")]
    (gpu,) = SimulatedProbe("gpu-node-1", pods=lambda: pods, node=lambda: node).snapshot().gpus
    assert gpu.allocated == frozenset()
    assert [d.allocated for d in gpu.mig_devices] == [frozenset({"uid-a"}), frozenset()]
