"""Which pods a PodDisruptionBudget protects right now, as kube-scheduler's preemption judges it.

kube-scheduler prefers victims whose eviction violates no PodDisruptionBudget
and counts the violations of the set it picks (``filterPodsWithPDBViolation``
in pkg/scheduler/framework/preemption/preemption.go): a PDB in the pod's
namespace whose non-empty selector matches the pod's labels, with
``status.disruptionsAllowed`` used up by the victims before it, is violated;
a pod already in ``status.disruptedPods`` is being disrupted anyway and costs
nothing. The extender's ``preempt`` verb replaces kube-scheduler's victims, so it
must count the same way (extender.preemption). Plain data in, plain data out.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headroom.podspec import PodError, mapping, string_map


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        return False  # unknown operator: matches nothing, as the apiserver would reject it


@dataclass(frozen=True)
class Budget:
    """One PodDisruptionBudget, reduced to what preemption reads."""

    namespace: str
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()
    allowed: int = 0
    """``status.disruptionsAllowed``."""
    disrupted: frozenset[str] = frozenset()
    """Names in ``status.disruptedPods``: being evicted already."""
    selects_nothing: bool = False
    """A null or empty selector: kube-scheduler treats it as matching no pod."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        # kube-scheduler: a pod with no labels matches no budget.
        if self.selects_nothing or namespace != self.namespace or not labels:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(r.matches(labels) for r in self.expressions)


def parse_budget(obj: Mapping[str, Any]) -> Budget:
    """A PodDisruptionBudget (JSON dict); raises PodError naming a malformed field."""
    metadata = mapping(obj, "metadata", "metadata")
    spec = mapping(obj, "spec", "spec")
    status = mapping(obj, "status", "status")
    selector = spec.get("selector")
    if selector is None:
        selector = {}
    if not isinstance(selector, Mapping):
        raise PodError("spec.selector: expected an object")
    match_labels = string_map(selector, "matchLabels", "spec.selector.matchLabels")
    expressions = []
    raw = selector.get("matchExpressions") or []
    if not isinstance(raw, list):
        raise PodError("spec.selector.matchExpressions: expected a list")
    for i, item in enumerate(raw):
        where = f"spec.selector.matchExpressions[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
            raise PodError(f"{where}.key: expected a string")
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise PodError(f"{where}.values: expected a list of strings")
        expressions.append(
            Requirement(item["key"], str(item.get("operator", "")), frozenset(values))
        )
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int):
        raise PodError("status.disruptionsAllowed: expected an integer")
    disrupted = status.get("disruptedPods") or {}
    if not isinstance(disrupted, Mapping):
        raise PodError("status.disruptedPods: expected an object")
    name = metadata.get("name")
    namespace = metadata.get("namespace")
    return Budget(
        namespace=namespace if isinstance(namespace, str) else "",
        name=name if isinstance(name, str) else "",
        match_labels=match_labels,
        expressions=tuple(expressions),
        allowed=allowed,
        disrupted=frozenset(str(k) for k in disrupted),
        selects_nothing=not match_labels and not expressions,
    )


@dataclass(frozen=True)
class Evictee:
    """A pod as the PDB count sees it."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def protected(pod: Evictee, budgets: Iterable[Budget]) -> bool:
    """Whether evicting ``pod`` alone would violate a budget now."""
    return any(
        b.allowed <= 0 and pod.name not in b.disrupted
        for b in budgets
        if b.selects(pod.namespace, pod.labels)
    )


def violations(victims: Sequence[Evictee], budgets: Sequence[Budget]) -> int:
    """How many of ``victims``, evicted in this order, violate a budget (kube-scheduler's count)."""
    left = {b.key: b.allowed for b in budgets}
    count = 0
    for pod in victims:
        violated = False
        for budget in budgets:
            if not budget.selects(pod.namespace, pod.labels) or pod.name in budget.disrupted:
                continue
            left[budget.key] -= 1
            if left[budget.key] < 0:
                violated = True
        count += violated
    return count
