"""The scheduler extender protocol, ``k8s.io/kube-scheduler/extender/v1``.

The Go types have no JSON tags, so the keys are the Go field names, capitalised;
the attributes here are spelled the same way to keep the mapping obvious. Pods
and nodes stay plain JSON dicts: unknown fields are kept, and in NodeList mode
the node objects are echoed back exactly as they came.
"""

import json
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

M = TypeVar("M", bound=BaseModel)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeList(BaseModel):
    """``v1.NodeList`` as the scheduler marshals it: ``{"metadata":{},"items":[...]}``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of ``filter`` and ``prioritize``: the pod and the candidate nodes."""

    Pod: dict[str, Any] | None = None
    Nodes: NodeList | None = None
    """Filled when the extender is configured with ``nodeCacheCapable: false``."""
    NodeNames: list[str] | None = None
    """Filled when the extender is configured with ``nodeCacheCapable: true``."""


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=0, le=10)


HostPriorityList = TypeAdapter(list[HostPriority])
"""The prioritize answer, a bare JSON list (for validating answers, e.g. in tests)."""


def host_priority_start(host: str) -> str:
    """``{"Host":"n1","Score":``: a HostPriority as JSON text, up to its score."""
    return f'{{"Host":{json.dumps(host)},"Score":'


SCORE_ENDS = tuple(f"{score}}}" for score in range(11))
"""The rest of a HostPriority after :func:`host_priority_start`, by score 0..10."""


def host_priority_item(host: str, score: int) -> str:
    """One HostPriority as JSON text, ``{"Host":"n1","Score":7}``, score already 0..10.

    Text rather than a model or a dict: the extender keeps these per node and
    joins thousands of them into one answer (:func:`json_array`) per request.
    """
    return host_priority_start(host) + SCORE_ENDS[score]


def json_array(items: Iterable[str]) -> bytes:
    """``[a,b,...]`` from items that are each JSON text already."""
    return ("[" + ",".join(items) + "]").encode()


def host_priority_list_json(scores: Iterable[tuple[str, int]]) -> bytes:
    """The prioritize answer, a bare JSON list, from ``(host, score)`` pairs."""
    return json_array(host_priority_item(host, score) for host, score in scores)


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    Error: str = ""


class MetaPod(_Wire):
    UID: str = Field(min_length=1)


class MetaVictims(_Wire):
    """Victims named by UID (``nodeCacheCapable: true``)."""

    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Wire):
    """Victims as whole pods (``nodeCacheCapable: false``)."""

    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    """Body of ``preempt``: the preemptor and, per candidate node, kube-scheduler's victims."""

    Pod: dict[str, Any] | None = None
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(_Wire):
    """The nodes kept, each with the victims the extender chose (by UID)."""

    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


class NotJSON(ValueError):
    """The body is not JSON at all: answered with HTTP 400."""


class BadShape(ValueError):
    """JSON, but not the shape the verb takes; the message names the field."""


def parse(model: type[M], body: bytes) -> M:
    """Validate ``body`` as ``model``; raises NotJSON or BadShape with a readable message."""
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise NotJSON(f"request body is not JSON: {first['msg']}") from err
        raise BadShape(explain(err)) from err


def explain(err: ValidationError, limit: int = 3) -> str:
    """``NodeNames.3: Input should be a valid string; ...`` (at most ``limit`` problems)."""
    problems = err.errors(include_url=False)
    parts = []
    for problem in problems[:limit]:
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        parts.append(f"{where}: {problem['msg']}")
    more = len(problems) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
