"""Bounded writes: threshold, heartbeat, back-off; and the write rate they give."""

from dataclasses import replace
from datetime import UTC, datetime

from agent.guard import Guard
from agent.probe import GPU, BackendName, GPUProcess, Snapshot
from agent.reporter import Reporter, WritePolicy, change_reason
from agent.service import Agent
from headroom.quantity import GIB, MIB
from headroom.reports import Condition, GPUUsage, PodUsage, ReportStatus, parse_report
from tests.agent.doubles import ActionsDouble, Clock, WriterDouble, pod

TOTAL = 40 * GIB  # 1 % is ~410 MiB, above the 64 MiB floor


def status(
    used: int = 10 * GIB,
    *,
    pods: dict[str, int] | None = None,
    starved: int | None = None,
    allocated: bool = False,
    available: bool = True,
) -> ReportStatus:
    pod_usage = [
        PodUsage(
            uid=uid,
            namespace="ml",
            name=uid,
            used_bytes=bytes_,
            starved_bytes=starved,
            allocated=allocated,
        )
        for uid, bytes_ in (pods or {"p1": used}).items()
    ]
    return ReportStatus(
        node_name="gpu-node-1",
        backend="nvml",
        observed_at=datetime(2025, 1, 1, tzinfo=UTC),
        gpus=[
            GPUUsage(
                index=0,
                uuid="GPU-1",
                product="NVIDIA A100-PCIE-40GB",
                total_bytes=TOTAL,
                used_bytes=used,
                free_bytes=TOTAL - used,
                pods=pod_usage,
            )
        ],
        conditions=[
            Condition(
                type="NVMLAvailable",
                status="True" if available else "False",
                reason="Initialized" if available else "NVMLLibraryNotFound",
            )
        ],
    )


def test_what_counts_as_a_change() -> None:
    policy = WritePolicy()
    base = status()
    assert change_reason(None, base, policy) == "first report"
    # Falling, 1 % of the GPU (410 MiB here) is noise; rising, 256 MiB is not: on an
    # 80 GB GPU 1 % is 815 MiB, above the extender's 512 MiB margin (a review's case).
    assert change_reason(base, status(10 * GIB - 300 * MIB), policy) is None
    assert change_reason(base, status(10 * GIB + 200 * MIB), policy) is None
    for moved in (-500 * MIB, 300 * MIB):
        reason = change_reason(base, status(10 * GIB + moved), policy)
        assert reason is not None
        assert "used_bytes" in reason
    assert change_reason(base, status(pods={"p1": 10 * GIB + 300 * MIB}), policy) is not None
    assert (
        change_reason(base, status(pods={"p1": 10 * GIB, "p2": 0}), policy) == "gpu 0: pods changed"
    )
    starving = change_reason(base, status(starved=1), policy)
    assert starving is not None
    assert "starts starving" in starving
    # Already located by its memory, but kubelet's word is what keeps it there at 0 bytes.
    assert change_reason(base, status(allocated=True), policy) == "gpu 0: pod ml/p1 allocated"
    # Its replicas counted: what locates a pod of several replicas (headroom.accounting).
    given = status(allocated=True)
    counted = replace(
        given, gpus=[replace(given.gpus[0], pods=[replace(given.gpus[0].pods[0], replicas=2)])]
    )
    assert change_reason(given, counted, policy) == "gpu 0: pod ml/p1 replicas counted 2"
    assert change_reason(base, status(available=False), policy) == "condition changed"
    # A GPU NVML stops reading keeps its last figures (agent.attribution): the error says.
    failing = replace(base, gpus=[replace(base.gpus[0], error="NVMLError_Unknown")])
    assert change_reason(base, failing, policy) == "gpu 0: NVML error changed"
    cut = replace(base, gpus=[replace(base.gpus[0], unlisted_replicas=2)])
    assert change_reason(base, cut, policy) == (
        "gpu 0: replicas the device plugin no longer lists changed"
    )
    small_gpu = WritePolicy(threshold_fraction=0.0)  # only the 64 MiB floor
    assert change_reason(base, status(10 * GIB + 100 * MIB), small_gpu) is not None


async def test_threshold_and_heartbeat_bound_the_writes() -> None:
    clock = Clock()
    writer = WriterDouble()
    reporter = Reporter(writer, WritePolicy(heartbeat_seconds=30), clock=clock.monotonic)
    assert await reporter.offer(status())  # first
    clock.advance(5)
    assert not await reporter.offer(status(10 * GIB + 100 * MIB))  # noise
    clock.advance(5)
    assert await reporter.offer(status(12 * GIB))  # real change
    for _ in range(5):  # 25 s of nothing new
        clock.advance(5)
        assert not await reporter.offer(status(12 * GIB))
    clock.advance(5)
    assert await reporter.offer(status(12 * GIB))  # 30 s since the last write: heartbeat
    assert len(writer.objects) == 3
    assert parse_report(writer.objects[-1]).gpus[0].used_bytes == 12 * GIB


async def test_drift_is_measured_against_the_last_write_not_the_last_tick() -> None:
    clock = Clock()
    writer = WriterDouble()
    reporter = Reporter(writer, clock=clock.monotonic)
    used = 10 * GIB
    await reporter.offer(status(used))
    written_after = []
    for tick in range(1, 6):  # 200 MiB less per tick: each step is noise, the sum is not
        clock.advance(5)
        used -= 200 * MIB
        if await reporter.offer(status(used)):
            written_after.append(tick)
    assert written_after == [3]  # 600 MiB > 410 MiB
    reporter, used, written_after = Reporter(writer, clock=clock.monotonic), 10 * GIB, []
    await reporter.offer(status(used))
    for tick in range(1, 6):  # 200 MiB more per tick: written once past 256 MiB
        clock.advance(5)
        used += 200 * MIB
        if await reporter.offer(status(used)):
            written_after.append(tick)
    assert written_after == [2, 4]


async def test_api_errors_back_off_then_retry() -> None:
    clock = Clock()
    writer = WriterDouble()
    writer.fail_next = 3
    reporter = Reporter(writer, clock=clock.monotonic, jitter=lambda: 1.0)
    attempts = []
    for _ in range(12):  # 1 s ticks: retries at 0, 1, 3, 7 (delays 1, 2, 4)
        if reporter.due(status()) is not None:
            attempts.append(clock.seconds)
        await reporter.offer(status())
        clock.advance(1)
    assert attempts == [0, 1, 3, 7]
    assert reporter.errors == 3
    assert len(writer.objects) == 1


async def test_write_rate_per_node() -> None:
    """The figure in the README: 5 s ticks, 30 s heartbeat, over ten minutes."""
    clock = Clock()
    quiet, busy = WriterDouble(), WriterDouble()
    quiet_reporter = Reporter(quiet, clock=clock.monotonic)
    busy_reporter = Reporter(busy, clock=clock.monotonic)
    for tick in range(120):
        await quiet_reporter.offer(status(10 * GIB + (tick % 3) * 50 * MIB))  # jitter only
        await busy_reporter.offer(status(GIB * (1 + tick % 20)))  # 1 GiB steps every tick
        clock.advance(5)
    assert len(quiet.objects) == 20  # 2 per minute
    assert len(busy.objects) == 120  # 12 per minute: one per tick, never more


def test_a_rise_below_the_declaration_changes_no_charge() -> None:
    """The extender charges a declared pod max(declared, held): two pods trading
    300 MiB every tick below their 10 GiB declarations moved no charge, and wrote
    a report every tick (up to 12 a minute) until the rise was judged by the charge."""
    policy = WritePolicy()
    declared = {"p1": 10 * GIB, "p2": 10 * GIB}
    base = status(pods={"p1": 5 * GIB, "p2": 5 * GIB + 300 * MIB})
    swapped = status(pods={"p1": 5 * GIB + 300 * MIB, "p2": 5 * GIB})
    assert change_reason(base, swapped, policy) == "gpu 0: pod ml/p1 moved 300.0 MiB"
    assert change_reason(base, swapped, policy, declared) is None
    # Past the declaration the rise is charged: written once the charge moves 256 MiB.
    near = status(pods={"p1": 10 * GIB - 100 * MIB})
    assert change_reason(near, status(pods={"p1": 10 * GIB + 200 * MIB}), policy, declared) is None
    over = change_reason(near, status(pods={"p1": 10 * GIB + 300 * MIB}), policy, declared)
    assert over == "gpu 0: pod ml/p1 moved 400.0 MiB"
    # A pod the agent does not know the declaration of is charged what it holds.
    assert change_reason(base, swapped, policy, {"p2": 10 * GIB}) is not None
    # Beyond 1% of the GPU it is written as a fall is, below the declaration or not.
    big = status(pods={"p1": 5 * GIB + 500 * MIB, "p2": 5 * GIB + 300 * MIB})
    assert change_reason(base, big, policy, declared) == "gpu 0: pod ml/p1 moved 500.0 MiB"


class Trading:
    """A probe double: two pods trading 300 MiB each tick, the GPU's total unmoved."""

    name: BackendName = "simulated"
    blocking = False

    def __init__(self) -> None:
        self.ticks = 0

    def snapshot(self) -> Snapshot:
        self.ticks += 1
        a, b = (5 * GIB, 5 * GIB + 300 * MIB)[:: 1 if self.ticks % 2 else -1]
        processes = (
            GPUProcess(pid=None, used_bytes=a, pod_uid="uid-a", container="main"),
            GPUProcess(pid=None, used_bytes=b, pod_uid="uid-b", container="main"),
        )
        used = a + b
        return Snapshot((GPU(0, "GPU-1", "A100", TOTAL, used, TOTAL - used, processes=processes),))

    def close(self) -> None:
        pass


async def test_pods_trading_memory_below_their_declarations_write_heartbeats_only() -> None:
    """Through the agent's tick: the declarations come from the pods' specs."""

    def run(memory: str | None) -> Agent:
        pods = {
            uid: pod(name, uid, namespace="ml", memory=memory)
            for name, uid in (("a", "uid-a"), ("b", "uid-b"))
        }
        return Agent(
            node_name="gpu-node-1",
            probe=Trading(),
            reporter=Reporter(WriterDouble(), clock=clock.monotonic),
            guard=Guard(),
            actions=ActionsDouble(),
            pods=lambda: pods,
        )

    clock = Clock()
    declared, undeclared = run("10Gi"), run(None)
    for _ in range(12):  # a minute of 5 s ticks
        await declared.tick()
        await undeclared.tick()
        clock.advance(5)
    assert undeclared.reporter.writes == 12  # legacy pods: charged what they hold
    assert declared.reporter.writes == 2  # the first report and the 30 s heartbeat
