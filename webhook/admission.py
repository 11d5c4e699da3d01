"""One admission request in, one response out, with no I/O.

The decision itself is :func:`headroom.mutation.decide`; this module checks
that the request is one Headroom handles (a pod), feeds ``decide`` from the
cluster view the caller passes, and turns the :class:`Decision` into the
AdmissionResponse the apiserver expects.

``request.dryRun`` needs nothing special: Headroom has no side effects, so a
dry-run request gets exactly the answer a real one would.
"""

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from headroom import mutation
from headroom.mig import MigOffer
from headroom.mutation import Decision
from headroom.policy import GPUSharingPolicy
from webhook.review import AdmissionRequest, AdmissionResponse, Verdict

DENIED_CODE = 403
"""What the apiserver itself reports for an admission denial (Forbidden)."""

Decide = Callable[..., Decision]
"""The signature of :func:`headroom.mutation.decide`."""


class PolicySource(Protocol):
    """What admission reads from the cluster, already parsed (see webhook.cache)."""

    @property
    def policies(self) -> Mapping[str, GPUSharingPolicy]: ...

    @property
    def invalid_policies(self) -> Mapping[str, str]:
        """Policy name -> why its object was rejected."""
        ...

    def mig_offer(self) -> MigOffer | None: ...


class Admission:
    def __init__(self, source: PolicySource, decide: Decide = mutation.decide) -> None:
        self._source = source
        self._decide = decide

    def review(self, request: AdmissionRequest, namespace_labels: Mapping[str, str]) -> Verdict:
        return self.review_with(request, namespace_labels, self._source.mig_offer())

    def review_with(
        self,
        request: AdmissionRequest,
        namespace_labels: Mapping[str, str],
        offered_mig: MigOffer | None,
    ) -> Verdict:
        """:meth:`review` with the MIG offer read by the caller: on the event loop, for
        a pod decided on a worker thread while node events change the source."""
        uid = request.uid
        if request.operation == "CREATE":
            problem = _not_a_pod_create(request)
            if problem:
                return Verdict(AdmissionResponse.deny(uid, 400, problem), "bad-request")
        pod: Mapping[str, Any] = request.object if request.object is not None else {}
        decision = self._decide(
            pod,
            namespace=request.namespace,
            namespace_labels=namespace_labels,
            policies=self._source.policies,
            operation=request.operation,
            offered_mig=offered_mig,
        )
        return self._respond(uid, decision)

    def _respond(self, uid: str, decision: Decision) -> Verdict:
        policy = decision.policy or ""
        warnings = list(decision.warnings)
        outcome: str = decision.outcome
        problem = self._source.invalid_policies.get(policy) if policy else None
        if decision.outcome == "no-policy" and problem is not None:
            # decide() only knows the policy is missing; say why it is missing.
            outcome = "invalid-policy"
            warnings = [
                mutation.ascii_line(
                    f"headroom: GPUSharingPolicy {policy} is invalid, pod not changed: {problem}"
                )
            ]
        if decision.allowed:
            response = AdmissionResponse.allow(uid, decision.patch, warnings)
        else:
            message = decision.message or "denied by headroom"
            response = AdmissionResponse.deny(uid, DENIED_CODE, message, warnings)
        return Verdict(response, outcome, policy)


def _not_a_pod_create(request: AdmissionRequest) -> str:
    """Why this CREATE is not one Headroom may answer, or ""."""
    if not request.is_pod():
        resource = request.resource
        what = "/".join(p for p in (resource.group, resource.version, resource.resource) if p)
        if request.sub_resource:
            what += f" subresource {request.sub_resource}"
        return (
            f"headroom webhook mutates pods only, got {what or 'no resource'} "
            f"(kind {request.kind.kind or 'unset'}); check the webhook configuration's rules"
        )
    if not request.namespace:
        return "request.namespace: empty; a pod is always namespaced"
    if request.object is None:
        return "request.object: missing; a CREATE carries the pod"
    return ""
