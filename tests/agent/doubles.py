"""Test doubles for the agent's outputs: the report writer and the pod actions.

The real ones call the API server (``agent.client``); e2e exercises those.
These record what the agent asked for, so tests can count and inspect it.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from headroom.names import GPU_MEMORY


class WriterDouble:
    """Stands in for ``agent.client.ReportWriter``: records every object written."""

    def __init__(self) -> None:
        self.objects: list[dict[str, Any]] = []
        self.fail_next = 0

    def __call__(self, obj: dict[str, Any]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("apiserver unreachable (test double)")
        self.objects.append(obj)


@dataclass
class ActionsDouble:
    """Stands in for ``agent.client.PodActions``."""

    events: list[tuple[str, str, str, str]] = field(default_factory=list)
    evictions: list[tuple[str, str, str]] = field(default_factory=list)
    graces: list[int] = field(default_factory=list)
    """The grace period each eviction gave."""
    refuse_evictions: int = 0

    def record_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        self.events.append((f"{namespace}/{name}", uid, reason, message))

    deletions: list[tuple[str, str, str]] = field(default_factory=list)

    def delete(self, namespace: str, name: str, uid: str, grace: int) -> None:
        self.deletions.append((namespace, name, uid))
        self.graces.append(grace)

    def evict(self, namespace: str, name: str, uid: str, grace: int) -> bool:
        self.evictions.append((namespace, name, uid))
        self.graces.append(grace)
        if self.refuse_evictions:
            self.refuse_evictions -= 1
            return False
        return True


class Clock:
    """Injected time: ``now()`` for datetimes, ``monotonic()`` for seconds."""

    def __init__(self, start: datetime | None = None) -> None:
        self.start = start or datetime(2025, 1, 1, tzinfo=UTC)
        self.seconds = 0.0

    def advance(self, seconds: float) -> None:
        self.seconds += seconds

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)

    def monotonic(self) -> float:
        return self.seconds


def pod(
    name: str,
    uid: str,
    *,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    resource: str = "nvidia.com/gpu.shared",
    memory: str | None = None,
    started: str = "2025-01-01T00:00:00Z",
    phase: str = "Running",
    container_id: str | None = None,
) -> dict[str, Any]:
    """A bound pod as the apiserver returns it (the fields the agent reads);
    ``memory`` is its declared ``headroom.dev/gpu-memory``."""
    limits = {resource: "1"} if memory is None else {resource: "1", GPU_MEMORY: memory}
    status: dict[str, Any] = {"phase": phase, "startTime": started}
    if container_id:
        status["containerStatuses"] = [
            {"name": "main", "containerID": f"containerd://{container_id}", "ready": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
        "status": status,
    }
