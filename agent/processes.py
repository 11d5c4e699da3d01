"""The host processes of every pod's containers, from ``/proc/*/cgroup``.

The simulated backend in host-process mode (``--sim-processes host``, on the
local cluster's real node) stands in for NVML and, like NVML, reports GPU
memory by host pid: the pid of each charged container's main process, found
here. The agent then maps that pid back to its pod through the same
``/proc/<pid>/cgroup`` (:mod:`agent.attribution`), so that path is exercised on a
real container runtime's cgroups even without a GPU.

A container's main process is the one in its cgroup that started first: the
container's init. Not simply the lowest pid: pids wrap around at
``kernel.pid_max``, 32768 on many machines, so a worker forked later can get a
lower pid than its parent. The pod's sandbox (``pause``) has
a cgroup of its own under the pod's, named by the sandbox ID, which no
``containerStatuses`` entry names, so it is never taken for a container.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.cgroups import ContainerRef, container_of_pid

Pod = Mapping[str, Any]


def main_processes(proc_root: Path = Path("/proc")) -> dict[ContainerRef, int]:
    """(pod UID, container ID) -> the pid in that container's cgroup that started
    first (the lower pid when two started in the same clock tick).

    Reads every ``<proc_root>/<pid>/cgroup`` once, and the ``stat`` of those in a
    container; a process gone meanwhile is skipped. Processes outside a container
    (a pod-level cgroup) are left out.
    """
    first: dict[ContainerRef, tuple[float, int]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdecimal():
            continue
        pid = int(entry)
        ref = container_of_pid(pid, proc_root)
        if ref is None or ref.container_id is None:
            continue
        key = (_start_time(pid, proc_root), pid)
        if ref not in first or key < first[ref]:
            first[ref] = key
    return {ref: pid for ref, (_, pid) in first.items()}


def _start_time(pid: int, proc_root: Path) -> float:
    """When ``pid`` started, in clock ticks since boot (``stat`` field 22); infinity
    when unreadable (gone meanwhile), so that any process still there comes first."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
        # after "(comm)", whose name may hold spaces and parentheses: field 3 on
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return float("inf")


def container_ids(pod: Pod, name: str | None = None) -> list[str]:
    """The runtime IDs of the pod's containers (``name`` only, when given), in
    ``status.containerStatuses`` order: what the runtime runs for them now."""
    status = pod.get("status") or {}
    ids = []
    for entry in status.get("containerStatuses") or []:
        if name is not None and entry.get("name") != name:
            continue
        # "containerd://<id>", "cri-o://<id>", "docker://<id>"
        _, sep, container_id = str(entry.get("containerID") or "").partition("://")
        if sep and container_id:
            ids.append(container_id)
    return ids


def pod_process(
    pod: Pod, table: Mapping[ContainerRef, int], container: str | None = None
) -> int | None:
    """The host pid holding the pod's GPU memory: the main process of
    ``container`` (the one that asked for the GPU) or, without a name, of its
    first container that has one. None while none runs: the sandbox alone, a
    container not started yet or exited, or a status not yet naming it."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    for container_id in container_ids(pod, container):
        pid = table.get(ContainerRef(uid, container_id))
        if pid is not None:
            return pid
    return None
