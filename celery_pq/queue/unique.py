"""Unique tasks, debounce and throttle by key (docs/unique.md): the checked key (``UniqueKey``)
and what an insert with one answers (``PublishOutcome``); the insert script decides, atomically
per entry, what a key's standing entry makes of a new one (lua/includes/unique.lua).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The modes, and the letter insert.lua takes for each.
MODES = {"while_waiting": "w", "while_active": "a", "replace": "r", "debounce": "d", "throttle": "t"}
#: What a publish with a key came to (``PublishOutcome.kind``).
OUTCOMES = ("stored", "merged", "replaced", "debounced", "throttled")
#: The outcomes a queue counts (its counters ``unique_<outcome>``: queue/values.py COUNTERS).
UNIQUE_COUNTS = OUTCOMES[1:]
#: The mode of a key given without one.
DEFAULT_MODE = "while_waiting"
#: The debounce delay and throttle period of a key given without one, in seconds.
DEFAULT_SECONDS = 60.0
#: The longest key (bytes of UTF-8): a key is a hash field of every insert that carries it.
MAX_KEY_BYTES = 1024
#: The longest delay or period: ten years, in seconds.
MAX_SECONDS = 10 * 365 * 86400


@dataclass(frozen=True)
class UniqueKey:
    """A checked unique key: the key, its mode (``MODES``) and its seconds (the debounce delay
    or the throttle period; the other modes do not use them), and the retry count of the
    publish (Celery's header ``retries``): a publish of the standing task's own id with more
    retries than it is that task's retry, stored (not merged or throttled); a publish of the same
    id without more retries is judged as any other. ValueError names a bad value, with
    ``source`` (say, the header it came from) in front."""

    key: str
    mode: str = DEFAULT_MODE
    seconds: float = DEFAULT_SECONDS
    source: str = "unique key"
    retries: int = 0

    def __post_init__(self):
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"{self.source}: a unique key is a non-empty str, got {self.key!r}")
        if len(self.key.encode()) > MAX_KEY_BYTES:
            raise ValueError(f"{self.source}: a unique key is at most {MAX_KEY_BYTES} bytes, got {len(self.key)} chars")
        if self.mode not in MODES:
            raise ValueError(f"{self.source}: unique mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        s = self.seconds
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 < s <= MAX_SECONDS:
            raise ValueError(f"{self.source}: unique seconds must be a number > 0 and <= {MAX_SECONDS}, got {s!r}")
        r = self.retries
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"retries: a retry count is an int >= 0, got {r!r}")

    @property
    def spec(self) -> tuple[str, int, int, str]:
        """(mode letter, ms, retries, key), as ``calls.insert_args`` takes it."""
        return MODES[self.mode], max(1, int(float(self.seconds) * 1000)), self.retries, self.key


@dataclass(frozen=True)
class PublishOutcome:
    """What one publish with a unique key came to. ``kind``: ``"stored"``, ``"merged"``,
    ``"replaced"``, ``"debounced"`` or ``"throttled"``; ``task_id``: the id of the task that
    stands for the key (the one whose result to wait on); ``requested``: the id published;
    ``key``: the unique key."""

    kind: str
    task_id: str
    requested: str | None
    key: str
