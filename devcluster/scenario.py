"""Seed 001 as objects to apply: the demo policy and the three Deployments, per phase.

``scenarios/seed001.yaml`` holds the Deployments as a Headroom user writes
them (the *after* form). The *before* form is derived from it the way users of
stock time-slicing write the same workloads: the shared resource asked for
directly, the GPU taint tolerated, the pod pinned to one time-sliced A100, and
no memory declaration (nothing would read it).
"""

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.usage import Leak, Spiky, Steady, UsageError, parse_usage
from headroom import names

SEED001 = Path(__file__).parent / "scenarios" / "seed001.yaml"
REFERENCE_SECONDS = 25.0
"""The phase length the scenario file's usage times are written for."""
WORKLOAD_LABEL = "app"
SCENARIO_LABEL = "demo.headroom.dev/scenario"
GPU_TAINT_TOLERATION = {
    "key": "node-role.kubernetes.io/gpu",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}

Object = dict[str, Any]


class ScenarioError(ValueError):
    """The scenario file is not what the demo needs; the message names the document."""


@dataclass(frozen=True)
class Scenario:
    policy: Object
    deployments: tuple[Object, ...]

    @property
    def policy_name(self) -> str:
        return str(self.policy["metadata"]["name"])

    @property
    def guard(self) -> str:
        return str(self.policy.get("spec", {}).get("guard", "warn"))

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(sorted(d["metadata"]["name"] for d in self.deployments))

    @property
    def leaker(self) -> str:
        """The workload whose memory only grows: the one that starves the others."""
        leaks = [
            str(d["metadata"]["name"]) for d in self.deployments if isinstance(_usage(d), Leak)
        ]
        if len(leaks) != 1:
            raise ScenarioError(f"expected exactly one leaking Deployment, found {leaks}")
        return leaks[0]

    def declared(self, workload: str) -> str | None:
        deployment = next(d for d in self.deployments if d["metadata"]["name"] == workload)
        value = _annotations(deployment).get(names.ANNOTATION_GPU_MEMORY)
        return None if value is None else str(value)


def load(path: Path = SEED001, *, duration: float = REFERENCE_SECONDS) -> Scenario:
    """Read a scenario file, with its usage times scaled from 25 s to ``duration``."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as err:
        raise ScenarioError(f"cannot read scenario {path}: {err}") from err
    policies = [d for d in documents if d.get("kind") == names.POLICY_KIND]
    deployments = [d for d in documents if d.get("kind") == "Deployment"]
    if len(policies) != 1 or not deployments:
        raise ScenarioError(f"{path}: expected one {names.POLICY_KIND} and some Deployments")
    scale = duration / REFERENCE_SECONDS
    for deployment in deployments:
        pattern = _usage(deployment)
        annotations = _annotations(deployment)
        annotations[names.ANNOTATION_SIMULATED_USAGE] = json.dumps(
            _scaled(pattern, scale), separators=(",", ":")
        )
        labels = deployment["spec"]["template"]["metadata"].setdefault("labels", {})
        if labels.get(WORKLOAD_LABEL) != deployment["metadata"]["name"]:
            raise ScenarioError(
                f"Deployment {deployment['metadata']['name']}: the pod label "
                f"{WORKLOAD_LABEL} must equal the Deployment's name"
            )
    return Scenario(policies[0], tuple(deployments))


def namespace(name: str, *, policy: str | None) -> Object:
    labels = {SCENARIO_LABEL: "seed001"}
    if not policy:
        # Stock time-slicing (the "before" story) is refused cluster-wide by Headroom's
        # admission policies; an admin's exemption lets the demo show what it prevents.
        labels[names.LABEL_EXEMPT] = "true"
    if policy is not None:
        labels[names.LABEL_POLICY] = policy
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def after_deployments(scenario: Scenario, ns: str) -> list[Object]:
    """As the user wrote them: Headroom's webhook and extender do the rest."""
    out = []
    for deployment in scenario.deployments:
        copied = copy.deepcopy(deployment)
        copied["metadata"]["namespace"] = ns
        for container in copied["spec"]["template"]["spec"]["containers"]:
            for amounts in (container.get("resources") or {}).values():
                # Quantities are strings on the wire; YAML reads `1` as a number,
                # which the Python client refuses before the apiserver sees it.
                amounts.update({k: str(v) for k, v in amounts.items()})
        out.append(copied)
    return out


def before_deployments(scenario: Scenario, ns: str, *, node: str) -> list[Object]:
    """As stock time-slicing users write them: all on ``node``, by the default scheduler."""
    out = []
    for deployment in after_deployments(scenario, ns):
        template = deployment["spec"]["template"]
        template["metadata"]["annotations"].pop(names.ANNOTATION_GPU_MEMORY, None)
        spec = template["spec"]
        for container in spec["containers"]:
            resources = container.get("resources") or {}
            for key in ("limits", "requests"):
                amounts = resources.get(key) or {}
                if names.GPU in amounts:
                    amounts[names.GPU_SHARED] = amounts.pop(names.GPU)
        spec["tolerations"] = [*spec.get("tolerations", []), dict(GPU_TAINT_TOLERATION)]
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "kubernetes.io/hostname": node}
        out.append(deployment)
    return out


def _annotations(deployment: Object) -> dict[str, str]:
    annotations: dict[str, str] = deployment["spec"]["template"]["metadata"].setdefault(
        "annotations", {}
    )
    return annotations


def _usage(deployment: Object) -> Steady | Spiky | Leak:
    name = deployment.get("metadata", {}).get("name", "?")
    text = _annotations(deployment).get(names.ANNOTATION_SIMULATED_USAGE)
    if text is None:
        raise ScenarioError(f"Deployment {name}: no {names.ANNOTATION_SIMULATED_USAGE} annotation")
    try:
        return parse_usage(text)
    except UsageError as err:
        raise ScenarioError(f"Deployment {name}: {err}") from err


def _scaled(pattern: Steady | Spiky | Leak, scale: float) -> dict[str, Any]:
    """The same curve stretched in time by ``scale`` (memory amounts unchanged)."""
    document = pattern.model_dump(by_alias=True, exclude_none=True)
    for key in ("periodSeconds", "spikeSeconds"):
        if key in document:
            document[key] = round(document[key] * scale, 3)
    if "ratePerMinute" in document:
        document["ratePerMinute"] = round(document["ratePerMinute"] / scale)
    return document
