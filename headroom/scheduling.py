"""Where a rewritten pod may run: tolerations, nodeSelector and schedulerName.

:class:`headroom.rewrite.Rewrite` calls :func:`schedule` once per pod. Like
every rewrite rule it looks before it writes, so running it on its own output
changes nothing. What it rewrote goes to ``changes``, what it deliberately
left alone goes to ``notes``.
"""

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from headroom import names
from headroom.podspec import PodError, json_type, mapping, sequence, shown, string_map
from headroom.policy import GPUSharingPolicy


class SelectorConflict(Exception):
    """The pod's nodeSelector contradicts the policy's, and the policy says deny."""


def schedule(
    pod_spec: dict[str, Any],
    policy: GPUSharingPolicy,
    foreign: AbstractSet[str],
    *,
    changes: list[str],
    notes: list[str],
) -> None:
    """Tolerations, nodeSelector and schedulerName from the policy.

    The policy's nodeSelector picks nodes for its own mode (time-sliced
    nodes for ``shared``); a pod that also asks for another kind of GPU
    (a MIG slice in a shared namespace), named in ``foreign``, would be
    unschedulable with it, so it is left out for such pods, with a note.
    """
    spec = policy.spec
    tolerations = list(sequence(pod_spec, "tolerations", "spec.tolerations"))
    for index, toleration in enumerate(tolerations):
        if not isinstance(toleration, dict):
            raise PodError(
                f"spec.tolerations[{index}]: expected an object, got {json_type(toleration)}"
            )
    added = False
    for wanted in spec.tolerations:
        body = wanted.as_pod_toleration()
        if not any(_same_toleration(body, have) for have in tolerations):
            tolerations.append(body)
            added = True
            changes.append(f"added toleration {_toleration_text(body)}")
    if added:
        pod_spec["tolerations"] = tolerations
    if not foreign:
        _node_selector(pod_spec, policy, changes=changes, notes=notes)
    elif spec.node_selector:
        notes.append(
            f"policy {policy.name} nodeSelector not added: it selects {spec.mode} "
            f"nodes and the pod asks for {', '.join(sorted(foreign))} GPUs"
        )
    current = pod_spec.get("schedulerName")
    if current is not None and not isinstance(current, str):
        raise PodError(f"spec.schedulerName: expected a string, got {json_type(current)}")
    if current in (None, "", names.DEFAULT_SCHEDULER):
        if spec.scheduler_name != (current or names.DEFAULT_SCHEDULER):
            pod_spec["schedulerName"] = spec.scheduler_name
            changes.append(f"schedulerName set to {spec.scheduler_name}")
    elif current != spec.scheduler_name:
        notes.append(
            f"kept schedulerName {current}; policy {policy.name} uses {spec.scheduler_name}"
        )


def foreign_scheduler(pod_spec: Mapping[str, Any], policy: GPUSharingPolicy) -> str | None:
    """The pod's schedulerName when it belongs to another scheduler, else None.

    Neither the default scheduler (replaced by the policy's) nor the policy's
    own: kai-scheduler, volcano... Such a pod would skip the extender's per-GPU
    memory fit, so the policy's ``foreignSchedulers`` decides (deny, or leave
    the pod alone as outside Headroom).
    """
    current = pod_spec.get("schedulerName")
    if current is not None and not isinstance(current, str):
        raise PodError(f"spec.schedulerName: expected a string, got {json_type(current)}")
    if current in (None, "", names.DEFAULT_SCHEDULER, policy.spec.scheduler_name):
        return None
    return current


def _node_selector(
    pod_spec: dict[str, Any],
    policy: GPUSharingPolicy,
    *,
    changes: list[str],
    notes: list[str],
) -> None:
    selector = dict(string_map(pod_spec, "nodeSelector", "spec.nodeSelector"))
    terms = _required_terms(pod_spec)
    changed = False
    for key, value in policy.spec.node_selector.items():
        have = selector.get(key)
        if have is None and terms and not any(_term_admits(term, key, value) for term in terms):
            # Added beside a required node affinity that excludes it, the selector
            # would leave the pod Pending on every node, with nothing said.
            if policy.spec.node_selector_conflict == "deny":
                raise SelectorConflict(
                    f"{_REQUIRED} admits no node labelled {key}={value}, which policy "
                    f"{policy.name} selects (nodeSelectorConflict: deny)"
                )
            notes.append(
                f"kept required node affinity on {key}; policy {policy.name} wants {value}"
            )
        elif have is None:
            selector[key] = value
            changed = True
            changes.append(f"added nodeSelector {key}={value}")
        elif have != value and policy.spec.node_selector_conflict == "deny":
            raise SelectorConflict(
                f"spec.nodeSelector {key}={shown(have)} conflicts with policy {policy.name}, "
                f"which sets {key}={value} (nodeSelectorConflict: deny)"
            )
        elif have != value:
            notes.append(
                f"kept nodeSelector {key}={shown(have)}; policy {policy.name} wants {value}"
            )
    if changed:
        pod_spec["nodeSelector"] = selector


_REQUIRED = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _required_terms(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's required nodeSelectorTerms (ORed); empty when it requires none."""
    affinity = mapping(pod_spec, "affinity", "spec.affinity")
    node = mapping(affinity, "nodeAffinity", "spec.affinity.nodeAffinity")
    required = mapping(node, "requiredDuringSchedulingIgnoredDuringExecution", _REQUIRED)
    where = f"{_REQUIRED}.nodeSelectorTerms"
    terms = sequence(required, "nodeSelectorTerms", where)
    for index, term in enumerate(terms):
        if not isinstance(term, dict):
            raise PodError(f"{where}[{index}]: expected an object, got {json_type(term)}")
        for index2, expression in enumerate(
            sequence(term, "matchExpressions", f"{where}[{index}].matchExpressions")
        ):
            at = f"{where}[{index}].matchExpressions[{index2}]"
            if not isinstance(expression, dict):
                raise PodError(f"{at}: expected an object, got {json_type(expression)}")
            for index3, item in enumerate(sequence(expression, "values", f"{at}.values")):
                if not isinstance(item, str):
                    raise PodError(
                        f"{at}.values[{index3}]: expected a string, got {json_type(item)}"
                    )
    return terms


def _term_admits(term: Mapping[str, Any], key: str, value: str) -> bool:
    """Whether a node labelled ``key=value`` may satisfy ``term``, as far as ``key`` goes
    (kube-scheduler's nodeaffinity: the expressions of one term are ANDed)."""
    for expression in term.get("matchExpressions") or []:
        if expression.get("key") != key:
            continue
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and value not in values:
            return False
        if operator == "NotIn" and value in values:
            return False
        if operator == "DoesNotExist":
            return False
        if operator in ("Gt", "Lt"):
            try:
                have, bound = int(value), int(values[0])
            except (ValueError, TypeError, IndexError):
                return False
            if (have <= bound) if operator == "Gt" else (have >= bound):
                return False
    return True


# The API server's defaults: a toleration that omits them is the same toleration.
_TOLERATION_DEFAULTS = {"key": "", "operator": "Equal", "value": "", "effect": ""}


def _same_toleration(left: Mapping[str, Any], right: Mapping[str, Any]) -> bool:
    def norm(toleration: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **_TOLERATION_DEFAULTS,
            **{k: v for k, v in toleration.items() if v is not None},
        }

    return norm(left) == norm(right)


def _toleration_text(toleration: Mapping[str, Any]) -> str:
    key = toleration.get("key") or "*"
    value = f"={toleration['value']}" if toleration.get("value") else ""
    effect = f":{toleration['effect']}" if toleration.get("effect") else ""
    return f"{key}{value}{effect}"
