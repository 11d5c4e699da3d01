"""What the image cache keys on, and the tags it builds, without building anything."""

import re
from pathlib import Path

import pytest

from devcluster import binaries, images
from devcluster.images import archives
from devcluster.images.tools import ImageError

CHECKOUT = binaries.CHECKOUT
IGNORE = "*\n!pyproject.toml\n!pkg/\n**/__pycache__\n**/*.pyc\n"


def _context(tmp_path: Path, ignore: str = IGNORE) -> Path:
    (tmp_path / ".dockerignore").write_text(ignore)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not sent\n")
    return tmp_path


def _digest(context: Path) -> str:
    return archives.digest(context, archives.context_files(context))


def test_the_context_is_what_dockerignore_sends(tmp_path: Path) -> None:
    context = _context(tmp_path)
    (context / "pkg" / "__pycache__").mkdir()
    (context / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")

    assert archives.context_files(context) == [Path("pkg/sub/mod.py"), Path("pyproject.toml")]


def test_a_changed_source_changes_the_key_bytecode_does_not(tmp_path: Path) -> None:
    context = _context(tmp_path)
    before = _digest(context)
    (context / "pkg" / "stale.pyc").write_bytes(b"\0")
    (context / "notes.txt").write_text("edited, but not sent\n")
    assert _digest(context) == before

    (context / "pkg" / "sub" / "mod.py").write_text("x = 2\n")
    assert _digest(context) != before


def test_a_dockerignore_it_cannot_read_exactly_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="only `\\*\\*/name` exclusions"):
        archives.context_files(_context(tmp_path, IGNORE + "pkg/sub/*.py\n"))


def test_the_repository_context_holds_every_path_the_dockerfile_copies() -> None:
    sent = {str(path) for path in archives.context_files(CHECKOUT)}
    copied = [
        source
        for line in (CHECKOUT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert copied
    for source in copied:
        assert any(name == source or name.startswith(f"{source}/") for name in sent), source


def test_the_tags_built_are_the_ones_the_manifests_run() -> None:
    used = set()
    for manifest in (CHECKOUT / "manifests" / "base").rglob("*.yaml"):
        used |= set(re.findall(r"image: (\S+)", manifest.read_text()))
    assert used == {images.headroom_ref(), images.scheduler_ref()}
    # The packaged binary is the pinned release, so the tag must say that release.
    assert images.scheduler_ref().endswith(f":{binaries.KUBERNETES_VERSION}")
    pyproject = (CHECKOUT / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', pyproject, re.M)
    assert version
    assert images.headroom_ref().endswith(f":{version.group(1)}")
