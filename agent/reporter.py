"""When to write the node's GPUNodeReport, and writing it without blocking the loop.

Writes are bounded. A report is written when it differs *significantly* from
the last one written -- a GPU's used, free or unattributed memory, or a pod's
usage, fell by more than ``max(threshold_bytes, threshold_fraction * GPU
total)`` or rose by more than the smaller of that and ``rise_bytes`` (a pod's
rise judged by what the extender charges it, :func:`change_reason`); a pod, GPU
or MIG device appeared or went; a pod started or stopped starving, or kubelet's
word on its GPU came or went; a GPU's NVML error came, changed or went; a
condition changed -- and otherwise once per ``heartbeat_seconds``, so readers
can tell a live agent from a dead one by ``observedAt``.

Write rate per node, with the defaults (5 s interval, 30 s heartbeat): 2 per
minute when nothing moves, at most 12 per minute (one per tick) while memory
churns; with API errors, retries back off exponentially from 1 s to 60 s.
"""

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from headroom.accounting import homes
from headroom.quantity import MIB, human_bytes
from headroom.reports import GPUUsage, PodUsage, ReportStatus, report_object

log = logging.getLogger(__name__)

Writer = Callable[[dict[str, Any]], None]
"""Blocking: stores the whole report object (create or replace); raises on failure."""


@dataclass(frozen=True)
class WritePolicy:
    threshold_bytes: int = 64 * MIB
    threshold_fraction: float = 0.01
    rise_bytes: int = 256 * MIB
    """What the extender charges rising by more than this is written at once, however
    large the GPU: 1% of an 80 GB GPU is 815 MiB, more than the extender's 512 MiB
    margin (a pod's own rise below its declaration charges nothing more)."""
    heartbeat_seconds: float = 30.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0


def change_reason(
    old: ReportStatus | None,
    new: ReportStatus,
    policy: WritePolicy,
    declared: Mapping[str, int] | None = None,
) -> str | None:
    """Why ``new`` is worth writing over ``old``; None when the difference is noise.

    ``declared``: pod UID -> the memory it declares per GPU. On the one GPU the
    report places it (:func:`headroom.accounting.homes`) the extender charges
    such a pod ``max(declared, held)``, so a rise of its own use below that line
    changes no charge and needs no early write (two pods trading 300 MiB every
    tick would otherwise write every tick); it is still written past the 1%
    threshold, as a fall is. Elsewhere -- a GPU it was not given, no one GPU, a
    home that moved -- it is charged what it holds, as are pods not in
    ``declared``. The charge rises of a GPU's pods are added up: eight pods each
    rising less than ``rise_bytes`` can still rise by more together."""
    if old is None:
        return "first report"
    old_conditions = {(c.type, c.status, c.reason) for c in old.conditions}
    if old_conditions != {(c.type, c.status, c.reason) for c in new.conditions}:
        return "condition changed"
    old_gpus = {gpu.uuid: gpu for gpu in old.gpus}
    if old_gpus.keys() != {gpu.uuid for gpu in new.gpus}:
        return "GPUs changed"
    was_home, home = homes(old), homes(new)
    if was_home != home:
        # Where the extender charges a pod moved: one placed on no one GPU any more is
        # charged on every GPU, though no figure or flag of it need have moved (a
        # process NVML reads as 0 bytes, where the report lists no allocations).
        return "pods located differently"
    for gpu in new.gpus:
        floors = {
            uid: memory
            for uid, memory in (declared or {}).items()
            if home.get(uid) == gpu.index  # and in ``old``: the homes are the same
        }
        reason = _gpu_change(old_gpus[gpu.uuid], gpu, policy, floors)
        if reason:
            return f"gpu {gpu.index}: {reason}"
    return None


def _gpu_change(
    old: GPUUsage, new: GPUUsage, policy: WritePolicy, declared: Mapping[str, int]
) -> str | None:
    limit = max(policy.threshold_bytes, int(policy.threshold_fraction * new.total_bytes))
    rise = min(limit, policy.rise_bytes)
    for what, held in (
        ("total_bytes", 0),
        ("used_bytes", 1),
        ("free_bytes", -1),
        ("unattributed_bytes", 1),
    ):
        before, after = getattr(old, what), getattr(new, what)
        if abs(after - before) > (rise if (after - before) * held > 0 else limit):
            return f"{what} moved {human_bytes(after - before)}"
    if old.error != new.error:
        return "NVML error changed"  # a failing GPU keeps its last figures: only this says
    if old.mig_enabled != new.mig_enabled:
        return "MIG mode changed"
    if old.unlisted_replicas != new.unlisted_replicas:
        return "replicas the device plugin no longer lists changed"
    old_migs = {device.uuid: device for device in old.mig_devices}
    if old_migs.keys() != {device.uuid for device in new.mig_devices}:
        return "MIG devices changed"
    pairs = [(old.pods, new.pods)]
    for device in new.mig_devices:
        before = old_migs[device.uuid]
        moved = device.used_bytes - before.used_bytes
        if abs(moved) > (rise if moved > 0 else limit):
            return f"MIG {device.uuid} used moved"
        pairs.append((before.pods, device.pods))
    # The GPU's unattributed memory is charged beside its pods': its rise adds to theirs.
    unattributed = max(new.unattributed_bytes - old.unattributed_bytes, 0)
    for before_pods, after_pods in pairs:
        reason = _pods_change(before_pods, after_pods, limit, rise, declared, unattributed)
        unattributed = 0  # the MIG devices' pods are summed each on their own
        if reason:
            return reason
    return None


def _pods_change(
    old: list[PodUsage],
    new: list[PodUsage],
    limit: int,
    rise: int,
    declared: Mapping[str, int],
    rises: int = 0,
) -> str | None:
    """``rises``: what the charge of the pods' device has risen by already."""
    before = {pod.uid: pod for pod in old}
    if before.keys() != {pod.uid for pod in new}:
        return "pods changed"
    for pod in new:
        was = before[pod.uid]
        moved = pod.used_bytes - was.used_bytes
        floor = declared.get(pod.uid, 0)
        charged = max(floor, pod.used_bytes) - max(floor, was.used_bytes)
        rises += max(charged, 0)  # the GPU's rise so far, this pod's included
        if abs(moved) > limit or rises > rise:
            return f"pod {pod.namespace}/{pod.name} moved {human_bytes(moved)}"
        if bool(pod.starved_bytes) != bool(was.starved_bytes):
            change = "starts" if pod.starved_bytes else "stops"
            return f"pod {pod.namespace}/{pod.name} {change} starving"
        if pod.allocated != was.allocated:
            # Memory may have located it first; kubelet's word can come later.
            change = "allocated" if pod.allocated else "no longer allocated"
            return f"pod {pod.namespace}/{pod.name} {change}"
        if pod.replicas != was.replicas:
            # Where its counts add up, a pod of several replicas is located on its GPUs.
            return f"pod {pod.namespace}/{pod.name} replicas counted {pod.replicas}"
    return None


class Reporter:
    """Offers each tick's report; writes the ones the policy lets through."""

    def __init__(
        self,
        writer: Writer,
        policy: WritePolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self._writer = writer
        self.policy = policy or WritePolicy()
        self._clock = clock
        self._jitter = jitter
        self.written: ReportStatus | None = None
        self._written_at = float("-inf")
        self._failures = 0
        self._retry_at = float("-inf")
        self.writes = 0
        self.errors = 0

    def due(self, status: ReportStatus, declared: Mapping[str, int] | None = None) -> str | None:
        """Why ``status`` should be written now, or None (``declared``: :func:`change_reason`)."""
        now = self._clock()
        if now < self._retry_at:
            return None
        if self._failures:
            return "retry after error"
        reason = change_reason(self.written, status, self.policy, declared)
        if reason is None and now - self._written_at >= self.policy.heartbeat_seconds:
            reason = "heartbeat"
        return reason

    async def offer(self, status: ReportStatus, declared: Mapping[str, int] | None = None) -> bool:
        """Write ``status`` if due, on a worker thread; True when it was written."""
        reason = self.due(status, declared)
        if reason is None:
            return False
        try:
            await asyncio.to_thread(self._writer, report_object(status))
        except Exception as err:  # any API or network error: back off, keep the loop alive
            self._failed(err)
            return False
        if self._failures:
            log.info("report written again after %d failed attempts", self._failures)
        log.debug("report written: %s", reason)
        self._failures = 0
        self._retry_at = float("-inf")
        self.written = status
        self._written_at = self._clock()
        self.writes += 1
        return True

    def _failed(self, err: Exception) -> None:
        self.errors += 1
        self._failures += 1
        delay = min(
            self.policy.backoff_max_seconds,
            self.policy.backoff_initial_seconds * 2 ** (self._failures - 1),
        )
        delay *= self._jitter()
        self._retry_at = self._clock() + delay
        # One line for the first failure of a streak, then only every 10th.
        if self._failures == 1 or self._failures % 10 == 0:
            log.warning(
                "cannot write GPUNodeReport (attempt %d): %s; retrying in %.1fs",
                self._failures,
                err,
                delay,
            )
