"""``wait_for``: the one polling loop of the tests, the benchmarks and the demo."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What was waited for did not happen in time. An AssertionError: in a test it is a failed check like any other."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str | Callable[[], str] = "condition",
    *,
    interval: float = 0.05,
) -> T:
    """``predicate()``'s first true value, called every ``interval`` seconds; WaitTimeout naming
    ``what`` (or what ``what()`` returns then) after ``timeout`` seconds. Its exceptions go through."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
