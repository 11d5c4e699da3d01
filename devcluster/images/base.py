"""The base image: Debian bookworm's Python 3.11, built here with debootstrap.

``python:3.11-slim`` cannot be pulled (no registry is reachable), so ``make
image`` passes this one as the Dockerfile's ``BASE``: Debian's own packages of
the same Python minor version, ``python`` on PATH (python-is-python3) and venv
with ensurepip (python3-venv), trimmed the way the slim images are (no apt
lists, docs, man pages or locales). It is built once per :data:`VERSION` and
kept, tagged :data:`TAG`, in buildah's local store.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from devcluster.images.tools import ImageError, output, stream
from devcluster.process import Progress

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
VERSION = "bookworm-py3.11-1"  # bump when SUITE, PACKAGES or the trimming change
TAG = f"localhost/headroom-base:{VERSION}"
MIRROR = os.environ.get("HEADROOM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Emptied after debootstrap: what the slim images leave out, plus what a
# container runtime provides (/dev) or is the build host's (logs).
TRIM = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "dev",
)
# debootstrap's lines that start a phase (not one per package)
_PHASES = ("packages...", "the base system...", "installed successfully.")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def present(tag: str) -> bool:
    return (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", tag], capture_output=True, check=False
        ).returncode
        == 0
    )


def ensure(work: Path, log: Path, progress: Progress) -> str:
    """:data:`TAG`, built first (about a minute and a half) when the store lacks it."""
    if present(TAG):
        progress(f"{TAG}: present")
        return TAG
    progress(f"{TAG}: debootstrap {SUITE} ({', '.join(PACKAGES)}) from {MIRROR}")
    scratch = Path(tempfile.mkdtemp(dir=work, prefix="base-"))
    rootfs = scratch / "rootfs"
    try:
        try:
            stream(
                # Fail rather than warn when the Release file's signature cannot be
                # checked (a mirror over plain http, HEADROOM_DEBIAN_MIRROR elsewhere).
                ["debootstrap", "--variant=minbase", "--force-check-gpg",
                 f"--include={','.join(PACKAGES)}", SUITE, rootfs, MIRROR],
                log=log, progress=progress, what="debootstrap",
                show=lambda line: line.startswith("I: ") and line.rstrip().endswith(_PHASES),
            )  # fmt: skip
        finally:
            # debootstrap mounts /proc (and may bind /dev) inside the target; a
            # failed run can leave them, and removing files through them would
            # reach the host's.
            _unmount_below(rootfs)
        _trim(rootfs)
        _commit(rootfs)
    finally:
        if not _mounts(f"{scratch}/"):
            shutil.rmtree(scratch)
    progress(f"{TAG}: built")
    return TAG


def _unmount_below(root: Path) -> None:
    prefix = f"{root}/"
    for mountpoint in sorted(_mounts(prefix), reverse=True):
        subprocess.run(["umount", "--lazy", mountpoint], capture_output=True, check=False)
    if left := _mounts(prefix):
        raise ImageError(f"mounts left below {root} (not removing it): {', '.join(left)}")


def _mounts(prefix: str) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    # /proc/self/mounts escapes spaces and the like as octal; our paths have none.
    return [point for point in points if point.startswith(prefix)]


def _trim(rootfs: Path) -> None:
    for relative in TRIM:
        directory = rootfs / relative
        for entry in directory.iterdir() if directory.is_dir() else ():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    # The build host's names and resolver: the runtime bind-mounts its own.
    (rootfs / "etc" / "hostname").unlink(missing_ok=True)
    (rootfs / "etc" / "resolv.conf").write_text("")


def _commit(rootfs: Path) -> None:
    container = output(["buildah", "from", "scratch"])
    try:
        mountpoint = output(["buildah", "mount", container])
        try:
            output(["cp", "-a", f"{rootfs}/.", mountpoint])
        finally:
            output(["buildah", "umount", container])
        output(
            ["buildah", "config", "--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8",
             "--cmd", '["python3"]', "--label", f"dev.headroom.base={VERSION}", container]
        )  # fmt: skip
        output(["buildah", "commit", "--quiet", "--rm", container, TAG])
    except ImageError:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
