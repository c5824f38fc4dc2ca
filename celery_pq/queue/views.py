"""The registry of priority views (the collated keyed queue) an insert wakes: read it again
when it changed, register a view."""

from __future__ import annotations

from .. import constants as C
from .base import QueueBase
from .values import as_text


class QueueViews(QueueBase):
    """The priority views of a queue, as its inserts know them (``views``, ``views_version``)."""

    #: The insert call's KEYS and ARGV layout (``calls.insert_head``), made again after a change.
    _head: tuple | None

    def refresh_views(self) -> None:
        """Re-read the registry of priority views (inserts wake the views an entry satisfies)."""
        with self._pipeline(transaction=False) as p:
            p.hkeys(self.keys.views)
            p.get(self.keys.views_version)
            names, version = p.execute()
        self.views = sorted((int(lo), int(hi)) for lo, hi in (as_text(n).split("-") for n in names))
        self.views_version = as_text(version) if version is not None else ""
        self._head = None

    def register_view(self, lo: int, hi: int) -> str:
        """Register the view of ranks lo..hi; returns its wake list key."""
        if not 0 <= lo <= hi <= C.MAX_PRIORITY:
            raise ValueError(f"a view covers ranks lo..hi with 0 <= lo <= hi <= 255, got {lo}..{hi}")
        if self.client.hsetnx(self.keys.views, f"{lo}-{hi}", 1):
            self.client.incr(self.keys.views_version)
        return self.keys.view_wake(lo, hi)
