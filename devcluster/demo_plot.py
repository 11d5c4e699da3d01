"""The demo's PNG: GPU memory over time per pod, before vs after, side by side.

matplotlib is the ``demo`` extra, imported here only; the Agg backend is
selected explicitly so that the demo runs on machines with no display.
"""

from collections import defaultdict
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from devcluster.timeline import PhaseTimeline, PodTrack

if TYPE_CHECKING:
    from matplotlib.axes import Axes

GIB = 2**30
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink")
_GPU_STYLES = ("-", "--", "-.", ":")


def write_plot(phases: list[PhaseTimeline], path: Path, *, title: str) -> Path:
    """Draw one panel per phase into ``path`` (parent folders created); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    workloads = sorted({w for phase in phases for w in phase.workloads()})
    colour = {w: _COLOURS[i % len(_COLOURS)] for i, w in enumerate(workloads)}
    fig, axes = plt.subplots(
        1, len(phases), figsize=(7 * len(phases), 5.6), sharey=True, squeeze=False
    )
    top = 1.0
    for ax, phase in zip(axes[0], phases, strict=True):
        top = max(top, _draw_phase(ax, phase, colour))
    axes[0][0].set_ylabel("GPU memory (GiB)")
    for ax in axes[0]:
        ax.set_ylim(0, top * 1.12)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_phase(ax: "Axes", phase: PhaseTimeline, colour: dict[str, str]) -> float:
    """Draw one phase into ``ax``; returns the highest value drawn, in GiB."""
    keys = sorted(phase.gpus, key=str)
    style = {key: _GPU_STYLES[i % len(_GPU_STYLES)] for i, key in enumerate(keys)}
    several = len(keys) > 1
    # Lines at the same height share one label, or the labels print over each other.
    captions: dict[float, list[str]] = defaultdict(list)
    top = 0.0
    for key in keys:
        gpu = phase.gpus[key]
        total = gpu.total_bytes / GIB
        top = max(top, total)
        ax.axhline(total, color="black", linewidth=1.2, linestyle=style[key])
        captions[total].append(str(key))
        ax.plot(
            [s.t for s in gpu.samples],
            [s.used_bytes / GIB for s in gpu.samples],
            color="grey",
            linewidth=3,
            alpha=0.35,
            linestyle=style[key],
            label=f"{key} used (all pods)" if several else "GPU used (all pods)",
        )
    for total, names in captions.items():
        ax.annotate(
            f"{', '.join(names)}: {total:.0f} GiB total",
            (0, total),
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=8,
        )

    declared: dict[float, list[str]] = defaultdict(list)
    any_starved = False
    for track in sorted(phase.pods.values(), key=lambda t: (t.workload, str(t.gpu))):
        top = max(top, _draw_track(ax, track, colour[track.workload], style[track.gpu], several))
        any_starved = any_starved or track.starved_at is not None
        if track.declared_bytes is not None:
            value = track.declared_bytes / GIB
            ax.axhline(value, color=colour[track.workload], linewidth=0.9, linestyle=(0, (2, 3)))
            if track.workload not in declared[value]:
                declared[value].append(track.workload)
            top = max(top, value)
    for value, names in declared.items():
        ax.annotate(
            f"declared {value:.0f} GiB: {', '.join(names)}",
            (1, value),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            fontsize=7,
            ha="right",
        )

    evictions = [a for a in phase.guard_actions if a.evicted]
    for action in evictions:
        ax.axvline(
            action.t,
            color=colour.get(action.workload, "red"),
            alpha=0.6,
            linewidth=1,
            linestyle=":",
        )
    if evictions:
        ax.plot([], [], color="grey", linestyle=":", label="guard evicted a pod")
    if any_starved:
        ax.scatter([], [], color="red", marker="x", label="OOM-starved (allocation refused)")

    ax.set_title(f"{phase.name.upper()}: {phase.title}", fontsize=10)
    ax.set_xlabel("seconds into the phase")
    ax.set_xlim(0, max(phase.duration, 1.0))
    ax.grid(alpha=0.3)
    if phase.pods:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8)
    else:
        ax.text(0.5, 0.5, "no agent report saw these pods", ha="center", transform=ax.transAxes)
    return top


def _draw_track(ax: "Axes", track: PodTrack, colour: str, style: str, several: bool) -> float:
    """One workload on one GPU: a line per pod (a replacement pod starts a new line)."""
    label: str | None = f"{track.workload} @ {track.gpu}" if several else track.workload
    for _, run in groupby(track.samples, key=lambda s: s.pod):
        samples = list(run)
        ax.plot(
            [s.t for s in samples],
            [s.used_bytes / GIB for s in samples],
            color=colour,
            linestyle=style,
            linewidth=1.8,
            marker=".",
            markersize=3,
            label=label,
        )
        label = None  # one legend entry per workload and GPU
    starved = [s for s in track.samples if s.starved]
    if starved:
        ax.scatter(
            [s.t for s in starved],
            [s.used_bytes / GIB for s in starved],
            color="red",
            marker="x",
            s=28,
            zorder=5,
        )
    return track.peak_bytes / GIB
