"""The NVML backend against a test double of pynvml (no GPU on this machine)."""

import logging
from pathlib import Path

import pynvml
import pytest

from agent.guard import Guard
from agent.nvml import NvmlProbe
from agent.probe import ProbeUnavailable
from agent.reporter import Reporter
from agent.service import Agent
from headroom.quantity import GIB, MIB
from headroom.reports import CONDITION_NVML_AVAILABLE
from tests.agent.doubles import ActionsDouble, Clock, WriterDouble
from tests.agent.nvml_double import DeviceDouble, PynvmlDouble

A100_UUID = "GPU-5f2b9c3e-8d1a-4e7f-b6c2-9a0d1e2f3a4b"
T4_UUID = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def two_gpus() -> list[DeviceDouble]:
    return [
        DeviceDouble(
            "NVIDIA A100-PCIE-40GB",
            A100_UUID,
            total=40 * GIB,
            used=12 * GIB,
            processes=[(4242, 8 * GIB), (4343, None)],
            mig_mode=0,
        ),
        DeviceDouble("Tesla T4", T4_UUID, total=15 * GIB, used=300 * MIB),  # no MIG at all
    ]


@pytest.mark.parametrize("strings_as_bytes", [False, True], ids=["str", "bytes"])
def test_reads_every_gpu_with_processes(strings_as_bytes: bool) -> None:
    nvml = PynvmlDouble(two_gpus(), strings_as_bytes=strings_as_bytes)
    snapshot = NvmlProbe(nvml).snapshot()
    a100, t4 = snapshot.gpus
    assert (a100.index, a100.uuid, a100.product) == (0, A100_UUID, "NVIDIA A100-PCIE-40GB")
    assert (a100.total_bytes, a100.used_bytes, a100.free_bytes) == (40 * GIB, 12 * GIB, 28 * GIB)
    assert not a100.mig_enabled
    assert [(p.pid, p.used_bytes) for p in a100.processes] == [(4242, 8 * GIB), (4343, None)]
    assert (t4.index, t4.uuid, t4.product, t4.mig_enabled) == (1, T4_UUID, "Tesla T4", False)
    assert t4.processes == ()


def test_mig_devices_with_gaps_in_the_slots() -> None:
    slot0 = DeviceDouble(
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "MIG-11111111-2222-3333-4444-555555555555",
        total=19968 * MIB,
        used=5 * GIB,
        processes=[(900, 5 * GIB)],
    )
    slot2 = DeviceDouble(
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "MIG-66666666-7777-8888-9999-000000000000",
        total=4864 * MIB,
        used=0,
    )
    gpu = DeviceDouble(
        "NVIDIA A100-SXM4-40GB",
        A100_UUID,
        total=40 * GIB,
        used=5 * GIB,
        processes=[(1, 1)],  # on a MIG GPU, processes are read per MIG device
        mig_mode=1,
        mig_slots={0: slot0, 2: slot2},
    )
    nvml = PynvmlDouble([gpu])
    (observed,) = NvmlProbe(nvml).snapshot().gpus
    assert observed.mig_enabled
    assert observed.processes == ()
    assert [(d.profile, d.total_bytes, d.used_bytes) for d in observed.mig_devices] == [
        ("3g.20gb", 19968 * MIB, 5 * GIB),
        ("1g.5gb", 4864 * MIB, 0),
    ]
    assert [(p.pid, p.used_bytes) for p in observed.mig_devices[0].processes] == [(900, 5 * GIB)]
    assert nvml.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 7


def test_process_listing_not_supported_leaves_memory_counted() -> None:
    device = DeviceDouble(
        "NVIDIA A10",
        A100_UUID,
        total=24 * GIB,
        used=3 * GIB,
        processes_error=pynvml.NVMLError_NoPermission,
    )
    (gpu,) = NvmlProbe(PynvmlDouble([device])).snapshot().gpus
    assert gpu.processes == ()
    assert gpu.used_bytes == 3 * GIB


def test_no_driver_is_reported_and_retried_slowly() -> None:
    nvml = PynvmlDouble(two_gpus())
    nvml.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    clock = Clock()
    probe = NvmlProbe(nvml, retry_seconds=60, clock=clock.monotonic)
    for _ in range(5):  # ticks inside the retry window do not call nvmlInit again
        with pytest.raises(ProbeUnavailable) as caught:
            probe.snapshot()
        assert caught.value.reason == "NVMLLibraryNotFound"
        assert "libnvidia-ml.so.1" in caught.value.message
        clock.advance(5)
    assert probe.init_attempts == 1
    nvml.init_error = None  # the driver got installed
    clock.advance(60)
    assert len(probe.snapshot().gpus) == 2
    assert probe.init_attempts == 2


def test_driver_not_loaded_has_its_own_reason() -> None:
    nvml = PynvmlDouble(two_gpus())
    nvml.init_error = pynvml.NVMLError_DriverNotLoaded()
    with pytest.raises(ProbeUnavailable) as caught:
        NvmlProbe(nvml).snapshot()
    assert caught.value.reason == "NVIDIADriverNotLoaded"


def test_a_lost_gpu_shuts_nvml_down_and_reinitialises_later() -> None:
    nvml = PynvmlDouble(two_gpus())
    clock = Clock()
    probe = NvmlProbe(nvml, retry_seconds=30, clock=clock.monotonic)
    probe.snapshot()
    nvml.query_error = pynvml.NVMLError_GpuIsLost()
    with pytest.raises(ProbeUnavailable) as caught:
        probe.snapshot()
    assert caught.value.reason == "NVMLQueryFailed"
    assert not nvml.initialised  # nvmlShutdown was called
    nvml.query_error = None
    clock.advance(31)
    assert len(probe.snapshot().gpus) == 2
    assert probe.init_attempts == 2


async def test_agent_without_driver_reports_the_condition_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = PynvmlDouble([])
    nvml.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    clock = Clock()
    writer = WriterDouble()
    agent = Agent(
        node_name="gpu-node-1",
        probe=NvmlProbe(nvml, clock=clock.monotonic),
        reporter=Reporter(writer, clock=clock.monotonic),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
        clock=clock.now,
    )
    with caplog.at_level(logging.INFO):
        for _ in range(10):
            status = await agent.tick()
            clock.advance(5)
    condition = status.condition(CONDITION_NVML_AVAILABLE)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "NVMLLibraryNotFound")
    assert condition.last_transition_time == clock.start  # unchanged across ticks
    assert status.gpus == []
    unavailable = [r for r in caplog.records if "backend unavailable" in r.getMessage()]
    assert len(unavailable) == 1
    assert unavailable[0].levelno == logging.ERROR
    # The report says so on the API: one first write, then a heartbeat after 30 s.
    assert len(writer.objects) == 2
    written = writer.objects[0]["status"]["conditions"][0]
    assert (written["type"], written["status"]) == ("NVMLAvailable", "False")


def test_an_nvml_error_on_one_gpu_marks_that_gpu_and_keeps_the_others() -> None:
    devices = two_gpus()
    devices[1].processes_error = pynvml.NVMLError_Unknown
    snapshot = NvmlProbe(PynvmlDouble(devices)).snapshot()
    first, second = snapshot.gpus
    assert first.error == ""
    assert first.total_bytes > 0
    assert second.index == 1
    assert "NVML error reading GPU 1" in second.error


def reporting_agent(nvml: PynvmlDouble, clock: Clock) -> Agent:
    return Agent(
        node_name="gpu-node-1",
        probe=NvmlProbe(nvml, retry_seconds=60, clock=clock.monotonic),
        reporter=Reporter(WriterDouble(), clock=clock.monotonic),
        guard=Guard(),
        actions=ActionsDouble(),
        pods=dict,
        clock=clock.now,
    )


async def test_a_gpu_nvml_cannot_read_is_reported_with_its_last_good_figures() -> None:
    # Zero figures would read as an empty GPU to an extender that has no earlier
    # reading (restarted, or the Node re-created): the agent carries its own.
    devices = two_gpus()
    nvml = PynvmlDouble(devices)
    clock = Clock()
    agent = reporting_agent(nvml, clock)
    good = await agent.tick()
    devices[0].processes_error = pynvml.NVMLError_Unknown
    for _ in range(2):  # and on the ticks after, still the last good figures
        clock.advance(5)
        failing = await agent.tick()
        first, second = failing.gpus
        assert "NVML error reading GPU 0" in first.error
        assert (first.uuid, first.total_bytes, first.used_bytes, first.unattributed_bytes) == (
            A100_UUID,
            40 * GIB,
            12 * GIB,
            good.gpus[0].unattributed_bytes,
        )
        assert second == good.gpus[1]


async def test_nvml_lost_keeps_reporting_the_last_good_figures_marked() -> None:
    nvml = PynvmlDouble(two_gpus())
    clock = Clock()
    agent = reporting_agent(nvml, clock)
    good = await agent.tick()
    nvml.query_error = pynvml.NVMLError_GpuIsLost()
    for _ in range(2):
        clock.advance(5)
        lost = await agent.tick()
        condition = lost.condition(CONDITION_NVML_AVAILABLE)
        assert condition is not None
        assert (condition.status, condition.reason) == ("False", "NVMLQueryFailed")
        assert [g.used_bytes for g in lost.gpus] == [g.used_bytes for g in good.gpus]
        assert all("NVMLQueryFailed" in g.error for g in lost.gpus)


def test_each_gpus_numa_node_is_read_as_the_device_plugin_reads_it(tmp_path: Path) -> None:
    # go-nvlib's GetNumaNode: NVML's PCI bus ID, then sysfs numa_node (-1: none). kubelet's
    # Topology Manager offers the device plugin one NUMA node's GPUs, so the extender
    # bounds unlocated pods per NUMA node (headroom.spread).
    devices = [*two_gpus(), DeviceDouble("Tesla T4", "GPU-3", total=15 * GIB, used=0)]
    buses = ("00000000:3B:00.0", "00000000:AF:00.0", "00000000:D8:00.0")
    for device, bus in zip(devices, buses, strict=True):
        device.bus_id = bus
    for name, node in (("0000:3b:00.0", "0\n"), ("0000:af:00.0", "1\n"), ("0000:d8:00.0", "-1\n")):
        (tmp_path / "bus/pci/devices" / name).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / name / "numa_node").write_text(node)
    gpus = NvmlProbe(PynvmlDouble(devices), sysfs=tmp_path).snapshot().gpus
    assert [gpu.numa_node for gpu in gpus] == [0, 1, None]
    # No sysfs entry, or a bus ID that is not one: unknown, and the GPU still read.
    devices[0].bus_id = "00000000:3B:00.0/../../x"
    (gpu, *_) = NvmlProbe(PynvmlDouble(devices), sysfs=tmp_path / "none").snapshot().gpus
    assert (gpu.numa_node, gpu.error, gpu.total_bytes) == (None, "", 40 * GIB)
