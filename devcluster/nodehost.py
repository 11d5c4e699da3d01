"""What the real node changes on this machine, and how ``down`` undoes all of it.

Setting up: the pod bridge with the node's address on it, and the one-Service
stand-in for kube-proxy (a DNAT of the ``kubernetes`` Service to the apiserver
on 127.0.0.1). Tearing down works from what is on the machine, not from a
record of it, so that it also clears what a crashed ``up`` left: processes in
our pods' cgroups and shims serving our containerd socket are killed,
everything mounted under the node's directories (the pods' network namespaces
too) is unmounted, then the bridge, our iptables rules, our pods' cgroups and
the directories go. What other software on the machine made -- another
kubelet's pods, another CNI network's port mappings -- is left alone.
"""

import contextlib
import hashlib
import ipaddress
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
NETNS_DIR = Path("/run/netns")
SHIM_SOCKETS = Path("/run/containerd/s")
"""containerd 1.6 puts every shim's socket here whatever its state dir."""
CNI_RESULTS = Path("/var/lib/cni/results")
CONTAINER_LOGS = Path("/var/log/containers")
RULE_COMMENT = "headroom-realnode"
"""Marks our iptables rules, so that ``down`` deletes exactly those."""
PORTMAP_DNAT = "CNI-HOSTPORT-DNAT"
PORTMAP_CHAINS = (PORTMAP_DNAT, "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
"""The portmap plugin's (iptables backend) chains that every CNI network on the
machine shares; each container gets a ``CNI-DN-<hash>`` chain of its own."""


class HostError(RuntimeError):
    """A host command failed; the message quotes it and its output."""


def _path() -> str:
    # ip and iptables live in /usr/sbin, which a non-login PATH may lack.
    return f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": _path()}
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60, env=env)
    if check and result.returncode != 0:
        raise HostError(
            f"{' '.join(argv)} failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def create_bridge(name: str, address: str) -> None:
    """The pod bridge, up, with ``address`` (CIDR form) on it: kubelet's node IP must
    exist before the first pod makes the CNI bridge plugin create it."""
    if not link_exists(name):
        run("ip", "link", "add", name, "type", "bridge")
    if address.split("/")[0] not in run("ip", "-o", "addr", "show", "dev", name).stdout:
        run("ip", "addr", "add", address, "dev", name)
    run("ip", "link", "set", name, "up")


def sysctl(key: str, value: str | None = None) -> str:
    """Read (and with ``value``, first write) ``/proc/sys/<key with / for .>``."""
    path = Path("/proc/sys") / key.replace(".", "/")
    if value is not None:
        path.write_text(value)
    return path.read_text().strip()


def service_dnat(bridge: str, service: str, port: int, target: str) -> None:
    """Send ``service:port`` to ``target`` (``127.0.0.1:6443``) from pods on ``bridge`` and
    from this host. Pods reach 127.0.0.1 only with route_localnet on the bridge.

    route_localnet alone would let a pod reach every 127.0.0.1 service of this
    machine (etcd without TLS among them) with packets addressed to 127/8 straight
    (CVE-2020-8558): as kube-proxy does, what arrives on ``bridge`` for 127/8 is
    dropped unless it was DNATed here, so the Service is all a pod reaches."""
    spec = ["-d", f"{service}/32", "-p", "tcp", "--dport", str(port)]
    mark = ["-m", "comment", "--comment", RULE_COMMENT]
    dnat = ["-j", "DNAT", "--to-destination", target]
    run("iptables", "-t", "nat", "-I", "PREROUTING", "-i", bridge, *spec, *mark, *dnat)
    run("iptables", "-t", "nat", "-I", "OUTPUT", *spec, *mark, *dnat)
    run(
        "iptables", "-I", "INPUT", "-i", bridge, "-d", "127.0.0.0/8",
        "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", *mark, "-j", "DROP",
    )  # fmt: skip
    sysctl(f"net.ipv4.conf.{bridge}.route_localnet", "1")


def _pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _kubepods_dirs() -> list[Path]:
    """Every ``kubepods`` cgroup directory, one per hierarchy (v1) or the one (v2)."""
    found = [CGROUP_ROOT / KUBEPODS]
    if CGROUP_ROOT.is_dir():
        found += [entry / KUBEPODS for entry in CGROUP_ROOT.iterdir() if entry.is_dir()]
    return [path for path in found if path.is_dir()]


def _below(top: Path) -> list[Path]:
    """Every cgroup directory under ``top`` (not ``top``). A container's cgroup that
    goes away while this walks (it exits, kubelet restarts it) is skipped, where
    ``Path.rglob`` raises FileNotFoundError (a fresh-clone CI run failed so)."""
    return [Path(root) / name for root, dirs, _ in os.walk(top) for name in dirs]


def _in_pods(path: Path, top: Path, wanted: set[str] | None) -> bool:
    """``path`` is inside one of the ``wanted`` pod cgroups (any pod's, for None)."""
    return wanted is None or not wanted.isdisjoint(path.relative_to(top).parts)


def _pod_cgroups(pod_uids: Iterable[str] | None) -> set[str] | None:
    # The cgroupfs driver names a pod's cgroup pod<uid> (systemd's would differ).
    return None if pod_uids is None else {f"pod{uid}" for uid in pod_uids}


def pod_processes(pod_uids: Iterable[str] | None = None) -> set[int]:
    """Host pids of every process in a kubelet pod cgroup; with ``pod_uids``, only
    in those pods' cgroups, so that another kubelet's pods on this machine are left
    alone."""
    wanted = _pod_cgroups(pod_uids)
    return {
        pid
        for top in _kubepods_dirs()
        for directory in [top, *_below(top)]
        if _in_pods(directory, top, wanted)
        for pid in _pids(directory / "cgroup.procs")
    }


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def shims(socket: Path) -> dict[int, Path]:
    """containerd shims started by the containerd on ``socket``: pid -> the shim's own
    socket (sha256 of address/namespace/id, as containerd 1.6 names it)."""
    found: dict[int, Path] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = _cmdline(int(entry.name))
        if not argv or "containerd-shim" not in Path(argv[0]).name:
            continue
        flags = dict(zip(argv[1::2], argv[2::2], strict=False)) if len(argv) > 2 else {}
        if flags.get("-address") != str(socket):
            continue
        key = os.path.join(str(socket), flags.get("-namespace", ""), flags.get("-id", ""))
        found[int(entry.name)] = SHIM_SOCKETS / hashlib.sha256(key.encode()).hexdigest()
    return found


def node_processes(prefixes: Iterable[Path]) -> set[int]:
    """kubelet, containerd and shim processes whose command line names a path under
    ``prefixes``: the real node's daemons, ours or left by a cluster that died."""
    roots = [str(p) for p in prefixes]
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = _cmdline(int(entry.name))
        if not argv or not Path(argv[0]).name.startswith(("kubelet", "containerd")):
            continue
        if any(root in arg for arg in argv for root in roots) and _running(int(entry.name)):
            found.add(int(entry.name))
    return found


def kill(pids: Iterable[int], *, timeout: float = 10.0) -> None:
    """SIGKILL ``pids`` and wait until they are gone (reaped by whoever owns them)."""
    pids = set(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if _running(pid)}
        if pids:
            time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def pod_netns(subnet: str) -> list[str]:
    """Named network namespaces in ``/run/netns`` holding an address in ``subnet``.
    Ours are never there (containerd keeps them under its state dir); a check
    that none leaked there, not something ``down`` deletes: another tool may
    use the same subnet (podman's default is 10.88.0.0/16 too)."""
    if not NETNS_DIR.is_dir():
        return []
    network = ipaddress.ip_network(subnet)
    names = []
    for entry in sorted(NETNS_DIR.iterdir()):
        listed = run("ip", "-n", entry.name, "-o", "-4", "addr", "show", check=False).stdout
        addresses = re.findall(r"inet (\S+)/", listed)
        if any(ipaddress.ip_address(a) in network for a in addresses):
            names.append(entry.name)
    return names


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(
    prefixes: Iterable[Path], mountinfo: Path = Path("/proc/self/mountinfo")
) -> list[str]:
    """Mount points at or below any of ``prefixes``, deepest first."""
    roots = [str(p).rstrip("/") for p in prefixes]
    found = []
    for line in mountinfo.read_text().splitlines():
        point = _unescape(line.split()[4])
        if any(point == r or point.startswith(r + "/") for r in roots):
            found.append(point)
    return sorted(found, key=lambda p: (p.count("/"), p), reverse=True)


def unmount_all(prefixes: list[Path]) -> list[str]:
    """Unmount everything under ``prefixes`` (shared mounts can stack copies, so repeat);
    what is still mounted after that, lazily. Returns what could not be unmounted."""
    for _ in range(10):
        points = mounts_under(prefixes)
        if not points:
            return []
        for point in points:
            run("umount", point, check=False)
    for point in mounts_under(prefixes):
        run("umount", "-l", point, check=False)
    return mounts_under(prefixes)


def delete_bridge(name: str) -> None:
    """The bridge and every veth still attached to it."""
    if not link_exists(name):
        return
    ports = Path(f"/sys/class/net/{name}/brif")
    for port in sorted(ports.iterdir()) if ports.is_dir() else []:
        run("ip", "link", "delete", port.name, check=False)
    run("ip", "link", "delete", name, check=False)


def _rules(binary: str) -> Iterator[tuple[str, str]]:
    """(table, rule line) of every rule in ``binary``-save's output."""
    dump = run(f"{binary}-save", check=False).stdout
    table = ""
    for line in dump.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(("-A ", ":")):
            yield table, line


def _option(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1] if flag in words[:-1] else ""


def _ours(words: list[str], network: str) -> bool:
    """Our commented rule, or portmap's jump to a container chain of ``network``
    (commented ``dnat name: "<network>" id: "<container>"``)."""
    comment = _option(words, "--comment")
    return comment == RULE_COMMENT or comment.startswith(f'dnat name: "{network}" ')


def delete_rules(network: str) -> None:
    """Our commented rules; the portmap rules of the CNI network ``network`` (the
    jump to each container's ``CNI-DN-`` chain, then that chain); and portmap's
    shared chains, with the jumps to them, once no other network has a port mapped
    in them. Nothing else's rules are touched (another CNI user, kube-proxy)."""
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary, path=_path()) is None:
            continue
        declared: list[tuple[str, str]] = []
        rules: list[tuple[str, list[str]]] = []
        for table, line in _rules(binary):
            words = shlex.split(line)
            if line.startswith(":"):
                declared.append((table, words[0][1:]))
            else:
                rules.append((table, words))
        ours = [(table, words) for table, words in rules if _ours(words, network)]
        left = [(table, words) for table, words in rules if not _ours(words, network)]
        chains = [
            (table, target)
            for table, words in ours
            if (target := _option(words, "-j")).startswith("CNI-DN-")
        ]
        if not any(words[1] == PORTMAP_DNAT for _, words in left):
            # the jumps from the built-in chains (containers' chains are flushed)
            ours += [
                (table, words)
                for table, words in left
                if _option(words, "-j") in PORTMAP_CHAINS
                and not words[1].startswith(("CNI-HOSTPORT-", "CNI-DN-"))
            ]
            chains += [(table, chain) for table, chain in declared if chain in PORTMAP_CHAINS]
        for table, words in ours:
            run(binary, "-t", table, "-D", *words[1:], check=False)
        for table, chain in chains:
            run(binary, "-t", table, "-F", chain, check=False)
        for table, chain in chains:
            run(binary, "-t", table, "-X", chain, check=False)


def remove_cgroups(pod_uids: Iterable[str]) -> None:
    """The cgroups of the pods ``pod_uids``, then kubelet's ``kubepods`` and QoS
    cgroups where nothing else is left in them; deepest first, as rmdir removes
    only an empty cgroup (another kubelet's pods keep theirs)."""
    wanted = _pod_cgroups(pod_uids)
    for top in _kubepods_dirs():
        directories = sorted(_below(top), key=lambda p: len(p.parts), reverse=True)
        pods = [p for p in directories if _in_pods(p, top, wanted)]
        skeleton = [
            p
            for p in directories
            if not any(part.startswith("pod") for part in p.relative_to(top).parts)
        ]
        for directory in [*pods, *skeleton, top]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def remove_cni_results(network: str, netns_root: Path) -> None:
    """libcni's cache of results (containerd 1.6 keeps it in /var/lib/cni) for our
    network, and containerd's loopback results for pods whose netns was under ours."""
    if CNI_RESULTS.is_dir():
        for entry in CNI_RESULTS.iterdir():
            with contextlib.suppress(OSError):
                if entry.name.startswith(f"{network}-") or str(netns_root) in entry.read_text():
                    entry.unlink()
    for directory in (CNI_RESULTS, CNI_RESULTS.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()


def remove_log_links(pod_logs: Path) -> None:
    """kubelet's ``/var/log/containers`` symlinks into our pod log directory."""
    if not CONTAINER_LOGS.is_dir():
        return
    for link in CONTAINER_LOGS.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(pod_logs) + "/"):
                link.unlink()
