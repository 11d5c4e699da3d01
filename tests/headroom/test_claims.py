"""What a pod claims: shared replicas, MIG slices, declared memory, placement."""

import pytest

from headroom.claims import parse_claim
from headroom.podspec import PodError
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
