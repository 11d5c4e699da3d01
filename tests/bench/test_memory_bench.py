"""The memory benchmark holds each component's peak against the limit it is shipped
with. The measurement itself is a benchmark (bench/memory_bench.py)."""

import shutil
from pathlib import Path
from types import ModuleType

import yaml

from tests.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


def load() -> ModuleType:
    return load_bench("memory_bench")


def test_the_limits_are_the_shipped_containers(tmp_path: Path) -> None:
    bench = load()
    assert bench.shipped_limits() == {"extender": 512 * MIB, "webhook": 256 * MIB}

    # A limit changed in the manifests is the limit the figures are held against.
    for path, _ in bench.CONTAINERS.values():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    webhook = tmp_path / bench.CONTAINERS["webhook"][0]
    document = yaml.safe_load(webhook.read_text())
    for container in document["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "webhook":
            container["resources"]["limits"]["memory"] = "384Mi"
    webhook.write_text(yaml.safe_dump(document))
    assert bench.shipped_limits(tmp_path)["webhook"] == 384 * MIB
