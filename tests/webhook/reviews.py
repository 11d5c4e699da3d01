"""The wire fixtures under tests/data/admission, and a cache fed as the watches feed it."""

import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from webhook.cache import ClusterCache

DATA = Path(__file__).resolve().parent.parent / "data" / "admission"

NAMESPACES = {
    "ml-team": "shared-default",
    "mig-team": "mig-a100",
    "mps-team": "mps",
    "dry-team": "report-only",
    "typo-team": "no-such-policy",
}
"""Namespace -> the policy its ``headroom.dev/policy`` label names."""


def review_json(name: str) -> dict[str, Any]:
    """An AdmissionReview from ``tests/data/admission/<name>.json``."""
    document: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return document


def review_bytes(name: str) -> bytes:
    return (DATA / f"{name}.json").read_bytes()


def policy_objects() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DATA / "policies.yaml").read_text()) if doc]


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The RFC 6902 operations in an AdmissionResponse (base64 of a JSON array)."""
    assert response.get("patchType") == "JSONPatch"
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return operations


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the response's patch applied, the way the apiserver applies it."""
    if "patch" not in response:
        return obj
    result: dict[str, Any] = jsonpatch.apply_patch(obj, decoded_patch(response))
    return result


def fed_cache() -> ClusterCache:
    """A cache filled through its informer callbacks, as the watches would fill it."""
    cache = ClusterCache(watch_nodes=False)
    for namespace, policy in NAMESPACES.items():
        labels = {"headroom.dev/policy": policy, "kubernetes.io/metadata.name": namespace}
        cache.on_namespace("ADDED", {"metadata": {"name": namespace, "labels": labels}})
    cache.on_namespace("ADDED", {"metadata": {"name": "default"}})
    for obj in policy_objects():
        cache.on_policy("ADDED", obj)
    return cache
