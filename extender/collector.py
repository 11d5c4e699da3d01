"""Garbage collection off the request path: young objects on a timer, old ones out of sight.

The caches hold tens of objects per node, and agents replace their reports
every few seconds. CPython's collector counts allocations *minus*
deallocations, so a new report that replaces an old one does not advance it:
survivors pile up in the youngest generation until one collection has tens of
thousands of objects to scan -- pauses of 5-20 ms at 5,000 nodes inside a
filter, measured by bench/extender_bench.py -- and full collections over the
whole cache take hundreds of milliseconds.

So, between requests: every ``interval`` the young generations are collected
(small: one interval's survivors) and what survives is frozen, moved where
automatic collections never scan. The interval is short on purpose: the
collections' total work is the same, but many small pauses hurt a request far
less than a few big ones (bench/extender_bench.py, 5,000 nodes: p99 about 4-7
ms at 50 ms, 14-22 ms at 1 s). Idle, a collection costs tens of microseconds.
Frozen objects are still freed by reference counting; only a reference cycle
that dies after being frozen waits for the full collection run every
``full_interval``, the one long pause, bounded.
"""

import asyncio
import gc
import logging

log = logging.getLogger(__name__)


def freeze_all() -> None:
    """Collect everything once, then freeze it: after the caches' first sync."""
    gc.collect()
    gc.freeze()


def collect_young() -> None:
    """Collect generations 0 and 1, then freeze the survivors."""
    gc.collect(1)
    gc.freeze()


async def run_collector(interval: float = 0.05, full_interval: float = 900.0) -> None:
    """Until cancelled: :func:`collect_young` every ``interval`` seconds, a full
    collection of the frozen objects too every ``full_interval`` seconds."""
    loop = asyncio.get_running_loop()
    next_full = loop.time() + full_interval
    while True:
        await asyncio.sleep(interval)
        if loop.time() >= next_full:
            next_full = loop.time() + full_interval
            gc.unfreeze()
            started = loop.time()
            freeze_all()
            log.debug("full collection: %.0f ms", (loop.time() - started) * 1000)
        else:
            collect_young()
