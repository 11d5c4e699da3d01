"""headroom.patch: a diff the apiserver applies, with only add/remove/replace."""

from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.patch import diff, pointer, same

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def test_pointer_escapes_tilde_then_slash() -> None:
    assert pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"
    assert (
        pointer(["metadata", "annotations", "headroom.dev/mode"])
        == "/metadata/annotations/headroom.dev~1mode"
    )


def test_a_renamed_key_is_remove_and_add_never_move() -> None:
    old = {"limits": {"nvidia.com/gpu": "1"}}
    new = {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert diff(old, new) == [
        {"op": "remove", "path": "/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/limits/nvidia.com~1gpu.shared", "value": "1"},
    ]


def test_appends_go_to_the_end_of_the_list() -> None:
    assert diff({"t": [1]}, {"t": [1, 2, 3]}) == [
        {"op": "add", "path": "/t/1", "value": 2},
        {"op": "add", "path": "/t/2", "value": 3},
    ]


def test_json_types_are_not_conflated() -> None:
    assert not same(1, True)
    assert not same(1, 1.0)
    assert same({"a": [1]}, {"a": [1]})
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]


def test_the_root_cannot_be_replaced() -> None:
    with pytest.raises(ValueError, match="root"):
        diff({"a": 1}, [1])


@given(
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
)
def test_diff_applies_and_uses_three_ops(old: dict[str, Any], new: dict[str, Any]) -> None:
    ops = diff(old, new)
    assert {op["op"] for op in ops} <= {"add", "remove", "replace"}
    assert same(jsonpatch.apply_patch(old, ops), new)
    assert diff(new, new) == []
