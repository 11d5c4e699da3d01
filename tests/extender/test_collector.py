"""The collector frees young cycles, freezes survivors, and frees frozen cycles in full runs."""

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from extender.collector import collect_young, run_collector


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    # Freezing is process-wide: leave the rest of the test session as it was.
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_young_cycles_are_freed_and_survivors_frozen() -> None:
    dead = Cycle()
    gone = weakref.ref(dead)
    del dead
    alive = Cycle()
    collect_young()
    assert gone() is None
    assert gc.get_freeze_count() > 0
    assert not any(obj is alive for obj in gc.get_objects())  # out of the collector's sight


async def test_a_cycle_that_dies_frozen_is_freed_by_the_full_run() -> None:
    late = Cycle()
    gone = weakref.ref(late)
    collect_young()  # frozen while alive
    del late
    gc.collect()
    assert gone() is not None  # frozen: automatic and explicit collections skip it
    task = asyncio.create_task(run_collector(interval=0.01, full_interval=0.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert gone() is None
