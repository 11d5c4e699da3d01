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


def webhook(name: str = "pods.headroom.dev") -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CONFIGURATION.read_text())
    (found,) = [hook for hook in document["webhooks"] if hook["name"] == name]
    return dict(found)


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


def test_only_the_agents_evictions_are_sent_to_the_eviction_check() -> None:
    hook = webhook("agent-evictions.headroom.dev")
    assert hook["clientConfig"]["service"]["path"] == "/validate-eviction"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods/eviction"],
            "scope": "Namespaced",
        }
    ]
    (condition,) = hook["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{names.AGENT_USER}'"
    assert hook["failurePolicy"] == "Fail"
    assert "namespaceSelector" not in hook  # every namespace: the guard evicts anywhere
