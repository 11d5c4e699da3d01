"""The guard evicts only on figures a GPU can hold.

NVML can return nonsense for one GPU (a driver fault, a GPU falling off the bus
between two reads): a process holding more than the whole GPU or MIG device.
Resident device memory cannot exceed the device, so such a figure proves nothing
-- the report still carries it, where it only charges more -- and the guard must
not evict on it. A pod that is really over on a reading that can be is still
evicted.
"""

from agent.guard import Guard
from headroom.quantity import GIB
from headroom.reports import MigDeviceUsage, PodUsage, ReportStatus
from tests.agent.test_guard import NAMESPACES, POLICIES, gpus, guarded


def given(usage: dict[int, dict[str, int]]) -> ReportStatus:
    """:func:`tests.agent.test_guard.gpus`, every pod allocated the GPU it is read on."""
    return gpus(usage, allocated={index: set(held) for index, held in usage.items()})


def verdicts(status: ReportStatus, times: int = 3) -> list[tuple[str, str]]:
    pods = {"a": guarded("a", "strict", "10Gi"), "b": guarded("b", "strict", "10Gi")}
    guard = Guard(grace=2)
    out: list[tuple[str, str]] = []
    for _ in range(times):
        out += [(v.kind, v.uid) for v in guard.observe(status, pods, POLICIES, NAMESPACES)]
    return out


def test_a_process_holding_more_than_the_gpu_is_no_proof() -> None:
    # NVML says pod a holds 64 GiB of a 40 GiB GPU: garbage, not an over-declaration.
    assert verdicts(given({0: {"a": 64 * GIB}})) == []


def test_a_mig_device_holding_more_than_its_slice_is_no_proof() -> None:
    status = given({0: {}})
    status.gpus[0].mig_enabled = True
    status.gpus[0].mig_devices = [
        MigDeviceUsage(
            uuid="MIG-0", profile="1g.10gb", total_bytes=10 * GIB, used_bytes=12 * GIB,
            pods=[PodUsage(uid="a", used_bytes=12 * GIB, allocated=False)],
        )
    ]  # fmt: skip
    assert verdicts(status) == []


def test_a_pod_over_on_a_consistent_reading_is_still_evicted() -> None:
    assert ("evict", "a") in verdicts(given({0: {"a": 16 * GIB, "b": 4 * GIB}}))


def test_garbage_on_its_own_gpu_does_not_hide_a_gpu_kubelet_never_gave_it() -> None:
    # kubelet gave pod a GPU 0, where NVML's figure for it is garbage (64 GiB of 40);
    # a reads 4 GiB on GPU 1, which kubelet never gave it (NVIDIA_VISIBLE_DEVICES=all).
    # Dropping the garbage figure must not drop what it says with it: GPU 0 is a's.
    status = gpus({0: {"a": 64 * GIB}, 1: {"a": 4 * GIB}}, allocated={0: {"a"}})
    assert ("evict", "a") in verdicts(status)
