"""The real node's container images, built here with buildah: no Docker, no registry.

The API::

    from devcluster import images

    archives = images.ensure(progress)   # {image ref: OCI archive Path}, built when stale
    images.headroom_ref()                # "ghcr.io/headroom-dev/headroom:0.1.0" (manifests/base)
    images.scheduler_ref()               # "registry.k8s.io/kube-scheduler:v1.34.4"

Each archive is named inside by its ref, so ``ctr -n k8s.io images import
<archive>`` loads it under the tag the manifests use. Building needs root
(buildah with chroot isolation, debootstrap for the base); missing Debian
packages are installed with apt-get. ``python -m devcluster.images [--check]``
(``make image``) builds them from the command line. Errors are
:class:`ImageError`.
"""

import sys
import time
from pathlib import Path

from devcluster.images import archives
from devcluster.images.build import headroom, headroom_ref, scheduler, scheduler_ref
from devcluster.images.bundle import Bundle
from devcluster.images.tools import ImageError
from devcluster.process import Progress

__all__ = ["Bundle", "ImageError", "ensure", "headroom_ref", "scheduler_ref"]


def _stderr(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def ensure(progress: Progress = _stderr, *, build_binaries: bool = True) -> dict[str, Path]:
    """The Headroom and kube-scheduler images as OCI archives, built first if the
    inputs changed (cold: a few minutes; cached: well under a second).

    ``build_binaries=False`` raises :class:`devcluster.binaries.BinariesMissing`
    rather than building the control plane when kube-scheduler is not built yet.
    """
    root = archives.directory()
    start = time.monotonic()
    with archives.locked(root):
        built = {
            headroom_ref(): headroom(root, progress),
            scheduler_ref(): scheduler(root, progress, build=build_binaries),
        }
    progress(f"images ready in {time.monotonic() - start:.1f}s")
    return built
