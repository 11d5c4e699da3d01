"""Rules 2 and 10 as properties, and garbage in: never an exception.

Hypothesis builds pods (containers, init containers, GPU requests, memory
annotations, the pod's own selectors and env) and policies, then checks what
must hold for every one of them.
"""

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from headroom.claims import parse_claim
from headroom.mig import MigOffer
from headroom.mutation import decide
from headroom.policy import GPUSharingPolicy
from headroom.quantity import parse_bytes
from tests.headroom.pods import make_policy

GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-3g.20gb",
    "nvidia.com/mig-1g.5gb",
]
MEMORY = ["1Gi", "4Gi", "10Gi", "24Gi", "9856Mi", "10Gx", "0", "5G"]


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    result = []
    for index in range(draw(st.integers(0, 3))):
        limits: dict[str, Any] = {}
        if draw(st.booleans()):
            limits[draw(st.sampled_from(GPU_RESOURCES))] = draw(st.sampled_from(["1", "2", 1, "0"]))
        if draw(st.booleans()):
            limits["cpu"] = "1"
        resources: dict[str, Any] = {"limits": limits}
        if draw(st.booleans()):  # as the apiserver defaults them
            resources["requests"] = dict(limits)
        body: dict[str, Any] = {"name": f"{prefix}{index}", "image": "cuda", "resources": resources}
        if draw(st.booleans()):
            body["env"] = [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"}]
        if prefix == "i" and draw(st.booleans()):
            body["restartPolicy"] = "Always"
        result.append(body)
    return result


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        annotations["headroom.dev/gpu-memory"] = draw(st.sampled_from(MEMORY))
    if draw(st.booleans()):
        annotations["headroom.dev/gpu-memory.c0"] = draw(st.sampled_from(MEMORY))
    spec: dict[str, Any] = {"containers": draw(containers("c"))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(containers("i"))
    if draw(st.booleans()):
        spec["nodeSelector"] = {
            "nvidia.com/gpu.sharing-strategy": draw(st.sampled_from(["mps", "time-slicing"]))
        }
    if draw(st.booleans()):
        spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "volcano", ""]))
    metadata: dict[str, Any] = {"generateName": "p-"}
    empty_annotations: bool = draw(st.booleans())
    if annotations or empty_annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


policies = st.builds(
    lambda mode, default, limit, flags, profiles, fallback: make_policy(
        "p",
        mode=mode,
        mig={"allowedProfiles": profiles, "fallback": fallback},
        tolerations=[
            {
                "key": "node-role.kubernetes.io/gpu",
                "operator": "Equal",
                "value": "true",
                "effect": "NoSchedule",
            }
        ],
        nodeSelector={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
        **({"defaultMemory": default} if default else {}),
        **({"maxMemory": limit} if limit else {}),
        **flags,
    ),
    st.sampled_from(["shared", "mig", "exclusive", "passthrough"]),
    st.sampled_from([None, "1Gi", "4Gi"]),
    st.sampled_from([None, "20Gi", "40Gi"]),
    st.fixed_dictionaries(
        {},
        optional={
            "envHints": st.booleans(),
            "sharing": st.sampled_from(["timeSlicing", "mps"]),
            "dryRun": st.booleans(),
            "multiGPU": st.sampled_from(["exclusive", "deny"]),
            "nodeSelectorConflict": st.sampled_from(["warn", "deny"]),
            "invalidMemory": st.sampled_from(["warn", "deny"]),
        },
    ),
    st.sampled_from([[], ["1g.5gb", "3g.20gb"], ["2g.10gb", "7g.40gb"]]),
    st.sampled_from(["larger", "deny"]),
)
offers = st.sampled_from(
    [
        None,
        MigOffer(),
        MigOffer.from_nodes([{"status": {"capacity": {"nvidia.com/mig-3g.20gb": "2"}}}]),
    ]
)


def run(pod: Any, policy: GPUSharingPolicy, offer: MigOffer | None = None) -> Any:
    return decide(
        pod,
        namespace="ml",
        namespace_labels={"headroom.dev/policy": "p"},
        policies={"p": policy},
        offered_mig=offer,
    )


@given(pods(), policies, offers)
def test_rule10_the_decision_on_its_own_output_changes_nothing(
    pod: dict[str, Any], policy: GPUSharingPolicy, offer: MigOffer | None
) -> None:
    first = run(copy.deepcopy(pod), policy, offer)
    assert {op["op"] for op in first.patch} <= {"add", "remove", "replace"}
    result = jsonpatch.apply_patch(pod, first.patch)
    second = run(result, policy, offer)
    assert second.patch == []
    assert second.allowed == first.allowed
    assert second.annotations == first.annotations


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Init containers (some of them sidecars) and app containers, each perhaps asking
    for a GPU and declaring its own memory by annotation."""
    annotations: dict[str, str] = {}

    def body(name: str) -> dict[str, Any]:
        limits = {}
        if draw(st.booleans()):
            limits["nvidia.com/gpu"] = "1"
            annotations[f"headroom.dev/gpu-memory.{name}"] = f"{draw(st.integers(1, 20))}Gi"
        return {"name": name, "image": "cuda", "resources": {"limits": limits}}

    inits = [body(f"i{index}") for index in range(draw(st.integers(0, 4)))]
    for init in inits:
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
    spec = {"initContainers": inits, "containers": [body("c0"), body("c1")]}
    return {"metadata": {"generateName": "p-", "annotations": annotations}, "spec": spec}


@given(gpu_pods())
def test_rule5_the_recorded_declaration_is_what_the_extender_charges(pod: dict[str, Any]) -> None:
    # The annotation explains the charge; the extender reads the resources (headroom.claims).
    decision = run(copy.deepcopy(pod), make_policy("p", defaultMemory="4Gi"))
    claim = parse_claim(jsonpatch.apply_patch(pod, decision.patch))
    recorded = decision.annotations.get("headroom.dev/declared-memory")
    assert claim.declared == (None if recorded is None else parse_bytes(recorded))


@given(pods(), policies, offers)
def test_rule2_requests_equal_limits_for_every_extended_resource(
    pod: dict[str, Any], policy: GPUSharingPolicy, offer: MigOffer | None
) -> None:
    result = jsonpatch.apply_patch(pod, run(copy.deepcopy(pod), policy, offer).patch)
    for kind in ("initContainers", "containers"):
        for body in result["spec"].get(kind, []):
            limits = body["resources"].get("limits", {})
            requests = body["resources"].get("requests", {})
            for name in (*limits, *requests):
                if "/" in name:  # extended resources (nvidia.com/...)
                    assert name in limits
                    if name in requests:
                        assert str(requests[name]) == str(limits[name])


@given(pods(), policies, offers)
def test_rule11_warnings_are_short_ascii_lines(
    pod: dict[str, Any], policy: GPUSharingPolicy, offer: MigOffer | None
) -> None:
    decision = run(pod, policy, offer)
    assert decision.allowed or (decision.message and not decision.patch)
    for warning in decision.warnings:
        assert len(warning) < 120
        assert warning.isascii()
        assert warning.isprintable()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


@given(pods(), policies, st.data())
def test_garbage_anywhere_in_a_pod_denies_or_passes_never_raises(
    pod: dict[str, Any], policy: GPUSharingPolicy, data: st.DataObject
) -> None:
    where = data.draw(st.sampled_from(paths(pod)[1:]))
    parent = pod
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = data.draw(json_values)
    decision = run(copy.deepcopy(pod), policy)
    if decision.allowed:
        jsonpatch.apply_patch(pod, decision.patch)  # whatever it patches applies
    else:
        assert decision.message
        assert decision.patch == []


@given(json_values, policies)
def test_any_json_at_all_is_answered(value: Any, policy: GPUSharingPolicy) -> None:
    decision = run(value, policy)
    if not isinstance(value, dict):
        assert not decision.allowed
        assert decision.message.startswith("object: expected a Pod")
    elif not decision.allowed:
        assert decision.message
        assert decision.patch == []


def test_absurdly_deep_nesting_is_denied_not_raised() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = {"a": deep}
    pod = {
        "metadata": {},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}, "env": deep}
            ]
        },
    }
    decision = run(pod, make_policy("p", defaultMemory="1Gi"))
    assert not decision.allowed
    assert decision.message == "object: nested too deeply"
