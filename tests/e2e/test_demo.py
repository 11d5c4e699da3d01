"""`headroom demo` is a check, not a show: the seed 001 story must happen on the real cluster."""

from pathlib import Path

import pytest

from devcluster.cluster import Cluster
from devcluster.demo import DemoOptions, run

pytestmark = pytest.mark.e2e


def test_seed001_starves_under_stock_time_slicing_and_not_under_headroom(
    cluster: Cluster, tmp_path: Path
) -> None:
    messages: list[str] = []
    result = run(
        DemoOptions(kubeconfig=cluster.kubeconfig, output=tmp_path / "seed001.png"),
        messages.append,
    )

    assert result.problems == [], "\n".join([*result.problems, result.table])
    # BEFORE: the leak OOM-starved the others (the spiky inference surely; the
    # simulation too when its dynamic 2 GiB falls after the GPU is full).
    assert result.victims, result.table
    assert set(result.victims) <= {"simulation", "inference"}, result.table
    # AFTER: the guard acted on the leaker, and the table says no one starved.
    assert result.guard == "evict"
    assert "OOM-starved: none" in result.table.split("AFTER", 1)[1], result.table
    assert result.plot.stat().st_size > 10_000
    assert any("phase AFTER" in message for message in messages)
