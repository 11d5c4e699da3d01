"""Where the control-plane binaries live, and building them when run from a checkout.

``tests/e2e/controlplane/build.sh`` builds them from the Go modules pinned next
to it into ``$HEADROOM_CACHE/k8s-<version>-kwok-<version>/bin`` (default cache
``~/.cache/headroom``). The versions here must match those go.mod files; a unit
test checks that they do.
"""

import hashlib
import os
import subprocess
from pathlib import Path

from devcluster.process import Progress

KUBERNETES_VERSION = "v1.34.4"
KWOK_VERSION = "v0.8.0"
TOOLS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
CHECKOUT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = CHECKOUT / "tests" / "e2e" / "controlplane" / "build.sh"


RULECHECK_SOURCES = BUILD_SCRIPT.parent / "prometheus"


def rulecheck_tool(sources: Path = RULECHECK_SOURCES) -> Path:
    """Where build.sh puts rulecheck built from ``sources``: named by a digest of their
    go.mod, go.sum and Go files (lib.sh's sources_digest), so that one built from other
    sources is never run for them."""
    files = sorted(
        "./" + path.relative_to(sources).as_posix()
        for path in sources.rglob("*")
        if path.is_file() and (path.name in ("go.mod", "go.sum") or path.suffix == ".go")
    )
    listing = "".join(
        f"{hashlib.sha256((sources / name).read_bytes()).hexdigest()}  {name}\n" for name in files
    )
    return bin_dir() / f"rulecheck-{hashlib.sha256(listing.encode()).hexdigest()[:12]}"


class BinariesMissing(RuntimeError):
    """The control plane is not built; the message says how to build it."""


def bin_dir() -> Path:
    cache = Path(os.environ.get("HEADROOM_CACHE") or Path.home() / ".cache" / "headroom")
    return cache / f"k8s-{KUBERNETES_VERSION}-kwok-{KWOK_VERSION}" / "bin"


def missing(directory: Path | None = None) -> list[str]:
    directory = directory or bin_dir()
    return [tool for tool in TOOLS if not os.access(directory / tool, os.X_OK)]


def ensure(*, build: bool, progress: Progress) -> Path:
    """The bin directory with every tool in it, building them first if allowed.

    The first build compiles Kubernetes from source: several minutes per binary.
    """
    directory = bin_dir()
    absent = missing(directory)
    if not absent:
        return directory
    if not BUILD_SCRIPT.exists():
        raise BinariesMissing(
            f"{', '.join(absent)} not found in {directory}. Build them from a Headroom "
            "checkout with tests/e2e/controlplane/build.sh (needs Go)."
        )
    if not build:
        raise BinariesMissing(
            f"{', '.join(absent)} not found in {directory}; run {BUILD_SCRIPT} "
            "(needs Go; the first build takes a while) or `make controlplane`."
        )
    progress(f"building the control plane ({', '.join(absent)}); the first build is slow")
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise BinariesMissing(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    built = Path(result.stdout.strip().splitlines()[-1])
    if built != directory or missing(directory):
        raise BinariesMissing(f"{BUILD_SCRIPT} built into {built}; expected {directory}")
    return directory
