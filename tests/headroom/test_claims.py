"""What a pod claims: shared replicas, MIG slices, declared memory, placement."""

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headroom.claims import parse_claim
from headroom.podspec import MAX_GPU_COUNT, PodError
from headroom.quantity import parse_bytes
from tests.extender.objects import gpu_pod


def test_shared_pod_from_the_webhook() -> None:
    claim = parse_claim(gpu_pod("sim", declared="10Gi", placement="spread", node="gpu-a"))
    assert claim.key == "research/sim"
    assert claim.node == "gpu-a"
    assert (claim.shared, claim.mig, claim.declared) == (1, {}, 10 * 2**30)
    assert claim.placement == "spread"
    assert claim.wants_gpu
    assert claim.problem == ""


def test_mig_pod() -> None:
    claim = parse_claim(gpu_pod("m", mig="1g.10gb+me", declared="9Gi"))
    assert claim.mig == {"1g.10gb+me": 1}
    assert claim.shared == 0
    assert claim.wants_gpu


def test_effective_request_counts_app_containers_and_the_largest_init() -> None:
    pod = gpu_pod("p", shared=1)
    spec = pod["spec"]
    spec["containers"].append(
        {"name": "side", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}
    )
    spec["initContainers"] = [
        {"name": "warm", "resources": {"limits": {"nvidia.com/gpu.shared": "3"}}},
        {"name": "fetch", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}},
    ]
    assert parse_claim(pod).shared == 3
    spec["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] = "1"
    assert parse_claim(pod).shared == 2


def test_unmutated_pod_declares_nothing_and_is_legacy_when_shared() -> None:
    claim = parse_claim(gpu_pod("raw", declared=None, placement=None))
    assert claim.declared is None
    assert claim.need == 0
    assert claim.placement == "binpack"
    assert claim.legacy
    assert not parse_claim(gpu_pod("m", mig="1g.10gb", declared=None)).legacy


@pytest.mark.parametrize("declared", ["0", str(2**256 + 1), "1.844674407370955e+120"])
def test_a_declaration_it_cannot_charge_is_none_never_a_dropped_pod(declared: str) -> None:
    # The apiserver stores each of these (0 is a quantity; the others pass its
    # "whole number" check, and kube-scheduler and kubelet read their low 64 bits),
    # and only the admission policy, which leaves exempt namespaces alone, refuses
    # them. A claim that raised would have the pod watch ignore the pod, leaving it
    # uncharged on its GPU: it is charged as one that declares nothing instead.
    claim = parse_claim(gpu_pod("odd", declared=declared, node="gpu-a"))
    assert (claim.shared, claim.declared, claim.legacy) == (1, None, True)
    assert "spec.containers[0].resources.limits[headroom.dev/gpu-memory]" in claim.problem
    # Beside a MIG slice, or alone, it declares nothing either.
    mig = gpu_pod("slice", mig="1g.10gb", declared=None)
    mig["spec"]["containers"][0]["resources"]["limits"]["headroom.dev/gpu-memory"] = declared
    assert (parse_claim(mig).mig, parse_claim(mig).declared) == ({"1g.10gb": 1}, None)


def test_a_container_asking_two_gpu_resources_is_charged_both() -> None:
    # The webhook refuses it, but in an exempt namespace nothing does, and kubelet
    # gives the container both where a node offers both (MIG and time-sliced GPUs
    # side by side). Raising would have the pod watch drop it, uncharged.
    pod = gpu_pod("two", declared=None, node="gpu-a")
    for section in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][section]["nvidia.com/mig-1g.5gb"] = "1"
    claim = parse_claim(pod)
    assert (claim.shared, claim.mig, claim.legacy) == (1, {"1g.5gb": 1}, True)


@pytest.mark.parametrize("declared", [None, "1Gi"])
def test_a_gpu_count_too_long_to_read_is_charged_the_most_never_a_dropped_pod(
    declared: str | None,
) -> None:
    # In an exempt namespace the apiserver stores nvidia.com/gpu.shared: 2^256 + 1 (a
    # whole number by its check), and kube-scheduler and kubelet read its low 64 bits:
    # one replica. A claim that raised would have the pod watch ignore the pod,
    # leaving it uncharged on its GPU: it is charged the most a pod may ask for, and
    # the filter refuses it naming the field.
    pod = gpu_pod("odd", declared=declared, node="gpu-a")
    for section in pod["spec"]["containers"][0]["resources"].values():
        if "nvidia.com/gpu.shared" in section:
            section["nvidia.com/gpu.shared"] = str(2**256 + 1)
    claim = parse_claim(pod)
    assert claim.shared == MAX_GPU_COUNT
    assert claim.declared == (None if declared is None else parse_bytes(declared))
    assert "spec.containers[0].resources.limits[nvidia.com/gpu.shared]" in claim.problem
    assert "too long to read" in claim.problem


def test_annotations_never_declare_memory() -> None:
    # A tenant may patch annotations; only the immutable resource counts.
    pod = gpu_pod("p", declared="10Gi")
    pod["metadata"]["annotations"]["headroom.dev/declared-memory"] = "1Mi"
    assert parse_claim(pod).declared == 10 * 2**30
    legacy = gpu_pod("old", declared=None)
    legacy["metadata"]["annotations"]["headroom.dev/declared-memory"] = "1Mi"
    assert parse_claim(legacy).declared is None


def test_declared_memory_follows_the_effective_request_rule() -> None:
    pod = gpu_pod("p", declared="4Gi")
    spec = pod["spec"]
    spec["containers"].append(
        {
            "name": "side",
            "resources": {
                "limits": {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "2Gi"}
            },
        }
    )
    spec["initContainers"] = [
        {
            "name": "warm",
            "resources": {
                "limits": {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "8Gi"}
            },
        }
    ]
    assert parse_claim(pod).declared == 8 * 2**30  # the init container's 8 > 4 + 2
    spec["initContainers"][0]["resources"]["limits"]["headroom.dev/gpu-memory"] = "5Gi"
    assert parse_claim(pod).declared == 6 * 2**30


def _gpu_container(name: str, resource: str, count: int, memory: str = "") -> dict[str, object]:
    limits = {resource: str(count)}
    if memory:
        limits["headroom.dev/gpu-memory"] = memory
    return {"name": name, "resources": {"limits": limits}}


def test_a_sidecar_started_before_an_init_container_runs_beside_it() -> None:
    # KEP-753: the plain init container "load" runs while sidecar "proxy" is up, and
    # kubelet never hands a running sidecar's devices on: 2 replicas, 10 + 30 GiB.
    pod = gpu_pod("p", shared=0, declared=None)
    sidecar = _gpu_container("proxy", "nvidia.com/gpu.shared", 1, "10Gi")
    sidecar["restartPolicy"] = "Always"
    pod["spec"]["initContainers"] = [
        sidecar,
        _gpu_container("load", "nvidia.com/gpu.shared", 1, "30Gi"),
    ]
    claim = parse_claim(pod)
    assert (claim.shared, claim.declared) == (2, 40 * 2**30)
    # The other order: "load" has finished before "proxy" starts.
    pod["spec"]["initContainers"].reverse()
    claim = parse_claim(pod)
    assert (claim.shared, claim.declared) == (1, 30 * 2**30)


def test_a_sidecar_before_an_init_container_counts_for_mig_slices_too() -> None:
    pod = gpu_pod("p", mig="1g.10gb", declared=None)
    sidecar = _gpu_container("proxy", "nvidia.com/mig-1g.10gb", 1)
    sidecar["restartPolicy"] = "Always"
    pod["spec"]["initContainers"] = [sidecar, _gpu_container("load", "nvidia.com/mig-1g.10gb", 2)]
    assert parse_claim(pod).mig == {"1g.10gb": 3}  # load's 2 beside proxy's 1; app 1 + 1


@st.composite
def gpu_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Init containers (some sidecars) and app containers, each perhaps on a shared GPU."""

    def body(name: str) -> dict[str, Any]:
        limits = {}
        if draw(st.booleans()):
            limits["nvidia.com/gpu.shared"] = str(draw(st.integers(1, 3)))
            limits["headroom.dev/gpu-memory"] = f"{draw(st.integers(1, 40))}Gi"
        return {"name": name, "resources": {"limits": limits}}

    inits = [body(f"i{n}") for n in range(draw(st.integers(0, 5)))]
    for init in inits:
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
    return {"initContainers": inits, "containers": [body(f"c{n}") for n in range(3)]}


def busiest(spec: dict[str, Any], amount: Callable[[dict[str, Any]], int]) -> int:
    """The most the pod holds at once, stepping through kubelet's start sequence.

    Each init container starts after the one before it has finished (a plain
    one) or started (a sidecar, which then runs until the pod ends); the app
    containers start after all of them, beside every sidecar.
    """
    phases: list[list[dict[str, Any]]] = []
    sidecars: list[dict[str, Any]] = []
    for init in spec["initContainers"]:
        phases.append([*sidecars, init])
        if init.get("restartPolicy") == "Always":
            sidecars.append(init)
    phases.append([*sidecars, *spec["containers"]])
    return max(sum(amount(body) for body in phase) for phase in phases)


def _limit(name: str, parse: Callable[[str], int]) -> Callable[[dict[str, Any]], int]:
    return lambda body: parse(body["resources"]["limits"].get(name, "0"))


@given(gpu_specs())
def test_effective_request_is_the_busiest_moment_of_the_pod(spec: dict[str, Any]) -> None:
    pod = gpu_pod("p", shared=0, declared=None)
    pod["spec"].update(spec)
    claim = parse_claim(pod)
    assert claim.shared == busiest(spec, _limit("nvidia.com/gpu.shared", int))
    assert (claim.declared or 0) == busiest(spec, _limit("headroom.dev/gpu-memory", parse_bytes))


def test_pod_without_gpu_is_not_interesting() -> None:
    claim = parse_claim({"metadata": {"name": "web", "namespace": "d", "uid": "u"}, "spec": {}})
    assert not claim.wants_gpu


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("headroom.dev/placement", "diagonal", "headroom.dev/placement"),
    ],
)
def test_bad_annotation_becomes_a_problem_naming_it(key: str, value: str, named: str) -> None:
    pod = gpu_pod("p")
    pod["metadata"]["annotations"][key] = value
    claim = parse_claim(pod)
    assert named in claim.problem
    assert value in claim.problem


def test_terminated_pod() -> None:
    assert parse_claim(gpu_pod("done", phase="Succeeded")).terminated


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": []},
        {"metadata": {"annotations": {"a": 1}}},
        {"spec": {"containers": "main"}},
        {"spec": {"nodeName": 7}},
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "x"}}}]}},
    ],
)
def test_malformed_pod_raises_pod_error(pod: dict[str, object]) -> None:
    with pytest.raises(PodError):
        parse_claim(pod)


def test_a_known_pod_keeps_its_resource_figures_and_rereads_the_rest() -> None:
    # A pod's extended resources cannot change, so a later event about the same
    # UID reuses them; what can change (node, phase, placement, labels) is read.
    first = parse_claim(gpu_pod("p", declared="10Gi", uid="u-1"))
    later = gpu_pod("p", declared="10Gi", uid="u-1", node="gpu-a", phase="Running")
    later["metadata"]["annotations"]["headroom.dev/placement"] = "spread"
    later["metadata"]["labels"] = {"team": "a"}
    reused = parse_claim(later, first)
    assert reused == parse_claim(later)
    assert (reused.node, reused.placement, reused.labels) == ("gpu-a", "spread", {"team": "a"})
    # The figures really come from the earlier claim: a body that disagrees is not read.
    forged = gpu_pod("p", declared="1Mi", uid="u-1")
    assert parse_claim(forged, first).declared == 10 * 2**30


def test_an_earlier_claim_of_another_uid_is_not_reused() -> None:
    first = parse_claim(gpu_pod("p", declared="10Gi", uid="u-1"))
    recreated = gpu_pod("p", declared="20Gi", uid="u-2")
    assert parse_claim(recreated, first).declared == 20 * 2**30
    no_uid = gpu_pod("p", declared="20Gi", uid="u-1")
    no_uid["metadata"]["uid"] = ""
    assert parse_claim(no_uid, first).declared == 20 * 2**30


def test_the_grace_period_is_read_and_a_malformed_one_never_drops_the_pod() -> None:
    pod = gpu_pod("p", declared="2Gi")
    assert parse_claim(pod).grace == 30.0  # the API's default where it is left out
    pod["spec"]["terminationGracePeriodSeconds"] = 300
    assert parse_claim(pod).grace == 300.0
    # A pod whose claim could not be parsed would be ignored by the watch, and its
    # memory go uncharged: an odd grace period reads as the default instead.
    for odd in ("300", -1, True):
        pod["spec"]["terminationGracePeriodSeconds"] = odd
        assert parse_claim(pod).grace == 30.0


@pytest.mark.parametrize("count", [str(2**64 + 1), "1025"])
def test_a_count_above_the_most_is_charged_as_the_most_and_refused(count: str) -> None:
    # Admitted before the admission policy, or where it is not installed: charged
    # as 1024 replicas (more than kubelet gives it, whatever it reads), never dropped
    # from the accounting, and the filter refuses to place it.
    pod = gpu_pod("wrap", declared="1Gi", node="gpu-a")
    for section in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu.shared"] = count
    claim = parse_claim(pod)
    assert claim.shared == 1024
    assert f"asks for {count} nvidia.com/gpu.shared, above 1024" in claim.problem
    again = parse_claim(pod, claim)  # a watch event of the known pod keeps it
    assert (again.shared, again.problem) == (1024, claim.problem)
    mig = gpu_pod("mig", mig="1g.10gb", node="gpu-a")
    for section in ("limits", "requests"):
        mig["spec"]["containers"][0]["resources"][section]["nvidia.com/mig-1g.10gb"] = count
    assert parse_claim(mig).mig == {"1g.10gb": 1024}
