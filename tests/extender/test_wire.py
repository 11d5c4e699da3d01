"""The extender wire models keep the Go field names and unknown pod fields."""

import json
from pathlib import Path

import pytest

from extender.wire import (
    BadShape,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
    HostPriorityList,
    NotJSON,
    host_priority_item,
    json_array,
    parse,
)

DATA = Path(__file__).parent.parent / "data" / "extender"


def test_args_keep_the_pod_as_sent() -> None:
    raw = (DATA / "filter-node-names.json").read_bytes()
    args = parse(ExtenderArgs, raw)
    assert args.Pod == json.loads(raw)["Pod"]  # managedFields, ownerReferences... all kept
    assert args.Nodes is None
    assert args.NodeNames == ["gpu-a", "gpu-b", "gpu-c"]


def test_node_list_mode() -> None:
    args = parse(ExtenderArgs, (DATA / "filter-node-list.json").read_bytes())
    assert args.NodeNames is None
    assert args.Nodes is not None
    assert len(args.Nodes.items) == 3


def test_results_serialise_with_go_field_names() -> None:
    result = ExtenderFilterResult(NodeNames=["a"], FailedNodes={"b": "why"})
    assert json.loads(result.model_dump_json()) == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "why"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    scores = HostPriorityList.dump_json([HostPriority(Host="a", Score=7)])
    assert json.loads(scores) == [{"Host": "a", "Score": 7}]


def test_binding_args() -> None:
    args = parse(ExtenderBindingArgs, (DATA / "bind.json").read_bytes())
    assert (args.PodNamespace, args.Node) == ("seed001", "gpu-b")


def test_errors_name_the_field() -> None:
    with pytest.raises(NotJSON):
        parse(ExtenderArgs, b"\xff")
    with pytest.raises(BadShape, match=r"NodeNames\.1: Input should be a valid string"):
        parse(ExtenderArgs, b'{"NodeNames": ["a", null]}')
    with pytest.raises(BadShape, match="and 2 more"):
        parse(ExtenderArgs, b'{"NodeNames": [1, 2, 3, 4, 5]}')


def test_host_priority_text_is_the_wire_list() -> None:
    odd = 'we"ird\\node\u00e9'  # a name from a request is escaped, never trusted
    answer = json_array([host_priority_item("gpu-a", 10), host_priority_item(odd, 0)])
    assert HostPriorityList.validate_json(answer) == [
        HostPriority(Host="gpu-a", Score=10),
        HostPriority(Host=odd, Score=0),
    ]
    assert json_array([]) == b"[]"
