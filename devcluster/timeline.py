"""What one demo phase recorded: per-pod GPU memory over time, from agent reports.

The demo samples every GPUNodeReport a few times a second and folds each one
into a :class:`PhaseTimeline`. Everything here is plain data, so the table, the
verdict and the plot are tested from recorded samples without a cluster.

A *workload* is one of the scenario's Deployments (its ``app`` label); a
Deployment replaces an evicted pod, so one workload may own several pods over
a phase, possibly on different GPUs. Tracks are therefore keyed by workload
and GPU, and count the pods they saw.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from headroom.reports import GPUUsage, PodUsage, ReportStatus

FULL_SLACK_FRACTION = 0.01
"""A GPU with less than 1% of its memory free (and at least 256 MiB short)
counts as full: the next CUDA allocation of any real workload would fail."""
FULL_SLACK_MIN_BYTES = 256 * 2**20


@dataclass(frozen=True)
class PodInfo:
    """What the demo knows about one pod from the apiserver (not the agent)."""

    uid: str
    name: str
    workload: str
    node: str = ""
    declared_bytes: int | None = None


@dataclass(frozen=True)
class GPUKey:
    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}/gpu{self.index}"


@dataclass(frozen=True)
class Sample:
    t: float
    used_bytes: int
    starved: bool = False
    pod: str = ""


@dataclass(frozen=True)
class GuardAction:
    """One thing the agent's guard did: an Event on a pod, and whether it evicted it."""

    t: float
    workload: str
    pod: str
    evicted: bool


@dataclass
class PodTrack:
    """One workload's memory on one GPU during one phase."""

    workload: str
    gpu: GPUKey
    declared_bytes: int | None = None
    pods: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max((s.used_bytes for s in self.samples), default=0)

    @property
    def starved_at(self) -> float | None:
        """Seconds into the phase of the first sample that saw this workload starved."""
        return next((s.t for s in self.samples if s.starved), None)

    @property
    def over_declared_at(self) -> float | None:
        if self.declared_bytes is None:
            return None
        return next((s.t for s in self.samples if s.used_bytes > self.declared_bytes), None)


@dataclass
class GPUTrack:
    gpu: GPUKey
    product: str
    total_bytes: int
    samples: list[Sample] = field(default_factory=list)
    backend: str = ""
    """What measured it, from the agent's report: ``nvml``, or ``simulated`` (no GPU)."""

    @property
    def peak_bytes(self) -> int:
        return max((s.used_bytes for s in self.samples), default=0)

    @property
    def full_at(self) -> float | None:
        return next((s.t for s in self.samples if is_full(self.total_bytes, s.used_bytes)), None)


@dataclass
class PhaseTimeline:
    """Everything one phase (``before`` or ``after``) saw, in arrival order."""

    name: str
    title: str
    duration: float = 0.0
    pods: dict[tuple[str, GPUKey], PodTrack] = field(default_factory=dict)
    gpus: dict[GPUKey, GPUTrack] = field(default_factory=dict)
    guard_actions: list[GuardAction] = field(default_factory=list)
    """What the agent's guard did to the demo's pods (from its Events)."""
    unplaced: dict[str, str] = field(default_factory=dict)
    """Per workload that never reached a GPU: why (e.g. the pod stayed Pending)."""

    def observe(self, t: float, report: ReportStatus, pods: dict[str, PodInfo]) -> None:
        """Fold one node report, taken ``t`` seconds into the phase, into the tracks.

        ``pods`` maps pod UID to the demo's pods; every other pod in the report
        is someone else's and is ignored (it still counts in the GPU's total).
        """
        for gpu in report.gpus:
            ours = [(u, pods[u.uid]) for u in gpu.pods if u.uid in pods]
            key = GPUKey(report.node_name, gpu.index)
            if not ours and key not in self.gpus:
                continue
            track = self.gpus.get(key)
            if track is None:
                track = GPUTrack(key, gpu.product, gpu.total_bytes, backend=report.backend)
                self.gpus[key] = track
            track.samples.append(Sample(t, gpu.used_bytes))
            for usage, info in ours:
                self._observe_pod(t, key, gpu, usage, info)
        self.duration = max(self.duration, t)

    def _observe_pod(
        self, t: float, key: GPUKey, gpu: GPUUsage, usage: PodUsage, info: PodInfo
    ) -> None:
        track = self.pods.get((info.workload, key))
        if track is None:
            track = PodTrack(info.workload, key, info.declared_bytes)
            self.pods[(info.workload, key)] = track
        if info.name not in track.pods:
            track.pods.append(info.name)
        starved = pod_starved(gpu, usage)
        track.samples.append(Sample(t, usage.used_bytes, starved=starved, pod=info.name))

    def record_guard(self, action: GuardAction) -> None:
        if action not in self.guard_actions:
            self.guard_actions.append(action)

    @property
    def evictions(self) -> dict[str, int]:
        """Workload -> pods the guard evicted."""
        return _count(a.workload for a in self.guard_actions if a.evicted)

    @property
    def warnings(self) -> dict[str, int]:
        """Workload -> over-declaration warnings the guard recorded without evicting."""
        return _count(a.workload for a in self.guard_actions if not a.evicted)

    def workloads(self) -> list[str]:
        return sorted({w for w, _ in self.pods} | set(self.unplaced))

    def tracks_on(self, gpu: GPUKey) -> list[PodTrack]:
        return sorted((t for t in self.pods.values() if t.gpu == gpu), key=lambda t: t.workload)


def is_full(total_bytes: int, used_bytes: int) -> bool:
    slack = max(FULL_SLACK_MIN_BYTES, int(total_bytes * FULL_SLACK_FRACTION))
    return total_bytes - used_bytes < slack


def pod_starved(gpu: GPUUsage, usage: PodUsage) -> bool:
    """Whether this pod was denied GPU memory it asked for at this sample.

    The simulated backend says so per pod when it refuses an allocation (the
    report's ``starvedBytes``); a real NVML report cannot, so
    there a full GPU counts as starving every pod on it except the one holding
    the most, which is what CUDA OOM does to the others in seed 001.
    """
    if usage.starved_bytes is not None:
        return usage.starved_bytes > 0
    if not is_full(gpu.total_bytes, gpu.used_bytes):
        return False
    biggest = max(gpu.pods, key=lambda p: p.used_bytes)
    return usage.uid != biggest.uid


def _count(names: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts
