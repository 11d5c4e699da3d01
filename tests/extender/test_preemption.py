"""The preempt verb's wire shapes, as kube-scheduler 1.34 sends and reads them (issue 7 §4)."""

import json
from pathlib import Path

import pytest

from extender.wire import BadShape, ExtenderPreemptionArgs, ExtenderPreemptionResult, parse

DATA = Path(__file__).resolve().parents[1] / "data" / "extender"


def test_preemption_args_parse_as_kube_scheduler_sends_them_with_node_cache() -> None:
    args = parse(ExtenderPreemptionArgs, (DATA / "preempt-meta-victims.json").read_bytes())
    assert args.NodeNameToVictims is None
    assert args.Pod is not None
    assert args.Pod["spec"]["priority"] == 100000
    meta = args.NodeNameToMetaVictims
    assert meta is not None
    node1, node2 = meta["gpu-node-1"], meta["gpu-node-2"]
    assert node1 is not None
    assert [pod.UID for pod in node1.Pods] == [
        "0b7e9a10-0000-4000-8000-000000000001",
        "0b7e9a10-0000-4000-8000-000000000002",
    ]
    assert node2 is not None
    assert node2.NumPDBViolations == 1


def test_a_victim_without_uid_is_refused_naming_the_field() -> None:
    body = json.dumps({"NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}).encode()
    with pytest.raises(BadShape, match=r"NodeNameToMetaVictims\.n1\.Pods\.0\.UID"):
        parse(ExtenderPreemptionArgs, body)


def test_the_result_serialises_with_go_field_names() -> None:
    result = ExtenderPreemptionResult.model_validate(
        {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 0}}}
    )
    assert json.loads(result.model_dump_json()) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 0}}
    }
