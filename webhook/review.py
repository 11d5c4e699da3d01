"""AdmissionReview ``admission.k8s.io/v1``: the wire types, named as upstream.

Only the fields Headroom reads are typed; everything else the apiserver sends
(``userInfo``, ``options``, ``oldObject``...) is kept on the object as an extra,
unparsed, so that validation costs little and nothing is lost. The pod itself
stays a plain dict: :func:`headroom.mutation.decide` reads it defensively.
"""

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class _Wire(BaseModel):
    # strict: a JSON "true" string is not a boolean, a number is not a uid.
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Wire):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Wire):
    username: str = ""
    extra: dict[str, list[str] | None] = Field(default_factory=dict)
    """Token claims such as ``authentication.kubernetes.io/node-name``; a value is null
    where the authenticator gave the key a nil slice."""


class AdmissionRequest(_Wire):
    uid: str = Field(min_length=1, max_length=128)
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str = Field(default="", alias="subResource")
    name: str = ""
    """Empty for a pod created from ``generateName`` (every Deployment's pod)."""
    namespace: str = ""
    """Always set for a namespaced object, even when ``object.metadata.namespace`` is not."""
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    object: dict[str, Any] | None = None
    dry_run: bool = Field(default=False, alias="dryRun")
    user_info: UserInfo = Field(default_factory=UserInfo, alias="userInfo")
    _body_bytes: int = PrivateAttr(default=0)

    @property
    def body_bytes(self) -> int:
        """Size of the AdmissionReview it came in (0 when not parsed from one)."""
        return self._body_bytes

    def is_pod(self) -> bool:
        return (
            self.resource.group == ""
            and self.resource.version == "v1"
            and self.resource.resource == "pods"
            and not self.sub_resource
            and self.kind.kind == "Pod"
        )


class Status(BaseModel):
    """The part of ``meta/v1`` Status a denial carries."""

    code: int
    message: str
    reason: str | None = None


class AdmissionResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    uid: str
    allowed: bool
    status: Status | None = None
    patch: str | None = None
    """Base64 of the JSON array of RFC 6902 operations."""
    patch_type: Literal["JSONPatch"] | None = Field(default=None, alias="patchType")
    warnings: list[str] | None = None

    @classmethod
    def allow(
        cls, uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
    ) -> "AdmissionResponse":
        """Allowed; ``patchType`` only together with a non-empty patch (the apiserver
        rejects one without the other)."""
        encoded = encode_patch(patch) if patch else None
        return cls(
            uid=uid,
            allowed=True,
            patch=encoded,
            patch_type="JSONPatch" if encoded else None,
            warnings=capped_warnings(warnings),
        )

    @classmethod
    def deny(
        cls, uid: str, code: int, message: str, warnings: list[str] | None = None
    ) -> "AdmissionResponse":
        reason = {
            400: "BadRequest",
            403: "Forbidden",
            429: "TooManyRequests",
            503: "ServiceUnavailable",
        }.get(code, "InternalError")
        return cls(
            uid=uid,
            allowed=False,
            status=Status(code=code, message=message, reason=reason),
            warnings=capped_warnings(warnings),
        )


MAX_WARNINGS = 24
"""decide() writes a line or two per container: 13,004 for a 6,500-container
pod, a 5 MiB response. kube-apiserver passes on only the first few KiB of a
response's warnings, so past this many lines one says how many more there were."""


def capped_warnings(warnings: list[str] | None) -> list[str] | None:
    if not warnings:
        return None
    if len(warnings) <= MAX_WARNINGS:
        return warnings
    more = len(warnings) - MAX_WARNINGS + 1
    return [*warnings[: MAX_WARNINGS - 1], f"headroom: and {more} more warnings like these"]


class AdmissionReview(_Wire):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None


def encode_patch(operations: list[dict[str, Any]]) -> str:
    # ASCII-escaped: a lone surrogate a client smuggled into a string must not
    # make encoding fail.
    text = json.dumps(operations, separators=(",", ":"))
    return base64.b64encode(text.encode("ascii")).decode("ascii")


def response_body(response: AdmissionResponse) -> bytes:
    """The AdmissionReview the apiserver expects back, as bytes on the wire."""
    envelope = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": response.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    return json.dumps(envelope, separators=(",", ":")).encode()


class ReviewError(ValueError):
    """A body that is not an AdmissionReview v1 request; the message names the field.

    ``uid`` is set when the request's uid could be read, so the caller can answer
    with a denial the apiserver shows to the user instead of a bare HTTP 400.
    """

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


def parse_request(body: bytes) -> AdmissionRequest:
    """The ``request`` of an AdmissionReview v1 body, or :class:`ReviewError`."""
    try:
        review = AdmissionReview.model_validate_json(body)
    except ValidationError as err:
        raise ReviewError(_describe(err), _readable_uid(body)) from None
    if review.request is None:
        raise ReviewError("request: field required")
    review.request._body_bytes = len(body)
    return review.request


def _describe(err: ValidationError) -> str:
    problems = err.errors(include_url=False, include_input=False)
    parts = []
    for problem in problems[:3]:
        where = ".".join(str(part) for part in problem["loc"])
        if problem["type"] == "json_invalid":
            parts.append(f"body is not JSON: {problem['msg'].removeprefix('Invalid JSON: ')}")
        else:
            parts.append(f"{where or 'body'}: {problem['msg']}")
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(parts) + more


def _readable_uid(body: bytes) -> str | None:
    """The uid of a v1 AdmissionReview whose other fields are wrong, if there is one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        return None
    request = document.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and 0 < len(uid) <= 128 else None


@dataclass(frozen=True)
class Verdict:
    """What a review function returns: the response, plus labels for metrics and logs."""

    response: AdmissionResponse
    outcome: str
    """``mutated``, ``denied``, ``skipped``...; see :data:`headroom.mutation.Outcome`."""
    policy: str = ""
