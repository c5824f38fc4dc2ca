"""Unique tasks, debounce and throttle by key (docs/unique.md): the checked key (``UniqueKey``)
and what an insert with one answers (``PublishOutcome``); the insert script decides, atomically
per entry, what a key's standing entry makes of a new one (lua/includes/unique.lua).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..storage.checks import MAX_SECONDS  # (the longest delay or period: ten years)

#: The modes, and the letter insert.lua takes for each.
MODES = {"while_waiting": "w", "while_active": "a", "replace": "r", "debounce": "d", "throttle": "t"}
#: The outcomes (``PublishOutcome.kind``) a queue counts, as ``unique_<outcome>`` (values.COUNTERS).
UNIQUE_COUNTS = ("merged", "replaced", "debounced", "throttled")
#: The longest key (bytes of UTF-8): a key is a hash field of every insert that carries it.
MAX_KEY_BYTES = 1024


@dataclass(frozen=True)
class UniqueKey:
    """A checked unique key: the key, its mode (``MODES``), its seconds (the debounce delay or
    the throttle period) and the publish's retry count (Celery's header ``retries``): a publish of
    the standing task's own id with more retries is that task's retry, stored (not merged or
    throttled). ValueError names a bad value, with ``source`` (say, its header) in front."""

    key: str
    mode: str = "while_waiting"
    seconds: float = 60.0
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
