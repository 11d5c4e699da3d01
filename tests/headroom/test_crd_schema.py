"""The CRD's OpenAPI schema and the pydantic model accept the same policies.

``structurally_valid`` below is a small, honest checker for the subset of
OpenAPI v3 the CRD uses (type, properties, required, additionalProperties,
enum, pattern, lengths, item and property counts), rejecting unknown fields
the way ``kubectl``'s strict field validation does. It does not evaluate the
CRD's CEL rules (``x-kubernetes-validations``); those cases are checked apart,
and the e2e suite applies all of them to a real apiserver.
"""

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.policy import GPUSharingPolicySpec, MigPolicy, PolicyError, parse_policy

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests/base/crds/gpusharingpolicies.yaml").read_text())
SCHEMA: dict[str, Any] = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SPEC_SCHEMA: dict[str, Any] = SCHEMA["properties"]["spec"]
EXAMPLES = sorted((ROOT / "manifests/base/policies").glob("*.yaml"))
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}


def structurally_valid(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    kind = schema.get("type")
    if kind and not (
        isinstance(value, TYPES[kind]) and not (kind == "integer" and isinstance(value, bool))
    ):
        return [f"{where}: must be {kind}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: not one of {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{where}: does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get(
            "minLength", 0
        ):
            problems.append(f"{where}: bad length")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            problems.append(f"{where}: too many items")
        for index, item in enumerate(value):
            problems += structurally_valid(item, schema.get("items", {}), f"{where}[{index}]")
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            problems.append(f"{where}: too many properties")
        problems += [
            f"{where}.{key}: required" for key in schema.get("required", []) if key not in value
        ]
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                problems += structurally_valid(item, properties[key], f"{where}.{key}")
            elif extra is not None:
                problems += structurally_valid(item, extra, f"{where}.{key}")
            elif properties is not None:
                problems.append(f"{where}.{key}: unknown field")
    return problems


def document(spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def model_accepts(obj: dict[str, Any]) -> bool:
    try:
        parse_policy(obj)
    except PolicyError:
        return False
    return True


VALID_SPECS: list[Any] = [
    {},
    {"mode": "mig", "mig": {"allowedProfiles": ["1g.10gb+me", "3g.20gb"], "fallback": "deny"}},
    {"defaultMemory": "512Mi", "maxMemory": "1.5Gi"},
    {
        "tolerations": [
            {"operator": "Exists"},
            {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 5},
        ]
    },
    {"nodeSelector": {"a/b": "c"}, "schedulerName": "my.scheduler-1"},
    {"nodeSelector": {"nvidia.com/gpu.sharing-strategy": "time-slicing", "empty": ""}},
]
INVALID_SPECS: list[Any] = [
    {"mode": "timeslicing"},
    {"defaultMemry": "4Gi"},
    {"default_memory": "4Gi"},
    {"defaultMemory": "4Gx"},
    {"defaultMemory": "0"},
    {"defaultMemory": "-1Gi"},
    {"defaultMemory": "100m"},
    {"defaultMemory": 4096},
    {"defaultMemory": "1" * 40},
    {"mig": {"allowedProfiles": ["3g"]}},
    {"mig": {"allowedProfiles": "3g.20gb"}},
    {"mig": {"fallback": "smaller"}},
    {"mig": {"allowed": []}},
    {"tolerations": [{"key": "k", "effect": "NoRun"}]},
    {"tolerations": [{"key": "k", "tolerationSeconds": "5"}]},
    {"tolerations": [{"key": "k", "operator": "Equal", "extra": 1}]},
    {"tolerations": {"key": "k"}},
    {"nodeSelector": {"a": 1}},
    {"nodeSelector": {"a": "x" * 64}},
    # Label values the apiserver would refuse on the pod this policy patches.
    {"nodeSelector": {"a": "two words"}},
    {"nodeSelector": {"a": "-dash"}},
    {"tolerations": [{"key": "k", "value": "a b"}]},
    {"tolerations": [{"key": "bad key"}]},
    {"tolerations": [{"key": "Upper.Prefix/name"}]},
    {"schedulerName": "Upper"},
    {"placement": "random"},
    {"sharing": "mig"},
    {"envHints": "yes"},
    {"dryRun": 1},
    {"multiGPU": "share"},
    {"multiGpu": "deny"},
    {"nodeSelectorConflict": "overwrite"},
    {"invalidMemory": "ignore"},
    {"guard": "kill"},
    "shared",
]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_policies_are_valid_on_both_sides(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    assert structurally_valid(obj, SCHEMA) == []
    assert model_accepts(obj)


@pytest.mark.parametrize("spec", VALID_SPECS + INVALID_SPECS, ids=repr)
def test_both_sides_agree(spec: Any) -> None:
    obj = document(spec)
    crd_ok = structurally_valid(obj, SCHEMA) == []
    assert crd_ok == model_accepts(obj), structurally_valid(obj, SCHEMA)
    assert crd_ok == (spec in VALID_SPECS)


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ({"defaultMemory": "8Gi", "maxMemory": "4Gi"}, "quantity(self.defaultMemory)"),
        (
            {"minMemory": "8Gi", "maxMemory": "4Gi"},
            "quantity(self.minMemory).compareTo(quantity(self.maxMemory))",
        ),
        (
            {"minMemory": "8Gi", "defaultMemory": "4Gi"},
            "quantity(self.minMemory).compareTo(quantity(self.defaultMemory))",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "self.operator != 'Exists'",
        ),
        ({"tolerations": [{"value": "v"}]}, "self.key != ''"),
        # The apiserver refuses a pod whose toleration sets tolerationSeconds without NoExecute.
        (
            {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
            "self.effect == 'NoExecute'",
        ),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "self.effect == 'NoExecute'"),
        # Map keys have no OpenAPI pattern; CEL checks nodeSelector keys are label keys.
        ({"nodeSelector": {"bad key": "v"}}, "self.all(k, k.size() <= 316"),
        ({"nodeSelector": {"a/b/c": "v"}}, "self.all(k, k.size() <= 316"),
        ({"nodeSelector": {"x/" + "n" * 64: "v"}}, "self.all(k, k.size() <= 316"),
    ],
)
def test_cross_field_rules_are_cel_in_the_crd_and_checked_by_the_model(
    spec: Any, rule: str
) -> None:
    obj = document(spec)
    assert structurally_valid(obj, SCHEMA) == []  # only CEL catches these...
    assert any(rule in text for text in cel_rules(SCHEMA))  # ...and the CRD has the rule
    assert not model_accepts(obj)


def cel_rules(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        own = [item["rule"] for item in schema.get("x-kubernetes-validations", [])]
        return own + [rule for value in schema.values() for rule in cel_rules(value)]
    if isinstance(schema, list):
        return [rule for value in schema for rule in cel_rules(value)]
    return []


def test_the_one_documented_difference_is_range() -> None:
    # The pattern cannot bound the value; the model refuses >= 8Ei, the CRD stores it.
    obj = document({"maxMemory": "9999Ei"})
    assert structurally_valid(obj, SCHEMA) == []
    assert not model_accepts(obj)


@pytest.mark.parametrize(
    ("model", "schema"),
    [(GPUSharingPolicySpec, SPEC_SCHEMA), (MigPolicy, SPEC_SCHEMA["properties"]["mig"])],
    ids=["spec", "mig"],
)
def test_fields_enums_and_defaults_are_the_same(model: Any, schema: dict[str, Any]) -> None:
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    assert set(fields) == set(schema["properties"])
    for key, info in fields.items():
        prop = schema["properties"][key]
        if typing.get_origin(info.annotation) is typing.Literal:
            assert prop["enum"] == list(typing.get_args(info.annotation)), key
        default = info.get_default(call_default_factory=True)
        if default is None:
            assert "default" not in prop, key
        elif isinstance(default, MigPolicy):
            assert prop["default"] == {}, key  # the apiserver then defaults its fields
        else:
            assert prop["default"] == default, key


def test_printer_columns_and_names() -> None:
    assert CRD["spec"]["scope"] == "Cluster"
    assert CRD["spec"]["names"]["shortNames"] == ["gsp"]
    columns = {
        c["name"]: c["jsonPath"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert columns["Mode"] == ".spec.mode"
    assert columns["Default"] == ".spec.defaultMemory"
    assert columns["Max"] == ".spec.maxMemory"
