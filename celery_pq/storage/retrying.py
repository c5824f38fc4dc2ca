"""The one retry loop of the package: a call made again while Redis refuses it with nothing done (a
moving cluster slot: ``connections.until_settled``; a mode migrating: ``queue.running``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


def again_while_refused(
    attempt: Callable[[int], T],
    refused: Callable[[Exception], bool],
    *,
    bound: Callable[[], float],
    first: float,
    most: float,
    give_up: Callable[[Exception, float], NoReturn],
) -> T:
    """``attempt(n)`` (n: the tries before), made again while it raises what ``refused`` accepts (others
    go through), pausing ``first`` doubling to ``most`` seconds, while the next try starts within
    ``bound()`` of the first refusal; then ``give_up(last refusal, seconds waited)``, which raises."""
    started: float | None = None
    pause = first
    n = 0
    while True:
        try:
            return attempt(n)
        except Exception as exc:
            if not refused(exc):
                raise
            now = time.monotonic()
            if started is None:
                started = now
            if now - started + pause > bound():
                give_up(exc, now - started)
            time.sleep(pause)
            pause = min(pause * 2, most)
            n += 1
