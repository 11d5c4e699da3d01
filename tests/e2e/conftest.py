"""One real local cluster for the whole e2e session (devcluster), torn down at the end.

The cluster runs in a temporary state dir, so a cluster the developer started
with ``headroom cluster up`` is left alone. Without the control-plane binaries
the suite is skipped, except under ``CI=true``, where it fails: CI must never
pass by not testing.
"""

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devcluster import binaries
from devcluster.cluster import Cluster, down, up
from devcluster.kubectl import wait_until
from tests.e2e.outcomes import progress, skip_or_fail

_names = itertools.count(1)


_progress = progress("e2e cluster")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    absent = binaries.missing()
    if absent:
        message = (
            f"control-plane binaries missing from {binaries.bin_dir()}: {', '.join(absent)}; "
            f"build them with {binaries.BUILD_SCRIPT} (or `make controlplane`)"
        )
        skip_or_fail(message)
    state_dir: Path = tmp_path_factory.mktemp("cluster")
    started = up(state_dir=state_dir, build=False, progress=_progress)
    try:
        yield started
    finally:
        down(state_dir, progress=_progress)


NamespaceFactory = Callable[..., str]


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[NamespaceFactory]:
    """``namespace(policy="gpu-shared")`` -> a fresh namespace, deleted (and its pods
    gone, so their GPU memory is free again) when the test ends."""
    created: list[str] = []

    def make(policy: str | None = None) -> str:
        name = f"e2e-{next(_names)}-{os.getpid()}"
        cluster.kubectl("create", "namespace", name)
        if policy:
            cluster.kubectl("label", "namespace", name, f"headroom.dev/policy={policy}")
        created.append(name)
        # Pods are refused until the namespace's "default" ServiceAccount exists.
        wait_until(
            f"ServiceAccount default in {name}",
            lambda: (
                cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0
            ),
            timeout=30,
        )
        return name

    yield make
    for name in created:
        # Wait only for the pods to go (their GPU memory is what later tests need);
        # the namespace controller finishes the rest in the background.
        cluster.kubectl(
            "delete", "deployments,jobs", "--all", "-n", name,
            "--cascade=foreground", "--wait=true", "--timeout=60s",
        )  # fmt: skip
        cluster.kubectl("delete", "pods", "--all", "-n", name, "--wait=true", "--timeout=60s")
        cluster.kubectl("delete", "namespace", name, "--wait=false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is an e2e test (``make unit`` deselects them), whether
    or not its module says so."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
