"""The webhook's annotations never take a pod past Kubernetes' annotation size limit.

kube-apiserver refuses a pod whose annotations, keys and values together, take
more than 262144 bytes (``ValidateAnnotationsSize``, apimachinery
``pkg/api/validation/objectmeta.go``), and it checks after mutating admission:
a pod just under the limit, through the webhook's explanations, was refused
with ``metadata.annotations: Too long: may not be more than 262144 bytes``, a
limit its author had not passed. The webhook now refuses it itself, naming the
field and how far over it would be.
"""

from typing import Any

from tests.headroom.pods import gpu_pod, make_policy, patched, run

LIMIT = 262144


def annotation_bytes(annotations: dict[str, str]) -> int:
    """As the apiserver counts: UTF-8 bytes of every key and value."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


def padded(size: int, key: str = "example.com/notes") -> dict[str, Any]:
    """A shared-GPU pod whose own annotations take ``size`` bytes."""
    pod = gpu_pod({"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {
        key: "é" * ((size - len(key)) // 2) + "x" * ((size - len(key)) % 2)
    }
    assert annotation_bytes(pod["metadata"]["annotations"]) == size
    return pod


def added_bytes() -> int:
    """What the webhook's annotations take on a small pod."""
    pod = gpu_pod({"nvidia.com/gpu": 1})
    decision = run(pod)
    assert decision.outcome == "mutated"
    return annotation_bytes(patched(pod, decision)["metadata"]["annotations"])


def test_a_pod_the_annotations_still_fit_is_mutated_to_the_byte() -> None:
    pod = padded(LIMIT - added_bytes())
    decision = run(pod)
    assert decision.outcome == "mutated"
    assert annotation_bytes(patched(pod, decision)["metadata"]["annotations"]) == LIMIT


def test_one_byte_more_is_denied_naming_the_field() -> None:
    pod = padded(LIMIT - added_bytes() + 1)
    decision = run(pod)
    assert not decision.allowed
    assert decision.outcome == "denied"
    assert decision.patch == []
    assert "metadata.annotations" in decision.message
    assert f"take {LIMIT - added_bytes() + 1} bytes" in decision.message  # the pod's own
    assert "262145 bytes" in decision.message
    assert "262144" in decision.message


def test_a_pod_already_over_is_denied_too() -> None:
    decision = run(padded(LIMIT + 10))
    assert not decision.allowed
    assert "metadata.annotations" in decision.message


def test_a_dry_run_warns_and_admits_unchanged() -> None:
    policy = make_policy("dry", defaultMemory="4Gi", dryRun=True)
    decision = run(padded(LIMIT - 10), policy)
    assert decision.allowed
    assert decision.patch == []
    assert any("would deny" in w and "metadata.annotations" in w for w in decision.warnings)


def test_an_annotation_the_webhook_overwrites_counts_once() -> None:
    """A tenant's own headroom.dev/mode is replaced, not added to: its long value plus
    the webhook's annotations would pass the limit, the replaced pod's do not."""
    pod = padded(LIMIT - added_bytes() + 100, key="headroom.dev/mode")
    decision = run(pod)
    assert decision.outcome == "mutated", decision.message
    assert annotation_bytes(patched(pod, decision)["metadata"]["annotations"]) <= LIMIT


def test_a_denial_counts_what_the_pod_held_before_an_overwritten_annotation() -> None:
    pod = gpu_pod({"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {
        "headroom.dev/mode": "m" * 1000,  # replaced by the webhook's "shared"
        "example.com/notes": "x" * (LIMIT - 100),  # over even once it is replaced
    }
    own = annotation_bytes(pod["metadata"]["annotations"])
    decision = run(pod)
    assert not decision.allowed
    assert f"take {own} bytes" in decision.message


def test_a_lone_surrogate_never_raises() -> None:
    pod = gpu_pod({"nvidia.com/gpu": 1})
    pod["metadata"]["annotations"] = {"example.com/x": "\ud800"}
    assert run(pod).outcome == "mutated"
