"""The run-time guard: a pod holding more GPU memory than it declared.

Declared memory (the pod's ``headroom.dev/gpu-memory`` resource, written by the
webhook and immutable; never an annotation a tenant could patch) is per GPU,
so the guard compares it with the pod's largest usage on any one GPU or MIG
device. A pod must be over for ``grace`` consecutive observations before
anything happens, so one spike between two ticks is ignored. Then, once per
episode (an episode ends when the pod is back within its declaration):

- a Warning Event ``GPUMemoryOverDeclared`` on the pod, unless the policy's
  ``guard`` is ``off``;
- under ``guard: evict``, an eviction through the Eviction API, which honours
  PodDisruptionBudgets; a refused eviction is retried on later ticks.

The policy is the one the pod's namespace names in its ``headroom.dev/policy``
label, as the webhook chose it at admission. Never the pod's
``headroom.dev/policy`` annotation: any tenant with the ``edit`` role may patch
that after admission, and switching ``evict`` to a policy with ``guard: off``
would switch the guard off (issue 7). Namespaces are cluster-scoped, and
``edit`` cannot label them. The annotation is not even allowed to make the
guard stricter: it carries no word of the admin's, and a namespace relabelled
to a laxer policy applies to the pods already running there.

A namespace without the label, or naming a policy that is gone or invalid, is
treated as ``warn``: the guard never evicts without a policy that says so. A
namespace the agent has not seen yet (its informer has not listed) defers the
verdict, since ``warn`` there could be weaker than the namespace's ``evict``;
the over-streak keeps counting meanwhile. This module decides; the service acts.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headroom import names
from headroom.claims import parse_claim
from headroom.podspec import PodError
from headroom.policy import GPUSharingPolicy
from headroom.quantity import human_bytes
from headroom.reports import ReportStatus

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
Namespace = Mapping[str, Any]
GuardAction = Literal["off", "warn", "evict"]
DEFAULT_ACTION: GuardAction = "warn"


@dataclass(frozen=True)
class Verdict:
    kind: Literal["event", "evict"]
    namespace: str
    name: str
    uid: str
    message: str


@dataclass
class _Episode:
    streak: int = 0
    warned: bool = False
    evicted: bool = False


def guard_action(
    pod: Pod,
    policies: Mapping[str, GPUSharingPolicy],
    namespaces: Mapping[str, Namespace],
) -> GuardAction | None:
    """The ``guard`` of the policy the pod's namespace is labelled with; None while
    that namespace is unknown. ``namespaces`` is keyed by name."""
    namespace = namespaces.get(str((pod.get("metadata") or {}).get("namespace") or ""))
    if namespace is None:
        return None
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    policy = policies.get(str(labels.get(names.LABEL_POLICY) or ""))
    return policy.spec.guard if policy is not None else DEFAULT_ACTION


def declared_bytes(pod: Pod) -> int | None:
    """The pod's declared memory per GPU, read as the extender reads it (headroom.claims)."""
    try:
        return parse_claim(pod).declared
    except PodError:
        return None  # the apiserver validated the pod's resources; a bad shape is not ours


def peak_usage(status: ReportStatus) -> dict[str, tuple[int, str]]:
    """Per pod UID: its largest usage on one device, and where that is."""
    peaks: dict[str, tuple[int, str]] = {}
    for gpu in status.gpus:
        where = f"gpu {gpu.index} ({gpu.product})" if gpu.product else f"gpu {gpu.index}"
        places = [(where, gpu.pods)]
        places += [(f"{where} MIG {d.profile or d.uuid}", d.pods) for d in gpu.mig_devices]
        for place, pods in places:
            for pod in pods:
                if pod.used_bytes > peaks.get(pod.uid, (-1, ""))[0]:
                    peaks[pod.uid] = (pod.used_bytes, place)
    return peaks


class Guard:
    def __init__(self, grace: int = 2) -> None:
        if grace < 1:
            raise ValueError("grace must be at least 1 observation")
        self.grace = grace
        self._episodes: dict[str, _Episode] = {}

    def observe(
        self,
        status: ReportStatus,
        pods: Mapping[str, Pod],
        policies: Mapping[str, GPUSharingPolicy],
        namespaces: Mapping[str, Namespace],
    ) -> list[Verdict]:
        """What to do after one observation; ``pods`` is keyed by UID, ``namespaces`` by name."""
        peaks = peak_usage(status)
        verdicts: list[Verdict] = []
        for uid in list(self._episodes):
            if uid not in pods or uid not in peaks:
                del self._episodes[uid]  # gone, or holds no GPU memory now: not over
        for uid, (used, where) in sorted(peaks.items()):
            pod = pods.get(uid)
            declared = declared_bytes(pod) if pod is not None else None
            if pod is None or declared is None:
                continue
            episode = self._episodes.setdefault(uid, _Episode())
            if used <= declared:
                self._episodes[uid] = _Episode()  # back within bounds: the episode is over
                continue
            episode.streak += 1
            action = guard_action(pod, policies, namespaces)
            if episode.streak < self.grace or action is None:
                continue
            verdicts += self._act(episode, pod, action, used, declared, where)
        return verdicts

    def event_failed(self, uid: str) -> None:
        """The Event could not be recorded: warn again on the next observation."""
        if uid in self._episodes:
            self._episodes[uid].warned = False

    def eviction_refused(self, uid: str) -> None:
        """The API refused the eviction (a PodDisruptionBudget): try again next time."""
        if uid in self._episodes:
            self._episodes[uid].evicted = False

    def _act(
        self,
        episode: _Episode,
        pod: Pod,
        action: GuardAction,
        used: int,
        declared: int,
        where: str,
    ) -> list[Verdict]:
        if action == "off":
            return []
        metadata = pod.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        uid = str(metadata.get("uid", ""))
        verdicts = []
        if not episode.warned:
            episode.warned = True
            message = (
                f"uses {human_bytes(used)} of GPU memory on {where}, above its declared "
                f"{human_bytes(declared)} ({names.GPU_MEMORY})"
            )
            if action == "evict":
                message += "; policy guard is evict: evicting"
            verdicts.append(Verdict("event", namespace, name, uid, message))
        terminating = bool(metadata.get("deletionTimestamp"))
        if action == "evict" and not episode.evicted and not terminating:
            episode.evicted = True
            message = f"GPU memory {human_bytes(used)} above declared {human_bytes(declared)}"
            verdicts.append(Verdict("evict", namespace, name, uid, message))
        return verdicts
