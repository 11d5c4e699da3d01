"""Which pod and container a host process belongs to, from ``/proc/<pid>/cgroup``.

The kubelet puts every container in a cgroup whose path names the pod UID and
the container ID. The shapes seen in the wild:

- cgroup v1, cgroupfs driver (one line per controller)::

    11:memory:/kubepods/burstable/pod6b2f4c1e-0d7a-4b8e-9d3c-2a1f0e9b8c7d/3f9a...e1

- cgroup v2, systemd driver (the UID's dashes become underscores)::

    0::/kubepods.slice/kubepods-burstable.slice/
       kubepods-burstable-pod6b2f4c1e_0d7a_4b8e_9d3c_2a1f0e9b8c7d.slice/cri-containerd-3f9a...e1.scope

  with ``docker-`` or ``crio-`` instead of ``cri-containerd-`` for other runtimes;

- cgroup v2, cgroupfs driver: the v1 path on a single ``0::`` line.

The agent usually runs in its own cgroup namespace, where other containers'
paths read ``/../../kubepods-...``; matching is therefore unanchored. The agent
needs ``hostPID: true`` to see the host PIDs that NVML reports.
"""

import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_CONTAINER_ID = r"[0-9a-f]{64}"

# cgroupfs (v1 and v2): .../pod<uid>/<container id>
_CGROUPFS = re.compile(rf"/pod(?P<uid>{_UID})/(?:[a-z-]+-)?(?P<cid>{_CONTAINER_ID})(?:\.scope)?\b")
# systemd: ...-pod<uid>.slice/<runtime>-<container id>.scope; crio-conmon-<id> is
# the monitor process, not the container, so the runtime prefix excludes it.
_SYSTEMD = re.compile(
    rf"-pod(?P<uid>{_UID})\.slice/(?:cri-containerd|crio|docker)-(?P<cid>{_CONTAINER_ID})\.scope"
)
# A pod-level cgroup with no container below it (the sandbox, or a process
# the runtime put straight into the pod's cgroup): the pod is still known.
_POD_ONLY = re.compile(rf"(?:/|-)pod(?P<uid>{_UID})(?:\.slice)?(?:/|$)")


@dataclass(frozen=True)
class ContainerRef:
    pod_uid: str
    """With dashes, as in ``metadata.uid``."""
    container_id: str | None
    """The runtime's 64-hex ID, as at the end of ``status.containerStatuses[].containerID``."""


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod (and container, when present) named by the text of a ``cgroup`` file."""
    pod_only: ContainerRef | None = None
    for line in text.splitlines():
        # hierarchy-ID:controllers:path; the path may itself contain colons.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        # The outermost pod cgroup is the one kubelet made: a container that may
        # write its cgroup tree could nest one named after another pod below it.
        found = [m for m in (_SYSTEMD.search(path), _CGROUPFS.search(path)) if m]
        if found:
            match = min(found, key=lambda m: m.start())
            return ContainerRef(_normal_uid(match["uid"]), match["cid"])
        if pod_only is None and (only := _POD_ONLY.search(path)):
            pod_only = ContainerRef(_normal_uid(only["uid"]), None)
    return pod_only


def container_of_pid(pid: int, proc_root: Path = Path("/proc")) -> ContainerRef | None:
    """Read ``<proc_root>/<pid>/cgroup``; None when the process is gone or not in a pod."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None  # exited between the NVML query and now, or not visible (no hostPID)
    return parse_cgroup(text)


def _normal_uid(uid: str) -> str:
    return uid.replace("_", "-").lower()
