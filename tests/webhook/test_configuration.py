"""The MutatingWebhookConfiguration users apply sends the webhook every GPU pod.

The apiserver evaluates ``matchConditions``; e2e runs them for real. Here we
check they name every resource :func:`headroom.names.is_gpu_resource` knows:
a pod asking for ``nvidia.com/gpu.shared`` or a MIG slice directly must still
be checked against maxMemory and get the annotations the extender charges by.
"""

from pathlib import Path
from typing import Any

import yaml

from headroom import names

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "manifests/base/webhook/mutatingwebhookconfiguration.yaml"


def webhook() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CONFIGURATION.read_text())
    (only,) = document["webhooks"]
    return dict(only)


def test_match_conditions_name_every_gpu_resource_headroom_rewrites() -> None:
    (condition,) = webhook()["matchConditions"]
    expression = condition["expression"]
    assert f"k == '{names.GPU}'" in expression
    assert f"k == '{names.GPU_SHARED}'" in expression
    assert f"k.startsWith('{names.MIG_PREFIX}')" in expression
    assert "object.spec.initContainers" in expression
    assert "c.resources.limits" in expression
    assert "c.resources.requests" in expression


def test_only_pod_creates_in_policy_namespaces_are_sent() -> None:
    hook = webhook()
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": names.LABEL_POLICY, "operator": "Exists"}
    ]
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["sideEffects"] == "None"
