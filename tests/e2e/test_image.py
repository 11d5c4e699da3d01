"""The images the manifests run, built here with buildah, run as kubelet runs them.

uid 10001, a read-only root filesystem and no capabilities, as the manifests'
securityContexts ask -- with umoci and runc, no container engine daemon. The
first run builds the images (a few minutes); later runs take the OCI archives
``devcluster.images`` cached by the digest of their inputs.
"""

import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from devcluster import binaries, images
from devcluster.images import Bundle
from devcluster.images.tools import ImageError, require
from tests.e2e.outcomes import progress, skip_or_fail

pytestmark = pytest.mark.e2e

COMPONENTS = ("webhook", "extender", "agent", "certs")


_progress = progress("images")


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    if os.geteuid() != 0:
        skip_or_fail("building and running images needs root (buildah, debootstrap, runc)")
    try:
        require(["buildah", "debootstrap", "umoci", "runc"], _progress)
        return images.ensure(_progress, build_binaries=False)
    except binaries.BinariesMissing as error:
        skip_or_fail(f"kube-scheduler is not built: {error}")
    except ImageError as error:
        skip_or_fail(f"cannot build the images here: {error}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def headroom(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    ref = images.headroom_ref()
    return Bundle.unpack(built[ref], ref, tmp_path_factory.mktemp("headroom-image"))


@pytest.fixture(scope="module")
def scheduler(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    ref = images.scheduler_ref()
    return Bundle.unpack(built[ref], ref, tmp_path_factory.mktemp("scheduler-image"))


def test_archives_name_their_image_for_ctr_import(built: dict[str, Path]) -> None:
    assert set(built) == {images.headroom_ref(), images.scheduler_ref()}
    for ref, archive in built.items():
        with tarfile.open(archive) as tar:
            index = tar.extractfile("index.json")
            assert index is not None
            manifests = json.load(index)["manifests"]
        names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in manifests]
        assert names == [ref]


def test_an_unchanged_tree_is_not_rebuilt(built: dict[str, Path]) -> None:
    # Rebuilds if a source changed since the fixture's build (not in CI; here, an
    # editor may have saved meanwhile); then nothing changes between the two.
    first = images.ensure(_progress, build_binaries=False)
    start = time.monotonic()

    assert images.ensure(_progress, build_binaries=False) == first
    assert time.monotonic() - start < 5


def test_headroom_help_as_uid_10001_on_a_read_only_root(headroom: Bundle) -> None:
    # The Dockerfile's USER, ENTRYPOINT and CMD, as the image config carries them.
    assert headroom.config["process"]["user"] == {"uid": 10001, "gid": 10001}
    assert headroom.config["process"]["args"] == ["headroom", "--help"]

    result = headroom.run("headroom", "--help")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: headroom")
    assert headroom.run("id", "-u").stdout.strip() == "10001"
    denied = headroom.run("touch", "/opt/headroom/written")
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stderr


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_starts_in_the_image(headroom: Bundle, component: str) -> None:
    result = headroom.run("headroom", component, "--help")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: headroom {component}")


def test_the_probes_python_is_3_11_and_writes_no_bytecode(headroom: Bundle) -> None:
    # The scheduler Deployment's extender probes run `python -c ...` in the image.
    result = headroom.run(
        "python", "-c", "import sys, cli.main; print(sys.version_info[:2], sys.dont_write_bytecode)"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3, 11) True"


def test_every_module_loads_from_its_bytecode(headroom: Bundle) -> None:
    """The bytecode compiled at build time is used at run time. A copy between build
    stages that moves a source's mtime makes a timestamp-checked .pyc stale, and with
    no bytecode written (read-only root) every start recompiles from source: the
    official client's core_v1_api alone took ~85 MiB to compile, so the 128Mi
    certificates Job was OOM-killed on the real node. Hash-based .pyc do not care."""
    script = (
        "import importlib.util, pathlib, sys\n"
        "root = pathlib.Path(sys.prefix)\n"
        "bad = []\n"
        "for source in root.rglob('*.py'):\n"
        "    cached = pathlib.Path(importlib.util.cache_from_source(str(source)))\n"
        "    header = cached.read_bytes()[:8] if cached.exists() else b''\n"
        "    if len(header) < 8 or not int.from_bytes(header[4:8], 'little') & 1:\n"
        "        bad.append(str(source))\n"
        "print(len(bad), bad[:5])\n"
    )

    result = headroom.run("python", "-c", script)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("0 "), result.stdout


def test_kube_scheduler_image_is_the_static_binary_alone(scheduler: Bundle) -> None:
    rootfs = scheduler.path / "rootfs"
    files = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if not p.is_dir())
    assert files == ["usr/local/bin/kube-scheduler"]
    assert scheduler.config["process"]["user"] == {"uid": 10001, "gid": 10001}

    result = scheduler.run("kube-scheduler", "--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"Kubernetes {binaries.KUBERNETES_VERSION}"
