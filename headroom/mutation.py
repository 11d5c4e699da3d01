"""The one admission decision: a pod and its namespace's policy in, a patch out.

Used by the webhook, by ``headroom explain`` and by the tests, so that all
three run the same code. Pure: no I/O, no clocks.

The decision builds the pod it wants as a copy, then diffs the two
(:mod:`headroom.patch`). Every rule reads what is already there before it
writes, so the decision applied to its own output yields no operations --
``reinvocationPolicy: IfNeeded`` depends on that.

Declared memory, recorded in ``headroom.dev/declared-memory``, is what the pod
may hold on one GPU in the worst case, where the device plugin hands every
container the same GPU: the effective request Kubernetes computes
(:func:`headroom.podspec.effective_request`) over the containers that got a
shared or MIG GPU -- the app containers and sidecars together, or a plain
init container beside the sidecars started before it, whichever is more.
Containers kept on whole GPUs declare nothing.
"""

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from headroom import names
from headroom.mig import MigOffer
from headroom.patch import diff
from headroom.podspec import PodError, declared_memory, json_type, mapping, string_map
from headroom.policy import GPUSharingPolicy
from headroom.rewrite import Denied, InvalidMemory, Rewrite
from headroom.scheduling import foreign_scheduler

Outcome = Literal["mutated", "unchanged", "skipped", "denied", "dry-run", "no-policy"]

WARNING_LIMIT = 119
"""``kubectl`` prints each warning on its own line; keep them under 120 characters."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    outcome: Outcome
    message: str = ""
    patch: list[dict[str, Any]] = field(default_factory=list)
    """RFC 6902 operations against the pod as it came in."""
    warnings: list[str] = field(default_factory=list)
    """Short lines for ``kubectl`` (each under 120 characters, ASCII)."""
    annotations: dict[str, str] = field(default_factory=dict)
    """The ``headroom.dev/*`` annotations the decision records on the pod."""
    policy: str | None = None
    """Name of the policy that applied, if any (for metrics and logs)."""


def decide(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str],
    policies: Mapping[str, GPUSharingPolicy],
    operation: str = "CREATE",
    offered_mig: MigOffer | None = None,
) -> Decision:
    """Decide what to do with ``pod`` (a plain dict as the apiserver sends it)."""
    if operation != "CREATE":
        return Decision(True, "skipped", f"{ascii_line(operation)} is not mutated")
    policy_name = namespace_labels.get(names.LABEL_POLICY)
    if policy_name is None or not isinstance(policy_name, str):
        return Decision(True, "skipped", "namespace has no headroom.dev/policy label")
    if not isinstance(pod, Mapping):
        return Decision(False, "denied", f"object: expected a Pod, got {json_type(pod)}")
    try:
        return _decide(dict(pod), namespace, policy_name, policies, offered_mig)
    except PodError as err:
        return Decision(False, "denied", ascii_line(str(err), 400), policy=policy_name)
    except RecursionError:
        # Only a hostile object nests this deep; the apiserver's decoder stops far sooner.
        return Decision(False, "denied", "object: nested too deeply", policy=policy_name)


def _decide(
    pod: dict[str, Any],
    namespace: str,
    policy_name: str,
    policies: Mapping[str, GPUSharingPolicy],
    offered_mig: MigOffer | None,
) -> Decision:
    metadata = mapping(pod, "metadata", "metadata")
    skip = string_map(metadata, "labels", "metadata.labels").get(names.LABEL_SKIP) == "true"
    skip_policy = policies.get(policy_name)
    rewrite = Rewrite(_working_copy(pod), offered_mig)
    if skip and skip_policy is not None and skip_policy.spec.allow_skip:
        if _whole_gpus_or_slices(rewrite):
            return Decision(True, "skipped", f"pod is labelled {names.LABEL_SKIP}=true")
        # The tenant sets the label: a pod asking for a shared slot, or declaring
        # memory itself, keeps minMemory and maxMemory (as under invalidMemory: warn).
        rewrite.notes.append(
            f"{names.LABEL_SKIP}=true ignored: the pod asks for {names.GPU_SHARED} or "
            f"declares {names.GPU_MEMORY} itself, so its declaration is checked"
        )
    elif skip and rewrite.requests:
        # The label alone must not opt a GPU pod out of the accounting (issue 7 §2).
        rewrite.notes.append(
            f"{names.LABEL_SKIP}=true ignored: GPUSharingPolicy {policy_name} has no allowSkip"
        )
    if not rewrite.requests and not rewrite.unplaced:
        return Decision(True, "skipped", "pod asks for no GPU")
    policy = policies.get(policy_name)
    if policy is None:
        warning = (
            f"headroom: namespace {namespace} names GPUSharingPolicy {policy_name}, "
            "which does not exist; pod not changed"
            if policy_name
            else f"headroom: namespace {namespace} has an empty {names.LABEL_POLICY} label, "
            "which names no GPUSharingPolicy; pod not changed"
        )
        return Decision(
            True,
            "no-policy",
            "policy not found",
            warnings=[ascii_line(warning)],
            policy=policy_name,
        )
    if policy.spec.mode == "passthrough":
        return Decision(True, "unchanged", "policy mode is passthrough", policy=policy_name)
    dry_run = policy.spec.dry_run
    foreign = foreign_scheduler(mapping(pod, "spec", "spec"), policy)
    if foreign is not None and policy.spec.mode == "shared":
        if policy.spec.foreign_schedulers == "ignore":
            note = f"headroom: schedulerName {foreign}: pod left unchanged, outside Headroom"
            return Decision(True, "unchanged", note, warnings=_lines([note]), policy=policy_name)
        return _refuse(
            f"spec.schedulerName is {foreign}: GPU pods under GPUSharingPolicy {policy_name} "
            f"are scheduled by {policy.spec.scheduler_name} (foreignSchedulers: deny)",
            policy_name,
            dry_run,
        )
    try:
        rewrite.apply(policy)
    except InvalidMemory as err:
        if policy.spec.invalid_memory != "warn":
            return _refuse(str(err), policy_name, dry_run)
        if not _whole_gpus_or_slices(rewrite):
            # Unchanged, a pod that asks for a shared slot or declares memory itself
            # would skip minMemory and maxMemory: one bad annotation would lift them.
            return _refuse(
                f"{err} (invalidMemory: warn passes unchanged only pods asking for whole "
                f"GPUs or MIG slices; this one asks for {names.GPU_SHARED} or declares "
                f"{names.GPU_MEMORY} itself, so its declaration must be checked)",
                policy_name,
                dry_run,
            )
        warning = f"headroom: {err}; pod not changed (invalidMemory: warn)"
        return Decision(True, "unchanged", str(err), warnings=_lines([warning]), policy=policy_name)
    except Denied as err:
        return _refuse(str(err), policy_name, dry_run)
    patch = diff(pod, rewrite.pod)
    notes = [f"headroom: {note}" for note in rewrite.notes]
    if not patch:
        return Decision(
            True,
            "unchanged",
            "nothing to change",
            warnings=_lines(notes),
            annotations=rewrite.annotations,
            policy=policy_name,
        )
    summary = f"GPUSharingPolicy {policy_name}: mode {rewrite.annotations[names.ANNOTATION_MODE]}"
    if names.ANNOTATION_DECLARED_MEMORY in rewrite.annotations:
        summary += f", {rewrite.annotations[names.ANNOTATION_DECLARED_MEMORY]} GPU memory declared"
    changes = [summary, *rewrite.changes]
    if dry_run:
        lines = [f"headroom dry-run: would apply: {change}" for change in changes]
        return Decision(
            True,
            "dry-run",
            f"dry run: {len(patch)} operations not applied",
            warnings=_lines(lines + notes),
            annotations=rewrite.annotations,
            policy=policy_name,
        )
    return Decision(
        True,
        "mutated",
        f"rewritten by GPUSharingPolicy {policy_name}",
        patch=patch,
        warnings=_lines([f"headroom: {change}" for change in changes] + notes),
        annotations=rewrite.annotations,
        policy=policy_name,
    )


def _whole_gpus_or_slices(rewrite: Rewrite) -> bool:
    """The pod asks only for whole GPUs or MIG slices, none shared, and declares no memory."""
    if rewrite.unplaced:
        return False
    for request in rewrite.requests:
        if names.is_time_sliced(request.resource) or declared_memory(request.container) is not None:
            return False
    return True


def _working_copy(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy the rewrite may change: ``metadata`` and ``spec`` deep, the rest shared.

    The rewrite touches only those two; ``status`` and ``managedFields`` stay the
    very same objects, so the diff skips them by identity. This halves the
    cost of a decision on a real apiserver pod.
    """
    working = dict(pod)
    for key in ("metadata", "spec"):
        value = pod.get(key)
        if isinstance(value, dict):
            shared = value.get("managedFields")
            # A pickle round trip copies plain JSON data ~3x faster than deepcopy;
            # the bytes never leave this function.
            working[key] = pickle.loads(
                pickle.dumps({k: v for k, v in value.items() if k != "managedFields"}, -1)
            )
            if shared is not None:
                working[key]["managedFields"] = shared
    return working


def _refuse(message: str, policy_name: str, dry_run: bool) -> Decision:
    if dry_run:
        warning = f"headroom dry-run: would deny: {message}"
        return Decision(True, "dry-run", message, warnings=_lines([warning]), policy=policy_name)
    return Decision(False, "denied", ascii_line(message, 400), policy=policy_name)


def _lines(texts: list[str]) -> list[str]:
    return [ascii_line(text) for text in texts]


def ascii_line(text: str, limit: int = WARNING_LIMIT) -> str:
    """One printable ASCII line of at most ``limit`` characters."""
    if text.isascii() and text.isprintable():
        clean = text
    else:
        clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."
