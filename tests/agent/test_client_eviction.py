"""``PodActions.evict`` against kube-apiserver's answers, from a stand-in HTTP server.

A pod that two PodDisruptionBudgets select cannot be evicted: kube-apiserver's
eviction REST (``pkg/registry/core/pod/storage/eviction.go``, v1.34) refuses it
with a ``Status`` of ``Failure``, code 500, "This pod has more than one
PodDisruptionBudget, which the eviction subresource does not support." A tenant
with ``edit`` may write two budgets over their own pod: that is a refusal, after
which the service deletes the pod, not an error retried for ever. The real
apiserver's answer is checked end to end in ``tests/e2e/test_guard_policy.py``.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.client import PodActions
from tests.agent.standin_api import StandIn, serving, status

MULTI_PDB = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
    "does not support."
)


@pytest.fixture
def server() -> Iterator[StandIn]:
    yield from serving(lambda method, path: (201, status(201, "", "Success")))


def actions(server: StandIn) -> PodActions:
    return PodActions(server.api(), "gpu-node-1", timeout_seconds=5)


def answer(server: StandIn, code: int, body: dict[str, Any]) -> None:
    server.answer = lambda method, path: (code, body)


def test_two_disruption_budgets_are_a_refusal_not_an_error(server: StandIn) -> None:
    answer(server, 500, status(500, MULTI_PDB))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is False
    method, path, body = server.requests[0]
    assert method == "POST"
    assert path == "/api/v1/namespaces/ns/pods/nb/eviction"
    assert body["deleteOptions"]["preconditions"] == {"uid": "uid-1"}


def test_other_server_errors_are_errors(server: StandIn) -> None:
    answer(server, 500, status(500, "etcdserver: request timed out", reason="InternalError"))
    with pytest.raises(ApiException, match="request timed out"):
        actions(server).evict("ns", "nb", "uid-1", 30)


def test_evicted_refused_and_gone(server: StandIn) -> None:
    answer(server, 201, status(201, "", "Success"))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is True
    refusal = "Cannot evict pod as it would violate the pod's disruption budget."
    answer(server, 429, budget_refusal(refusal))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is False
    answer(server, 404, status(404, 'pods "nb" not found', reason="NotFound"))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is True


def budget_refusal(message: str) -> dict[str, Any]:
    """kube-apiserver's 429 for a PodDisruptionBudget (eviction.go): its cause names it."""
    body = status(429, message, reason="TooManyRequests")
    body["details"] = {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget keep-hog "
                "needs 1 healthy pods and has 1 currently",
            }
        ]
    }
    return body


def test_a_throttled_eviction_is_an_error_retried_not_a_refusal(server: StandIn) -> None:
    # API Priority and Fairness (or --max-requests-inflight) answers 429 to any request
    # in a storm, with no DisruptionBudget cause: no budget refused anything, and the
    # pod must not be deleted past budgets that would have let the eviction through.
    throttled = status(429, "Too many requests, please try again later.", reason="TooManyRequests")
    answer(server, 429, throttled)
    with pytest.raises(ApiException):
        actions(server).evict("ns", "nb", "uid-1", 30)
    answer(
        server,
        429,
        budget_refusal("Cannot evict pod as it would violate the pod's disruption budget."),
    )
    assert actions(server).evict("ns", "nb", "uid-1", 30) is False
