"""Priority views: a consumer of ``NAME[OP VALUE]`` (``default[>=200]``) receives, and is woken
by, only the entries of ``NAME`` whose priority satisfies it. docs/views-and-delays.md."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..storage import constants as C
from ..storage.errors import ConfigError

_PREDICATE = re.compile(r"^(?P<base>.+)\[\s*(?P<op><=|>=|=|<|>)\s*(?P<value>-?\d+)\s*\]$")
_OPS = {"=": operator.eq, "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True)
class View:
    """A consumed name ``NAME[OP VALUE]``: the queue it views and its predicate."""

    name: str
    base: str
    op: str
    value: int

    @classmethod
    def parse(cls, name: str) -> View | None:
        """The view a name denotes, or None when it names a queue."""
        m = _PREDICATE.match(name)
        return cls(name, m["base"], m["op"], int(m["value"])) if m else None

    def rank_range(self, q) -> tuple[int, int]:
        """(lowest, highest) rank in ``q`` of the admitted priorities; ConfigError: none, or ``q`` can't have views."""
        test = _OPS[self.op]
        ranks = [q.rank(p) for p in range(C.MIN_PRIORITY, C.MAX_PRIORITY + 1) if test(p, self.value)]
        if not ranks:
            raise ConfigError(f"queue view {self.name!r}: no priority 0..255 satisfies it")
        if q.settings.fair and q.settings.scope != "P":
            raise ConfigError(f"queue view {self.name!r}: views need fair_scope='within_priority' on a fair queue")
        return min(ranks), max(ranks)


class Views:
    """The rank ranges of the names a channel consumes, each parsed once (``queue``: the queue viewed)."""

    def __init__(self, queue: Callable[[str], object]):
        self._queue = queue
        self._ranges: dict[str, tuple[int, int] | None] = {}

    def range_of(self, name: str) -> tuple[int, int] | None:
        """The rank range of a consumed view name like ``default[>=200]``, or None."""
        if name not in self._ranges:  # (asked on every pop)
            view = View.parse(name)
            self._ranges[name] = None if view is None else view.rank_range(self._queue(name))
        return self._ranges[name]
