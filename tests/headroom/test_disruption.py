"""PodDisruptionBudgets as kube-scheduler's preemption counts them (issue 7 §4)."""

import pytest

from headroom.disruption import Evictee, parse_budget, protected, violations
from headroom.podspec import PodError


def budget(allowed: int, selector: dict[str, object] | None, **status: object) -> dict[str, object]:
    return {
        "metadata": {"name": "keep", "namespace": "ml"},
        "spec": {"selector": selector} if selector is not None else {},
        "status": {"disruptionsAllowed": allowed, **status},
    }


def pod(name: str, **labels: str) -> Evictee:
    return Evictee(uid=f"uid-{name}", namespace="ml", name=name, labels=labels)


def test_a_budget_with_nothing_left_protects_the_pods_it_selects() -> None:
    keep = parse_budget(budget(0, {"matchLabels": {"app": "keep"}}))
    assert protected(pod("a", app="keep"), [keep])
    assert not protected(pod("b", app="other"), [keep])
    assert not protected(Evictee("u", "other-ns", "a", {"app": "keep"}), [keep])
    assert not protected(pod("unlabelled"), [keep])  # kube-scheduler: no labels, no budget


def test_violations_spend_the_budget_in_order_and_skip_disrupted_pods() -> None:
    one = parse_budget(
        budget(1, {"matchLabels": {"app": "x"}}, disruptedPods={"c": "2025-01-01T00:00:00Z"})
    )
    victims = [pod("a", app="x"), pod("b", app="x"), pod("c", app="x")]
    assert not protected(victims[0], [one])
    assert violations(victims, [one]) == 1  # a spends the one allowed, b violates, c is disrupted


def test_match_expressions_and_empty_selectors() -> None:
    expr = parse_budget(
        budget(
            0,
            {
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["gpu"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                ]
            },
        )
    )
    assert protected(pod("a", tier="gpu"), [expr])
    assert not protected(pod("b", tier="gpu", canary="1"), [expr])
    assert not protected(pod("c", tier="cpu"), [expr])
    empty = parse_budget(budget(0, {}))
    assert not protected(pod("d", app="x"), [empty])  # an empty selector selects nothing
    missing = parse_budget(budget(0, None))
    assert not protected(pod("e", app="x"), [missing])


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (budget(0, {"matchLabels": {"app": 3}}), "spec.selector.matchLabels"),
        (budget(0, {"matchExpressions": [{"operator": "In"}]}), "matchExpressions[0].key"),
        (
            budget(0, {"matchExpressions": [{"key": "a", "values": "x"}]}),
            "matchExpressions[0].values",
        ),
        (budget("many", {"matchLabels": {"a": "b"}}), "status.disruptionsAllowed"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_budget_names_the_field(obj: dict[str, object], field: str) -> None:
    with pytest.raises(PodError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_budget(obj)
