"""The preemption benchmark's state does what its figures claim: every candidate node
needs victims beyond kube-scheduler's, and the verb keeps each node it can free.
The timing itself is a benchmark (bench/preemption_bench.py)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "preemption_bench.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("preemption_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["preemption_bench"] = module
    spec.loader.exec_module(module)
    return module


async def test_every_candidate_needs_victims_added_and_is_kept() -> None:
    bench = load()
    result = await bench.main(3, 4)
    assert result["kept"] == 3
    assert result["victims_per_node_median"] > 3  # kube-scheduler named three
    assert result["filters_during"] >= 1
    assert result["filter_p50_ms_idle"] > 0
