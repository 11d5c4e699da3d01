"""The host processes of each pod's containers, read from a fake /proc tree."""

from pathlib import Path
from typing import Any

from agent.cgroups import ContainerRef
from agent.processes import container_ids, main_processes, pod_process
from tests.agent.doubles import pod

UID_A = "0b7e3c52-6a1f-4d2e-8f90-1c2d3e4f5a6b"
UID_B = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
SANDBOX_A = "a" * 64
MAIN_A = "1" * 64
SIDECAR_A = "2" * 64
MAIN_B = "3" * 64
CONTROLLERS = ("pids", "memory", "devices", "cpu,cpuacct", "name=systemd")


def v1_cgroupfs(path: str) -> str:
    """Hybrid cgroup v1 as on a containerd node with the cgroupfs driver: one
    line per controller, the named systemd hierarchy, and an empty unified one."""
    lines = [f"{n}:{c}:{path}" for n, c in enumerate(reversed(CONTROLLERS), start=1)]
    return "\n".join([*reversed(lines), "0::/", ""])


def v2_systemd(uid: str, container_id: str, qos: str = "burstable") -> str:
    slice_uid = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


def write_proc(root: Path, processes: dict[int, str]) -> Path:
    for pid, cgroup in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(cgroup)
    # what else /proc holds: not processes
    (root / "self").mkdir()
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return root


def test_the_lowest_pid_of_each_container_is_its_main_process(tmp_path: Path) -> None:
    proc = write_proc(
        tmp_path,
        {
            1: v1_cgroupfs("/init.scope"),
            812: v1_cgroupfs("/system.slice/containerd.service"),
            4100: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{SANDBOX_A}"),  # pause
            4230: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{MAIN_A}"),
            4231: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{MAIN_A}"),  # a worker
            4390: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_A}/{SIDECAR_A}"),
            10007: v2_systemd(UID_B, MAIN_B),
            9950: v2_systemd(UID_B, MAIN_B),
            5000: v1_cgroupfs(f"/kubepods/besteffort/pod{UID_B}"),  # pod-level, no container
        },
    )

    assert main_processes(proc) == {
        ContainerRef(UID_A, SANDBOX_A): 4100,
        ContainerRef(UID_A, MAIN_A): 4230,
        ContainerRef(UID_A, SIDECAR_A): 4390,
        ContainerRef(UID_B, MAIN_B): 9950,
    }


def test_a_missing_proc_root_has_no_processes(tmp_path: Path) -> None:
    assert main_processes(tmp_path / "absent") == {}


def two_container_pod() -> dict[str, Any]:
    running = pod("a", UID_A, container_id=MAIN_A)
    running["spec"]["containers"].append({"name": "sidecar", "image": "envoy"})
    running["status"]["containerStatuses"].append(
        {"name": "sidecar", "containerID": f"containerd://{SIDECAR_A}"}
    )
    return running


def test_the_containers_status_names_them_and_never_the_sandbox() -> None:
    running = two_container_pod()

    assert container_ids(running) == [MAIN_A, SIDECAR_A]
    assert container_ids(running, "sidecar") == [SIDECAR_A]
    assert container_ids(pod("new", UID_B)) == []  # no status yet


def test_the_gpu_container_holds_the_memory() -> None:
    table = {
        ContainerRef(UID_A, SANDBOX_A): 4100,
        ContainerRef(UID_A, MAIN_A): 4230,
        ContainerRef(UID_A, SIDECAR_A): 4390,
    }
    running = two_container_pod()

    assert pod_process(running, table, "main") == 4230
    assert pod_process(running, table, "sidecar") == 4390
    assert pod_process(running, table) == 4230  # no GPU container: the first running one
    del table[ContainerRef(UID_A, MAIN_A)]  # exited; kubelet has not restarted it yet
    assert pod_process(running, table, "main") is None
    assert pod_process(running, table) == 4390


def test_a_pod_with_only_its_sandbox_has_no_process() -> None:
    table = {ContainerRef(UID_A, SANDBOX_A): 4100}

    assert pod_process(pod("a", UID_A, container_id=MAIN_A), table, "main") is None
    assert pod_process(pod("a", UID_A), table) is None  # containers not created yet
