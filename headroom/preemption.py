"""Which lower-priority shared pods must go so a higher-priority pod fits on ONE GPU.

kube-scheduler's DefaultPreemption dry-runs a node as a whole
(pkg/scheduler/framework/preemption/preemption.go, ``SelectVictimsOnNode`` in
framework/plugins/defaultpreemption/default_preemption.go): it cannot see that
GPU memory is per device, so it may pick victims spread over several GPUs that
free no single GPU enough, or none at all. The extender's ``preemptVerb``
(pkg/scheduler/extender.go ``ProcessPreemption``) gets each candidate node and
may replace its victims with pods of that node; this module is the pure choice
it makes, on plain data.

The rule, per GPU the new pod could get: only pods of lower priority may go;
pods whose eviction no PodDisruptionBudget forbids are taken first, then lowest
priority, then largest memory; a reprieve pass (as upstream does) then gives
back every victim not needed, most important first. Among GPUs the best set has
the fewest PDB violations, then the fewest victims, then the lowest highest
priority. Like kube-scheduler, a PDB is respected when some choice allows it
and violated (and counted) only when nothing else frees the room: dropping the
node instead would leave a higher-priority pod Pending forever.
"""

from collections.abc import Iterable
from dataclasses import dataclass

BUDGET_SECONDS = 2.0
"""How long the preempt verb may work out kube-scheduler's candidate nodes: kube-scheduler
waits its ``httpTimeout`` (5 s as shipped) for the answer, then fails the whole preemption."""


@dataclass(frozen=True)
class Resident:
    """A pod charged on one GPU (by the accounting's conservative location rule)."""

    uid: str
    priority: int
    memory: int
    """Bytes it is charged on this GPU."""
    protected: bool = False
    """A PodDisruptionBudget forbids evicting it now."""


@dataclass(frozen=True)
class GPURoom:
    """One shared GPU the preemptor could be placed on."""

    index: str
    free: int
    """Bytes left now (negative when over-committed)."""
    residents: tuple[Resident, ...] = ()


@dataclass(frozen=True)
class Victims:
    """The pods to remove from ``gpu`` so ``need`` bytes fit; empty when it fits already."""

    gpu: str
    pods: tuple[Resident, ...]

    @property
    def pdb_violations(self) -> int:
        return sum(1 for pod in self.pods if pod.protected)

    def rank(self) -> tuple[int, int, int, int]:
        top = max((pod.priority for pod in self.pods), default=-(2**31))
        return (self.pdb_violations, len(self.pods), top, -sum(p.memory for p in self.pods))


def victims_on_gpu(need: int, priority: int, gpu: GPURoom) -> Victims | None:
    """The victims on ``gpu`` for a pod of ``priority`` needing ``need`` bytes, or None."""
    if gpu.free >= need:
        return Victims(gpu.index, ())
    eligible = sorted(
        (pod for pod in gpu.residents if pod.priority < priority),
        key=lambda pod: (pod.protected, pod.priority, -pod.memory, pod.uid),
    )
    chosen: list[Resident] = []
    room = gpu.free
    for pod in eligible:
        if room >= need:
            break
        chosen.append(pod)
        room += pod.memory
    if room < need:
        return None
    # Reprieve: keep (give back) the most important victims that are not needed.
    for pod in sorted(chosen, key=lambda p: (not p.protected, -p.priority, p.memory, p.uid)):
        if room - pod.memory >= need:
            chosen.remove(pod)
            room -= pod.memory
    return Victims(gpu.index, tuple(sorted(chosen, key=lambda p: (p.priority, p.uid))))


def choose_victims(need: int, priority: int, gpus: Iterable[GPURoom]) -> Victims | None:
    """The best victim set over the GPUs the pod could get, or None if no GPU can be freed."""
    options = [v for gpu in gpus if (v := victims_on_gpu(need, priority, gpu)) is not None]
    if not options:
        return None
    return min(options, key=lambda v: (*v.rank(), v.gpu))


def victims_on_node(need: int, priority: int, gpus: Iterable[GPURoom]) -> Victims | None:
    """Victims so that EVERY shared GPU of a node has room, or None.

    The extender's filter admits a shared pod only where its tightest GPU fits it
    (the device plugin, not Headroom, picks the GPU), so preemption must free each
    GPU short of room; a pod charged on several GPUs (not located) frees all of them.
    """
    chosen: dict[str, Resident] = {}
    for gpu in sorted(gpus, key=lambda g: (g.free, g.index)):
        gone = [pod for pod in gpu.residents if pod.uid in chosen]
        rest = tuple(pod for pod in gpu.residents if pod.uid not in chosen)
        room = GPURoom(gpu.index, gpu.free + sum(pod.memory for pod in gone), rest)
        more = victims_on_gpu(need, priority, room)
        if more is None:
            return None
        chosen.update((pod.uid, pod) for pod in more.pods)
    return Victims("*", tuple(sorted(chosen.values(), key=lambda p: (p.priority, p.uid))))
