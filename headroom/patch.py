"""RFC 6902 operations from an object and the object we want it to become.

``jsonpatch.make_patch`` would do, but it turns a renamed key with an equal
value (``nvidia.com/gpu: "1"`` -> ``nvidia.com/gpu.shared: "1"``) into a
``move``, possibly across containers. This diff emits only ``add``,
``replace`` and ``remove``, adds only under parents that exist in the
original, and appends to lists at their end, so every op is one the apiserver
applies and a person can read.
"""

from collections.abc import Sequence
from typing import Any

Operation = dict[str, Any]


def pointer(parts: Sequence[str | int]) -> str:
    """A JSON Pointer: ``~`` becomes ``~0`` and then ``/`` becomes ``~1``."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def same(left: Any, right: Any) -> bool:
    """Equal as JSON: ``1`` and ``True`` and ``1.0`` differ, key order does not matter."""
    if left is right:
        return True
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    return bool(left == right)


def diff(old: Any, new: Any, path: tuple[str | int, ...] = ()) -> list[Operation]:
    """Operations that turn ``old`` into ``new``, in an order that applies cleanly."""
    if same(old, new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Operation] = [
            {"op": "remove", "path": pointer((*path, key))} for key in old if key not in new
        ]
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": pointer((*path, key)), "value": value})
            else:
                ops.extend(diff(old[key], value, (*path, key)))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(new) >= len(old):
        ops = []
        for index, (before, after) in enumerate(zip(old, new, strict=False)):
            ops.extend(diff(before, after, (*path, index)))
        for index in range(len(old), len(new)):
            ops.append({"op": "add", "path": pointer((*path, index)), "value": new[index]})
        return ops
    if not path:
        raise ValueError("cannot patch the document root")
    return [{"op": "replace", "path": pointer(path), "value": new}]
