"""Making a call again while Redis says "not now": the one retry loop of the package.

Two kinds of refusal leave nothing done, so the same call may simply be made again after a
pause: a Redis Cluster slot that is moving (``connections.until_settled``) and a queue whose
mode is being migrated (``queue.running.wait_out_migration``). The pause doubles from ``first``
to ``most`` seconds; the bound counts from the first refusal, so a call that is never refused
costs nothing more than the try.
"""

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
    """``attempt(n)`` (n: the tries before it), made again while it raises an exception that
    ``refused`` accepts, after a pause doubling from ``first`` to ``most`` seconds, as long as the
    next try would still start within ``bound()`` seconds of the first refusal; then
    ``give_up(last refusal, seconds waited)``, which raises. Other exceptions go through at once."""
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
