"""Building the two images the manifests name, with buildah, into the cache.

- the Headroom image: the repository's Dockerfile, unchanged for users, built
  by ``buildah bud`` with ``BASE`` set to the Debian base built here;
- kube-scheduler: the binary ``tests/e2e/controlplane/build.sh`` built (static,
  CGO_ENABLED=0) in a FROM-scratch image, standing in for the upstream image of
  the same tag (which is the same program on a distroless base).

The tags are read from the manifests (``manifests/base``), so they are what the
cluster asks for.
"""

import hashlib
import json
import os
import subprocess
import time
from functools import cache
from pathlib import Path

import yaml

from devcluster import binaries
from devcluster.images import archives, base
from devcluster.images.tools import ImageError, output, require, stream
from devcluster.process import Progress

CHECKOUT = binaries.CHECKOUT
DOCKERFILE = CHECKOUT / "Dockerfile"
MANIFESTS = CHECKOUT / "manifests" / "base"
# Bump when the way an image is built changes but not its inputs.
RECIPE = "1"
# A TLS-inspecting egress proxy may sit between this machine and PyPI: pip in
# the build stage trusts what the host trusts. Mounted for RUN steps only, so
# the image keeps Debian's own bundle.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the upstream image keeps the binary; the manifests run it by name.
SCHEDULER_PATH = "/usr/local/bin/kube-scheduler"
NON_ROOT = "10001:10001"


@cache
def headroom_ref() -> str:
    """``ghcr.io/headroom-dev/headroom:<newTag>`` from manifests/base/kustomization.yaml."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    for image in kustomization.get("images", []):
        if image["name"] == "ghcr.io/headroom-dev/headroom":
            return f"{image['name']}:{image['newTag']}"
    raise ImageError(f"{MANIFESTS / 'kustomization.yaml'}: no images entry for the Headroom image")


@cache
def scheduler_ref() -> str:
    """The image of the kube-scheduler container in manifests/base/scheduler/deployment.yaml."""
    deployment = yaml.safe_load((MANIFESTS / "scheduler" / "deployment.yaml").read_text())
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "kube-scheduler":
            return str(container["image"])
    raise ImageError(f"{MANIFESTS / 'scheduler'}: no kube-scheduler container")


def headroom(root: Path, progress: Progress) -> Path:
    """The Headroom image's archive, built when the Dockerfile, the lock, pyproject
    or a source file it copies changed since the cached one."""
    ref = headroom_ref()
    files = archives.context_files(CHECKOUT)
    key = archives.digest(
        CHECKOUT,
        [Path("Dockerfile"), Path(".dockerignore"), *files],
        extra=[ref, base.TAG, RECIPE],
    )
    archive = root / f"headroom-{key[:16]}.oci.tar"
    if archive.exists():
        progress(f"{ref}: cached ({archive})")
        return archive
    start = time.monotonic()
    progress(f"{ref}: building {DOCKERFILE.name} ({len(files)} files in the context)")
    require(["buildah", "debootstrap"], progress)
    log = root / "build.log"
    log.write_text("")  # the last build's output only
    base_tag = base.ensure(root, log, progress)
    previous = _image_id(ref)
    volume = (
        ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.exists() else []
    )
    stream(
        ["buildah", "bud", "--isolation", "chroot", "--pull=never",
         "--build-arg", f"BASE={base_tag}", *volume,
         "--tag", ref, "--file", DOCKERFILE, CHECKOUT],
        log=log, progress=progress, what=f"buildah bud {ref}",
        show=lambda line: " STEP " in line or line.startswith(("STEP ", "Successfully tagged")),
    )  # fmt: skip
    archives.push(ref, archive)
    _forget(previous, ref)
    progress(f"{ref}: {archive} in {time.monotonic() - start:.0f}s")
    return archive


def scheduler(root: Path, progress: Progress, *, build: bool) -> Path:
    """The kube-scheduler image's archive, built when the binary changed."""
    ref = scheduler_ref()
    binary = binaries.bin_dir() / "kube-scheduler"
    if not os.access(binary, os.X_OK):
        binary = binaries.ensure(build=build, progress=progress) / "kube-scheduler"
    key = hashlib.sha256(f"{ref} {RECIPE}\0".encode() + binary.read_bytes()).hexdigest()
    archive = root / f"kube-scheduler-{key[:16]}.oci.tar"
    if archive.exists():
        progress(f"{ref}: cached ({archive})")
        return archive
    start = time.monotonic()
    progress(f"{ref}: packaging {binary} FROM scratch")
    require(["buildah"], progress)
    previous = _image_id(ref)
    container = output(["buildah", "from", "scratch"])
    try:
        output(["buildah", "copy", "--chmod", "0755", container, binary, SCHEDULER_PATH])
        output(
            ["buildah", "config", "--entrypoint", json.dumps([SCHEDULER_PATH]),
             "--cmd", "[]", "--env", "PATH=/usr/local/bin", "--user", NON_ROOT,
             "--label", f"org.opencontainers.image.version={ref.rsplit(':', 1)[1]}",
             "--created-by", f"COPY kube-scheduler {SCHEDULER_PATH}", container]
        )  # fmt: skip
        output(["buildah", "commit", "--quiet", "--rm", container, ref])
    except ImageError:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    archives.push(ref, archive)
    _forget(previous, ref)
    progress(f"{ref}: {archive} in {time.monotonic() - start:.0f}s")
    return archive


def _image_id(ref: str) -> str | None:
    result = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def _forget(previous: str | None, ref: str) -> None:
    """Removes the image ``ref`` named before this build from buildah's store (the
    archive is the cache; old builds would only fill /var/lib/containers)."""
    if previous and previous != _image_id(ref):
        subprocess.run(["buildah", "rmi", previous], capture_output=True, check=False)
