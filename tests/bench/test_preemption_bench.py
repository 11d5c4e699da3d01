"""The preemption benchmark's state does what its figures claim: every candidate node
needs victims beyond kube-scheduler's, and the verb keeps each node it can free.
The timing itself is a benchmark (bench/preemption_bench.py)."""

from types import ModuleType

from tests.bench import load_bench


def load() -> ModuleType:
    return load_bench("preemption_bench")


async def test_every_candidate_needs_victims_added_and_is_kept() -> None:
    bench = load()
    result = await bench.main(3, 4)
    assert result["kept"] == 3
    assert result["victims_per_node_median"] > 3  # kube-scheduler named three
    assert result["filters_during"] >= 1
    assert result["filter_p50_ms_idle"] > 0
