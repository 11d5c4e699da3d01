"""How an e2e module says it cannot run, and how it shows progress."""

import os
import sys
from collections.abc import Callable
from typing import NoReturn

import pytest


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with ``reason``; under ``CI=true`` fail instead: CI must never pass by not
    testing."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def progress(tag: str) -> Callable[[str], None]:
    """A progress callable for devcluster that prints ``[tag] message`` to stderr."""

    def show(message: str) -> None:
        print(f"[{tag}] {message}", file=sys.stderr, flush=True)

    return show
