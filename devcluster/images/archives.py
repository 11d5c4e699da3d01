"""The image cache: OCI archives under ``$HEADROOM_CACHE/images`` (default
``~/.cache/headroom/images``), each named by a digest of what went into it, so
that an unchanged tree is never rebuilt and a changed one always is.

An archive is what ``ctr images import`` and ``buildah pull oci-archive:`` read;
its index names the image (``org.opencontainers.image.ref.name``).
"""

import contextlib
import fcntl
import fnmatch
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from devcluster.images.tools import ImageError, output


def directory() -> Path:
    cache = Path(os.environ.get("HEADROOM_CACHE") or Path.home() / ".cache" / "headroom")
    return cache / "images"


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One builder at a time (``make image`` and a test may start together)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def context_files(context: Path) -> list[Path]:
    """The files of the build context the Dockerfile can copy, relative to it.

    Reads ``.dockerignore`` in the form this repository writes it: ``*``, then
    ``!path`` for each path sent, then exclusions matched against every path
    component (``**/__pycache__``, ``**/*.pyc``). Anything else is refused
    rather than read wrongly.
    """
    ignore = context / ".dockerignore"
    rules = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rules or rules[0] != "*":
        raise ImageError(f"{ignore}: expected `*` first, then `!path` lines")
    sent = [rule[1:].rstrip("/") for rule in rules[1:] if rule.startswith("!")]
    excluded = [rule.removeprefix("**/") for rule in rules[1:] if not rule.startswith("!")]
    if odd := [pattern for pattern in excluded if "/" in pattern]:
        raise ImageError(f"{ignore}: only `**/name` exclusions are understood, not {odd}")
    files: list[Path] = []
    for path in sent:
        top = context / path
        candidates = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        for candidate in candidates:
            relative = candidate.relative_to(context)
            if not any(
                fnmatch.fnmatchcase(part, pattern)
                for part in relative.parts
                for pattern in excluded
            ):
                files.append(relative)
    return sorted(files)


def digest(context: Path, files: Iterable[Path], extra: Iterable[str] = ()) -> str:
    """sha256 over each file's path, mode and bytes, and the ``extra`` strings."""
    total = hashlib.sha256()
    for item in extra:
        total.update(f"extra {item}\0".encode())
    for relative in files:
        path = context / relative
        total.update(f"file {relative} {path.stat().st_mode & 0o777:o}\0".encode())
        total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


def push(ref: str, archive: Path, keep: int = 2) -> None:
    """Writes the image ``ref`` from buildah's store to ``archive``, named ``ref``
    inside, then removes all but the ``keep`` newest archives of the same kind
    (same name before the digest): the one before may still be being imported."""
    partial = archive.with_name(f".{archive.name}.partial")
    partial.unlink(missing_ok=True)
    output(["buildah", "push", "--quiet", ref, f"oci-archive:{partial}:{ref}"])
    partial.replace(archive)
    kind = archive.name.rsplit("-", 1)[0]
    same = [p for p in archive.parent.glob(f"{kind}-*.oci.tar") if p.name.rsplit("-", 1)[0] == kind]
    for older in sorted(same, key=lambda p: p.stat().st_mtime, reverse=True)[keep:]:
        older.unlink(missing_ok=True)
