"""The demo's judgement: the before/after table and whether the story happened.

The demo is a check, not a show: ``verdict`` lists every way the recorded
phases differ from seed 001's story (stock time-slicing starves someone;
Headroom starves no one and its guard stops the leak), and the command exits
non-zero when that list is not empty.
"""

from dataclasses import dataclass

from devcluster.timeline import GPUKey, PhaseTimeline, PodTrack
from headroom.names import ANNOTATION_SIMULATED_USAGE
from headroom.quantity import human_bytes


@dataclass(frozen=True)
class Expectation:
    """What the scenario says should happen; the verdict checks the phases against it."""

    workloads: tuple[str, ...]
    leaker: str
    guard: str = "evict"
    """The AFTER policy's guard action: ``evict`` or ``warn``."""


def starved(phase: PhaseTimeline) -> dict[str, float]:
    """Workload -> seconds into the phase when it was first OOM-starved."""
    first: dict[str, float] = {}
    for track in phase.pods.values():
        at = track.starved_at
        if at is not None and (track.workload not in first or at < first[track.workload]):
            first[track.workload] = at
    return first


def verdict(before: PhaseTimeline, after: PhaseTimeline, expect: Expectation) -> list[str]:
    """Every way the run missed the story; empty when it happened as told."""
    problems: list[str] = []
    for phase in (before, after):
        placed = {w for w, _ in phase.pods}
        for workload in expect.workloads:
            if workload not in placed:
                why = phase.unplaced.get(workload, "never seen in an agent report")
                problems.append(f"{phase.name}: {workload} never ran on a GPU ({why})")

    victims = sorted(set(starved(before)) - {expect.leaker})
    if not victims:
        problems.append(
            f"before: no pod was OOM-starved; stock time-slicing should have let "
            f"{expect.leaker} starve the others (is the simulated leak fast enough "
            "for --duration?)"
        )

    after_starved = starved(after)
    for workload, at in sorted(after_starved.items()):
        problems.append(f"after: {workload} was OOM-starved at {at:.1f}s despite Headroom")
    for gpu in after.gpus.values():
        if gpu.full_at is not None:
            problems.append(f"after: {gpu.gpu} ran out of memory at {gpu.full_at:.1f}s")

    acted = after.evictions if expect.guard == "evict" else after.warnings
    if expect.guard != "off" and not acted.get(expect.leaker):
        verb = "evicted" if expect.guard == "evict" else "warned about"
        problems.append(
            f"after: the guard never {verb} {expect.leaker}, the pod over its declaration"
        )
    return problems


def outcome(track: PodTrack, phase: PhaseTimeline) -> str:
    """One cell: what happened to this workload on this GPU."""
    parts: list[str] = []
    if track.starved_at is not None:
        parts.append(f"OOM-starved from {track.starved_at:.1f}s")
    over = track.over_declared_at
    evicted = phase.evictions.get(track.workload, 0)
    warned = phase.warnings.get(track.workload, 0)
    if over is not None:
        parts.append(f"over declared from {over:.1f}s")
    if evicted:
        parts.append(f"evicted by guard x{evicted}")
    elif warned:
        parts.append(f"guard warned x{warned}")
    return ", ".join(parts) or "ok"


_HEADER = ("node/GPU", "pod", "pods", "declared", "peak used", "outcome")


def _rows(phase: PhaseTimeline) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for key in sorted(phase.gpus, key=lambda k: (k.node, k.index)):
        for track in phase.tracks_on(key):
            declared = "-" if track.declared_bytes is None else human_bytes(track.declared_bytes)
            rows.append(
                (
                    str(key),
                    track.workload,
                    str(len(track.pods)),
                    declared,
                    human_bytes(track.peak_bytes),
                    outcome(track, phase),
                )
            )
    for workload, why in sorted(phase.unplaced.items()):
        rows.append(("(none)", workload, "0", "-", "-", f"not placed: {why}"))
    return rows


def _gpu_line(phase: PhaseTimeline, key: GPUKey) -> str:
    gpu = phase.gpus[key]
    line = f"  {key} {gpu.product} ({gpu.backend} backend): {human_bytes(gpu.total_bytes)} total, "
    line += f"peak {human_bytes(gpu.peak_bytes)} used"
    if gpu.full_at is not None:
        return line + f", FULL from {gpu.full_at:.1f}s"
    return line + f", {human_bytes(gpu.total_bytes - gpu.peak_bytes)} headroom left at peak"


def stand_ins(phases: list[PhaseTimeline], *, kwok_nodes: set[str]) -> list[str]:
    """What in the recorded phases was not real: the agents' backend, the nodes."""
    gpus = [gpu for phase in phases for gpu in phase.gpus.values()]
    lines: list[str] = []
    if any(gpu.backend == "simulated" for gpu in gpus):
        lines.append(
            "GPU memory: the agents' simulated backend (driven by each pod's "
            f"{ANNOTATION_SIMULATED_USAGE} annotation), not NVML on a GPU"
        )
    fake = sorted({gpu.gpu.node for gpu in gpus} & kwok_nodes)
    if fake:
        lines.append(
            f"nodes {', '.join(fake)}: KWOK nodes (no kubelet; the pods' containers never run)"
        )
    return lines


def render_table(phases: list[PhaseTimeline]) -> str:
    """The before/after table, one block per phase, one row per workload per GPU."""
    all_rows = [_rows(phase) for phase in phases]
    widths = [len(h) for h in _HEADER]
    for row in (r for rows in all_rows for r in rows):
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def fmt(row: tuple[str, ...]) -> str:
        return "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    lines: list[str] = []
    for phase, rows in zip(phases, all_rows, strict=True):
        lines.append(f"{phase.name.upper()}: {phase.title} ({phase.duration:.0f}s observed)")
        lines.append(fmt(_HEADER))
        lines.append(fmt(tuple("-" * w for w in widths)))
        lines.extend(fmt(row) for row in rows)
        lines.extend(_gpu_line(phase, key) for key in sorted(phase.gpus, key=str))
        victims = starved(phase)
        summary = ", ".join(f"{w} at {t:.1f}s" for w, t in sorted(victims.items()))
        lines.append(f"  OOM-starved: {summary or 'none'}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
