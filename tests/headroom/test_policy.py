"""headroom.policy: the GPUSharingPolicy model and its loader."""

from pathlib import Path
from typing import Any

import pytest

from headroom.policy import PolicyError, index_policies, load_policies, parse_policy

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests/base/policies").glob("*.yaml"))


def policy(spec: Any, **top: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": "p", "uid": "ignored", "labels": {"a": "b"}},
        "spec": spec,
        **top,
    }


def test_defaults() -> None:
    spec = parse_policy(policy({})).spec
    assert spec.mode == "shared"
    assert spec.default_memory is None
    assert spec.max_memory is None
    assert spec.scheduler_name == "headroom-scheduler"
    assert (spec.placement, spec.sharing, spec.guard) == ("binpack", "timeSlicing", "warn")
    assert (spec.multi_gpu, spec.node_selector_conflict, spec.invalid_memory) == (
        "exclusive",
        "warn",
        "deny",
    )
    assert (spec.env_hints, spec.dry_run) == (False, False)
    assert (spec.mig.allowed_profiles, spec.mig.fallback) == ([], "larger")


def test_camel_case_fields_and_memory_in_bytes() -> None:
    spec = parse_policy(
        policy({"defaultMemory": "1.5Gi", "maxMemory": "20G", "multiGPU": "deny", "dryRun": True})
    ).spec
    assert spec.default_memory_bytes == 3 * 2**29
    assert spec.max_memory_bytes == 20 * 10**9
    assert spec.multi_gpu == "deny"
    assert spec.dry_run


def test_tolerations_come_back_in_pod_shape() -> None:
    toleration = {
        "key": "k",
        "operator": "Equal",
        "value": "v",
        "effect": "NoExecute",
        "tolerationSeconds": 30,
    }
    spec = parse_policy(policy({"tolerations": [toleration]})).spec
    assert spec.tolerations[0].as_pod_toleration() == toleration


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"defaultMemry": "4Gi"}, "spec.defaultMemry: Extra inputs are not permitted"),
        ({"default_memory": "4Gi"}, "spec.default_memory"),
        ({"mode": "timeslice"}, "spec.mode"),
        ({"defaultMemory": "4Gx"}, "spec.defaultMemory"),
        ({"defaultMemory": "0"}, "spec.defaultMemory"),
        ({"defaultMemory": 4}, "spec.defaultMemory"),
        ({"defaultMemory": "8Gi", "maxMemory": "4Gi"}, "defaultMemory 8Gi is above maxMemory 4Gi"),
        ({"minMemory": "8Gi", "maxMemory": "4Gi"}, "minMemory 8Gi is above maxMemory 4Gi"),
        ({"minMemory": "8Gi", "defaultMemory": "4Gi"}, "defaultMemory 4Gi is below minMemory 8Gi"),
        ({"minMemory": "0"}, "spec.minMemory"),
        ({"maxMemory": "99999999Ei"}, "out of range"),
        ({"mig": {"allowedProfiles": ["3g"]}}, "spec.mig.allowedProfiles.0"),
        ({"mig": {"fallback": "smaller"}}, "spec.mig.fallback"),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "value must be empty",
        ),
        ({"tolerations": [{"value": "v"}]}, "operator must be Exists"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": "30"}]}, "tolerationSeconds"),
        (
            {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30}]},
            "effect must be NoExecute when tolerationSeconds is set",
        ),
        ({"tolerations": [{"key": "k", "value": "a b"}]}, "spec.tolerations.0.value"),
        ({"nodeSelector": {"a": "two words"}}, "spec.nodeSelector.a"),
        ({"nodeSelector": {"bad key": "v"}}, "spec.nodeSelector.bad key"),
        ({"nodeSelector": {"a": 1}}, "spec.nodeSelector.a"),
        ({"schedulerName": "Not_A_Name"}, "spec.schedulerName"),
        ({"envHints": "true"}, "spec.envHints"),
        ({"guard": "kill"}, "spec.guard"),
        ("shared", "spec"),
    ],
)
def test_invalid_specs_name_the_field(spec: Any, where: str) -> None:
    with pytest.raises(PolicyError, match="GPUSharingPolicy 'p'") as caught:
        parse_policy(policy(spec))
    assert where in str(caught.value)


@pytest.mark.parametrize(
    "obj",
    [
        policy({}, apiVersion="headroom.dev/v1"),
        policy({}, kind="Policy"),
        {"apiVersion": "headroom.dev/v1alpha1", "kind": "GPUSharingPolicy", "spec": {}},
        ["not", "an", "object"],
    ],
)
def test_wrong_objects_are_refused(obj: Any) -> None:
    with pytest.raises(PolicyError):
        parse_policy(obj)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_policy_loads(path: Path) -> None:
    (loaded,) = load_policies(path.read_text())
    assert loaded.name == path.stem


def test_multi_document_and_list_files() -> None:
    text = "\n---\n".join(path.read_text() for path in EXAMPLES)
    assert [p.name for p in load_policies(text)] == [p.stem for p in EXAMPLES]
    listed = "apiVersion: v1\nkind: List\nitems:\n- " + EXAMPLES[0].read_text().replace(
        "\n", "\n  "
    )
    assert len(load_policies(listed)) == 1


def test_loader_says_which_document_is_wrong() -> None:
    broken = (
        "apiVersion: headroom.dev/v1alpha1\nkind: GPUSharingPolicy\n"
        "metadata: {name: x}\nspec: {mode: nope}\n"
    )
    text = EXAMPLES[0].read_text() + "\n---\n" + broken
    with pytest.raises(PolicyError, match=r"document 2: GPUSharingPolicy 'x': spec.mode"):
        load_policies(text)


def test_loader_reports_bad_yaml() -> None:
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policies("spec: [unclosed")


def test_two_policies_with_one_name_are_refused() -> None:
    one = parse_policy(policy({}))
    with pytest.raises(PolicyError, match="two GPUSharingPolicy objects are named 'p'"):
        index_policies([one, one])
