"""pid -> pod through /proc/<pid>/cgroup, on the path shapes real nodes produce."""

from pathlib import Path

import pytest

from agent.cgroups import ContainerRef, container_of_pid, parse_cgroup

UID = "6b2f4c1e-0d7a-4b8e-9d3c-2a1f0e9b8c7d"
UID_ = UID.replace("-", "_")
CID = "3f9a6c0d2b1e4f5a8c7d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"

# cgroup v1, cgroupfs driver, Docker-era kubelet: one line per controller.
V1_CGROUPFS = f"""12:pids:/kubepods/burstable/pod{UID}/{CID}
11:hugetlb:/kubepods/burstable/pod{UID}/{CID}
10:memory:/kubepods/burstable/pod{UID}/{CID}
9:devices:/kubepods/burstable/pod{UID}/{CID}
4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""
# cgroup v1, systemd driver (EKS AL2 with containerd).
_V1_SYSTEMD_PATH = (
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
    f"cri-containerd-{CID}.scope"
)
V1_SYSTEMD = f"11:memory:{_V1_SYSTEMD_PATH}\n1:name=systemd:{_V1_SYSTEMD_PATH}\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(V1_CGROUPFS, id="v1-cgroupfs"),
        pytest.param(V1_SYSTEMD, id="v1-systemd"),
        pytest.param(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
            id="v2-systemd-containerd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n",
            id="v2-systemd-crio-guaranteed",
        ),
        pytest.param(
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope\n",
            id="v2-systemd-docker",
        ),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/{CID}\n", id="v2-cgroupfs"),
        pytest.param(
            # The agent in its own cgroup namespace sees other pods relative to its root.
            "0::/../../kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
            id="v2-systemd-from-a-cgroup-namespace",
        ),
        pytest.param(
            # kind: the node is itself a container, the kubelet nests under kubelet.slice.
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
            id="v2-systemd-kind",
        ),
    ],
)
def test_pod_and_container_of_every_shape(text: str) -> None:
    assert parse_cgroup(text) == ContainerRef(UID, CID)


def test_uppercase_and_underscores_normalise_to_metadata_uid() -> None:
    text = f"0::/kubepods/pod{UID.upper()}/{CID}\n"
    assert parse_cgroup(text) == ContainerRef(UID, CID)


def test_a_cgroup_nested_below_a_container_names_its_own_pod_not_the_nested_one() -> None:
    # cgroupfs driver; a container with a writable cgroup tree made a child named
    # like a systemd pod slice of another pod, to have its GPU memory credited there.
    other = "aaaaaaaa_bbbb_cccc_dddd_eeeeeeeeeeee"
    text = f"0::/kubepods/burstable/pod{UID}/{CID}/x-pod{other}.slice/crio-{'ab' * 32}.scope\n"
    assert parse_cgroup(text) == ContainerRef(UID, CID)


def test_crio_conmon_is_the_pod_not_a_container() -> None:
    text = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n"
    assert parse_cgroup(text) == ContainerRef(UID, None)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "12:memory:/\n0::/\n",
        "",
        "garbage without colons\n",
        f"0::/kubepods/burstable/pod-not-a-uid/{CID}\n",
    ],
)
def test_processes_outside_pods(text: str) -> None:
    assert parse_cgroup(text) is None


def test_reads_the_proc_root_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V1_CGROUPFS)
    assert container_of_pid(4242, tmp_path) == ContainerRef(UID, CID)
    assert container_of_pid(4343, tmp_path) is None  # exited, or not visible without hostPID
