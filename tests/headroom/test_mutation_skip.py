"""The skip label opts whole-GPU and MIG pods out (allowSkip), never a declaration.

The tenant sets the label: a pod that asks for ``nvidia.com/gpu.shared`` itself, or
declares ``headroom.dev/gpu-memory``, keeps minMemory and maxMemory, as under
``invalidMemory: warn`` (test_mutation_memory.py).
"""

import pytest

from tests.headroom.pods import gpu_pod, make_policy, run

POLICY = make_policy(
    "skippable", defaultMemory="4Gi", minMemory="1Gi", maxMemory="20Gi", allowSkip=True
)
SKIP = {"headroom.dev/skip": "true"}


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "1"},  # below minMemory
        {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "64Gi"},  # above maxMemory
    ],
    ids=["below-minMemory", "above-maxMemory"],
)
def test_skip_label_does_not_lift_the_declaration_limits(limits: dict[str, str]) -> None:
    without = run(gpu_pod(limits), POLICY)
    assert (without.allowed, without.outcome) == (False, "denied")  # the policy's own rule
    decision = run(gpu_pod(limits, labels=SKIP), POLICY)
    assert (decision.allowed, decision.outcome) == (False, "denied"), (
        f"skip label let a shared pod through unchecked: {decision.outcome}: {decision.message}"
    )


def test_skip_label_still_opts_a_whole_gpu_pod_out() -> None:
    # What allowSkip is for keeps working (a guard for the fix, passes today).
    decision = run(gpu_pod({"nvidia.com/gpu": "1"}, labels=SKIP), POLICY)
    assert (decision.allowed, decision.outcome, decision.patch) == (True, "skipped", [])
