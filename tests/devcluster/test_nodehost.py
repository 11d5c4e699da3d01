"""What the real node's teardown deletes on this machine, and what it must leave.

The iptables dump is real: ``iptables-save`` after the portmap plugin (v1.9.1,
iptables backend) mapped a port for our network ``headroom``, for a network
``headroom-x`` and for podman's, plus the rules ``service_dnat`` adds. Where
this machine allows it (root, ``unshare``), the same runs against real
iptables in a network namespace of its own.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devcluster import nodehost

REPO = Path(__file__).resolve().parents[2]
OURS = "c2fc0008e9de8acbf17af"
SAVED = r"""*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -d 127.0.0.0/8 -i headroom0 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -m comment --comment headroom-realnode -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-DN-47eb2203c322a5c6cea4a - [0:0]
:CNI-DN-719411ba57c2772c0dac7 - [0:0]
:CNI-DN-c2fc0008e9de8acbf17af - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -d 10.96.0.1/32 -i headroom0 -p tcp -m tcp --dport 443 -m comment --comment headroom-realnode -j DNAT --to-destination 127.0.0.1:6443
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -m comment --comment headroom-realnode -j DNAT --to-destination 127.0.0.1:6443
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A CNI-DN-47eb2203c322a5c6cea4a -s 10.88.0.0/16 -p tcp -m tcp --dport 31002 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-47eb2203c322a5c6cea4a -s 127.0.0.1/32 -p tcp -m tcp --dport 31002 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-47eb2203c322a5c6cea4a -p tcp -m tcp --dport 31002 -j DNAT --to-destination 10.88.0.9:8080
-A CNI-DN-719411ba57c2772c0dac7 -s 10.89.0.0/16 -p tcp -m tcp --dport 31001 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-719411ba57c2772c0dac7 -s 127.0.0.1/32 -p tcp -m tcp --dport 31001 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-719411ba57c2772c0dac7 -p tcp -m tcp --dport 31001 -j DNAT --to-destination 10.89.0.5:8080
-A CNI-DN-c2fc0008e9de8acbf17af -s 10.88.0.0/16 -p tcp -m tcp --dport 31000 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-c2fc0008e9de8acbf17af -s 127.0.0.1/32 -p tcp -m tcp --dport 31000 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-c2fc0008e9de8acbf17af -p tcp -m tcp --dport 31000 -j DNAT --to-destination 10.88.0.5:8080
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"headroom\" id: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" -m multiport --dports 31000 -j CNI-DN-c2fc0008e9de8acbf17af
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"headroom-x\" id: \"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"" -m multiport --dports 31001 -j CNI-DN-719411ba57c2772c0dac7
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"podman\" id: \"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\"" -m multiport --dports 31002 -j CNI-DN-47eb2203c322a5c6cea4a
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
COMMIT
"""  # noqa: E501
OTHERS = ("47eb2203c322a5c6cea4a", "719411ba57c2772c0dac7")
ALONE = "\n".join(line for line in SAVED.splitlines() if not any(c in line for c in OTHERS))
"""The same machine with our network the only one mapping ports."""


def _deleted(monkeypatch: pytest.MonkeyPatch, saved: str) -> list[tuple[str, ...]]:
    """The iptables commands ``delete_rules("headroom")`` runs on ``saved``."""
    calls: list[tuple[str, ...]] = []

    def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        dump = saved if argv == ("iptables-save",) else ""
        if not argv[0].endswith("-save"):
            calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, dump, "")

    monkeypatch.setattr(nodehost, "run", run)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: f"/usr/sbin/{name}")
    nodehost.delete_rules("headroom")
    return calls


def test_only_our_rules_and_port_mappings_go(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _deleted(monkeypatch, SAVED)

    assert [" ".join(c[1:5]) for c in calls] == [
        "-t filter -D INPUT",
        "-t nat -D PREROUTING",
        "-t nat -D OUTPUT",
        "-t nat -D CNI-HOSTPORT-DNAT",
        f"-t nat -F CNI-DN-{OURS}",
        f"-t nat -X CNI-DN-{OURS}",
    ]
    # the jump carries portmap's comment, quotes and all, as iptables needs it back
    assert 'dnat name: "headroom" id: "' + "a" * 64 + '"' in calls[3]
    assert all("-i" not in c or "headroom0" in c for c in calls[:3])


def test_portmaps_shared_chains_go_once_no_other_network_uses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _deleted(monkeypatch, ALONE)

    deleted = [" ".join(c[1:5]) for c in calls if c[3] == "-D"]
    assert deleted == [
        "-t filter -D INPUT",
        "-t nat -D PREROUTING",
        "-t nat -D OUTPUT",
        "-t nat -D CNI-HOSTPORT-DNAT",
        "-t nat -D PREROUTING",  # the jumps into portmap's chains
        "-t nat -D OUTPUT",
        "-t nat -D POSTROUTING",
    ]
    removed = [c[4] for c in calls if c[3] == "-X"]
    assert removed == [f"CNI-DN-{OURS}", *sorted(nodehost.PORTMAP_CHAINS)]


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: iptables in a network namespace of its own"
    absent = [t for t in ("unshare", "iptables-restore", "ip") if not shutil.which(t, path=PATH)]
    return f"{', '.join(absent)} not installed" if absent else None


PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"


def _in_netns(script: str, stdin: str = "") -> str:
    """``script`` in a fresh network (and mount, for its own /sys) namespace."""
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    result = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c",
         'mount -t sysfs sysfs /sys && exec "$0" -c "$1"', sys.executable, script],
        input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        env={**os.environ, "PATH": PATH},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_real_iptables_keep_everything_not_ours() -> None:
    left = _in_netns(
        "import subprocess, sys\n"
        "from devcluster import nodehost\n"
        "subprocess.run(['iptables-restore'], input=sys.stdin.read(), text=True, check=True)\n"
        "nodehost.delete_rules('headroom')\n"
        "print(nodehost.run('iptables-save').stdout)\n",
        SAVED,
    )

    assert "headroom-realnode" not in left
    assert OURS not in left
    assert all(chain in left for chain in OTHERS)
    assert all(f":{chain} " in left for chain in nodehost.PORTMAP_CHAINS)
    assert "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" in left


def test_real_setup_then_teardown_leaves_no_rule_or_bridge() -> None:
    left = _in_netns(
        "from pathlib import Path\n"
        "from devcluster import nodehost\n"
        "nodehost.create_bridge('headroom0', '10.88.0.1/16')\n"
        "nodehost.service_dnat('headroom0', '10.96.0.1', 443, '127.0.0.1:6443')\n"
        "print(nodehost.run('iptables-save').stdout)\n"
        "print(Path('/proc/sys/net/ipv4/conf/headroom0/route_localnet').read_text())\n"
        "nodehost.delete_bridge('headroom0')\n"
        "nodehost.delete_rules('headroom')\n"
        "print('left:', nodehost.link_exists('headroom0'))\n"
        "print(nodehost.run('iptables-save').stdout)\n"
    )
    during, after = left.split("left:")

    # route_localnet lets pods reach the apiserver's DNAT target on 127.0.0.1, and
    # only that: what else comes to 127/8 from the bridge is dropped (CVE-2020-8558).
    assert (
        "-A INPUT -d 127.0.0.0/8 -i headroom0 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
        " -m comment --comment headroom-realnode -j DROP"
    ) in during
    assert "--to-destination 127.0.0.1:6443" in during
    assert "\n1\n" in during
    assert after.startswith(" False")
    assert "headroom" not in after


def _cgroup(root: Path, *parts: str, pids: str | None = None) -> Path:
    directory = root.joinpath("memory", "kubepods", *parts)
    directory.mkdir(parents=True)
    if pids is not None:
        (directory / "cgroup.procs").write_text(pids)
    return directory


UID = "0b7e3c52-6a1f-4d2e-8f90-1c2d3e4f5a6b"
FOREIGN = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"


def test_pod_processes_are_those_of_the_pods_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodehost, "CGROUP_ROOT", tmp_path)
    _cgroup(tmp_path, "besteffort", f"pod{UID}", "a" * 64, pids="4100\n")
    _cgroup(tmp_path, "burstable", f"pod{UID}", "b" * 64, pids="4230\n4231\n")
    _cgroup(tmp_path, "burstable", f"pod{FOREIGN}", "c" * 64, pids="5000\n")

    assert nodehost.pod_processes([UID]) == {4100, 4230, 4231}
    assert nodehost.pod_processes([]) == set()
    assert nodehost.pod_processes() == {4100, 4230, 4231, 5000}


def test_a_container_cgroup_gone_while_walked_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh-clone CI run: a container exited between listing its pod's cgroup and
    # reading its own, and Path.rglob raised FileNotFoundError out of the teardown check.
    monkeypatch.setattr(nodehost, "CGROUP_ROOT", tmp_path)
    _cgroup(tmp_path, "besteffort", f"pod{UID}", "a" * 64, pids="4100\n")
    leaving = _cgroup(tmp_path, "besteffort", f"pod{UID}", "b" * 64, pids="4200\n")
    scandir = os.scandir

    def exits_first(path: Any) -> Any:
        if isinstance(path, str | Path) and Path(path) == leaving and leaving.exists():
            shutil.rmtree(leaving)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", exits_first)
    assert nodehost.pod_processes([UID]) == {4100}


def test_only_our_pods_cgroups_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Empty directories stand for cgroups with no process left: rmdir would take them.
    monkeypatch.setattr(nodehost, "CGROUP_ROOT", tmp_path)
    _cgroup(tmp_path, "besteffort", f"pod{UID}", "a" * 64)
    _cgroup(tmp_path, "burstable", f"pod{UID}", "b" * 64)
    foreign = _cgroup(tmp_path, "burstable", f"pod{FOREIGN}", "c" * 64)

    nodehost.remove_cgroups([UID])

    kubepods = tmp_path / "memory" / "kubepods"
    assert sorted(str(p.relative_to(kubepods)) for p in kubepods.rglob("*")) == [
        "burstable",
        f"burstable/pod{FOREIGN}",
        f"burstable/pod{FOREIGN}/{'c' * 64}",
    ]
    assert foreign.is_dir()

    nodehost.remove_cgroups([FOREIGN])
    assert not kubepods.exists()
