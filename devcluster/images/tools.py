"""Running the image tools (buildah, debootstrap, umoci, runc), and installing them.

They are Debian packages; a machine without them gets them from apt-get, so
that ``make image`` works on a fresh machine of this kind.
"""

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from devcluster.process import Progress

# command -> the Debian package that provides it
PACKAGES = {"buildah": "buildah", "debootstrap": "debootstrap", "umoci": "umoci", "runc": "runc"}
Filter = Callable[[str], bool]


class ImageError(RuntimeError):
    """An image could not be built or run; the message names the step and quotes its output."""


def require(commands: Iterable[str], progress: Progress) -> None:
    """Installs the packages of the missing ``commands`` with apt-get (root only)."""
    missing = [command for command in commands if shutil.which(command) is None]
    if not missing:
        return
    packages = sorted({PACKAGES[command] for command in missing})
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(
            f"{', '.join(missing)} not found: install the Debian packages {' '.join(packages)} "
            "(building images needs root)"
        )
    progress(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    for argv in (["apt-get", "update", "-q"], install):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ImageError(f"{' '.join(argv)} failed:\n{_tail(result.stdout + result.stderr)}")


def output(argv: Sequence[str | Path]) -> str:
    """The stripped stdout of a short command; an :class:`ImageError` if it fails."""
    result = subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"{_show(argv)} failed:\n{_tail(result.stderr or result.stdout)}")
    return result.stdout.strip()


def stream(
    argv: Sequence[str | Path], *, log: Path, progress: Progress, show: Filter, what: str
) -> None:
    """Runs a long command with its output appended to ``log``; the lines ``show``
    picks go to ``progress``, and the time it took at the end."""
    start = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {_show(argv)}\n")
        out.flush()
        with subprocess.Popen(
            [str(arg) for arg in argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as child:
            assert child.stdout is not None
            lines: list[str] = []
            for line in child.stdout:
                out.write(line)
                lines = [*lines[-29:], line]
                if show(line):
                    progress(f"  {line.rstrip()}")
        if child.returncode != 0:
            tail = "".join(lines)
            raise ImageError(f"{what} failed (exit {child.returncode}; log {log}):\n{tail}")
    progress(f"{what}: {time.monotonic() - start:.0f}s")


def _show(argv: Sequence[str | Path]) -> str:
    return " ".join(str(arg) for arg in argv)


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
