"""Pods and policies for the decision tests: the seeds' manifests, built policies."""

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from cli.explain import pod_of
from headroom.mig import MigOffer
from headroom.mutation import Decision, decide
from headroom.policy import GPUSharingPolicy, parse_policy

DATA = Path(__file__).resolve().parent.parent / "data" / "pods"
POLICIES = Path(__file__).resolve().parents[2] / "manifests" / "base" / "policies"
NAMESPACE = "ml"


def load_pod(name: str) -> dict[str, Any]:
    """A pod from ``tests/data/pods/<name>.yaml`` (a workload gives its template)."""
    pod, _ = pod_of(yaml.safe_load((DATA / f"{name}.yaml").read_text()))
    return pod


def gpu_pod(*limits: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """A pod with one container per limits dict, named c0, c1..."""
    containers = [
        {"name": f"c{i}", "image": "cuda", "resources": {"limits": dict(lim)}}
        for i, lim in enumerate(limits)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "p-", **metadata},
        "spec": {"containers": containers},
    }


def make_policy(name: str = "p", **spec: Any) -> GPUSharingPolicy:
    return parse_policy(
        {
            "apiVersion": "headroom.dev/v1alpha1",
            "kind": "GPUSharingPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


SHARED = make_policy("gpu-shared", defaultMemory="4Gi", maxMemory="20Gi")


def run(
    pod: dict[str, Any],
    policy: GPUSharingPolicy = SHARED,
    *,
    operation: str = "CREATE",
    offer: MigOffer | None = None,
    labels: dict[str, str] | None = None,
) -> Decision:
    """The decision for ``pod`` in a namespace labelled with ``policy``."""
    return decide(
        copy.deepcopy(pod),
        namespace=NAMESPACE,
        namespace_labels={"headroom.dev/policy": policy.name} if labels is None else labels,
        policies={policy.name: policy},
        operation=operation,
        offered_mig=offer,
    )


def patched(pod: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The pod after the decision's patch, applied the way the apiserver does."""
    result: dict[str, Any] = jsonpatch.apply_patch(pod, decision.patch)
    return result


def container(pod: dict[str, Any], index: int = 0, kind: str = "containers") -> dict[str, Any]:
    result: dict[str, Any] = pod["spec"][kind][index]
    return result
