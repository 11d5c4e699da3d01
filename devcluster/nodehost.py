"""What the real node changes on this machine, and how ``down`` undoes all of it.

Setting up: the pod bridge with the node's address on it, and the one-Service
stand-in for kube-proxy (a DNAT of the ``kubernetes`` Service to the apiserver
on 127.0.0.1). Tearing down works from what is on the machine, not from a
record of it, so that it also clears what a crashed ``up`` left: processes in
kubelet's ``kubepods`` cgroups and shims serving our containerd socket are
killed, network namespaces holding a pod address are deleted, everything
mounted under the node's directories is unmounted, then the bridge, our
iptables rules, the cgroups and the directories go.
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
# Chains the portmap plugin (iptables backend) and kubelet may create.
FOREIGN_CHAINS = re.compile(
    r"^(CNI-HOSTPORT-\w+|CNI-DN-\w+|KUBE-KUBELET-CANARY|KUBE-IPTABLES-HINT)$"
)


class HostError(RuntimeError):
    """A host command failed; the message quotes it and its output."""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # ip and iptables live in /usr/sbin, which a non-login PATH may lack.
    env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"}
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
    from this host. Pods reach 127.0.0.1 only with route_localnet on the bridge."""
    spec = ["-d", f"{service}/32", "-p", "tcp", "--dport", str(port)]
    mark = ["-m", "comment", "--comment", RULE_COMMENT]
    dnat = ["-j", "DNAT", "--to-destination", target]
    run("iptables", "-t", "nat", "-I", "PREROUTING", "-i", bridge, *spec, *mark, *dnat)
    run("iptables", "-t", "nat", "-I", "OUTPUT", *spec, *mark, *dnat)
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


def pod_processes() -> set[int]:
    """Host pids of every process in a kubelet pod cgroup."""
    return {
        pid
        for top in _kubepods_dirs()
        for procs in top.rglob("cgroup.procs")
        for pid in _pids(procs)
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
    """Named network namespaces (containerd's ``cni-<uuid>``) holding an address in
    ``subnet``: those the CNI bridge plugin gave a pod of ours."""
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


def delete_netns(names: Iterable[str]) -> None:
    for name in names:
        run("ip", "netns", "delete", name, check=False)


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


def delete_rules() -> None:
    """Our commented rules, then the CNI portmap and kubelet chains and the jumps to them."""
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary) is None:
            continue
        chains: list[tuple[str, str]] = []
        for table, line in _rules(binary):
            words = shlex.split(line)
            if line.startswith(":"):
                if FOREIGN_CHAINS.match(words[0][1:]):
                    chains.append((table, words[0][1:]))
                continue
            target = words[words.index("-j") + 1] if "-j" in words else ""
            chain = words[1]
            if RULE_COMMENT in line or (
                FOREIGN_CHAINS.match(target) and not FOREIGN_CHAINS.match(chain)
            ):
                run(binary, "-t", table, "-D", *words[1:], check=False)
        for table, chain in chains:
            run(binary, "-t", table, "-F", chain, check=False)
        for table, chain in chains:
            run(binary, "-t", table, "-X", chain, check=False)


def remove_cgroups() -> None:
    """kubelet's ``kubepods`` trees, deepest first (rmdir works only on empty cgroups)."""
    for top in _kubepods_dirs():
        directories = sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        )
        for directory in [*directories, top]:
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
