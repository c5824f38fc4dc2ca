"""Deliveries over the last minutes: the queue's running totals (``counters()``,
``tenant_deliveries()``) sampled into a ring buffer, the newest sample minus the oldest inside the
window. Pure Python: the clock and the totals are given. docs/dashboard.md ("What it shows").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict


class TenantShare(TypedDict):
    deliveries: int
    share: float  # of the span's deliveries


class Summary(TypedDict):
    """The deliveries of the window (see ``DeliveryHistory.summary``)."""

    span_seconds: float
    delivered: int | None
    per_second: float | None
    tenants: dict[str, TenantShare]


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, a monotonic clock
    delivered: int | None  # counters()["delivered"], None when the queue keeps no counters
    tenants: dict[str, int]  # tenant_deliveries()


def _grown(new: int, old: int) -> int:
    # A total that went down was reset (the queue was deleted and made again): count from zero.
    return new - old if new >= old else new


@dataclass
class DeliveryHistory:
    """Samples of one queue's delivery totals, ``window`` seconds of them at most."""

    window: float
    samples: deque = field(default_factory=deque)

    def add(self, sample: Sample) -> None:
        if self.samples and sample.at < self.samples[-1].at:
            raise ValueError(f"samples go forward in time: {sample.at} after {self.samples[-1].at}")
        self.samples.append(sample)
        # Keep one sample at or before the window's start, so the difference covers all of it.
        while len(self.samples) > 2 and self.samples[1].at <= sample.at - self.window:
            self.samples.popleft()

    def summary(self) -> Summary:
        """``span_seconds`` (what the figures cover, at most ``window``), ``delivered`` and
        ``per_second`` in that span, and ``tenants``: {tenant: {"deliveries", "share"}} with
        shares of the span's deliveries summing to 1 (empty when nothing was delivered)."""
        if len(self.samples) < 2:
            return {"span_seconds": 0.0, "delivered": None, "per_second": None, "tenants": {}}
        old, new = self.samples[0], self.samples[-1]
        span = new.at - old.at
        delivered = None
        if new.delivered is not None and old.delivered is not None:
            delivered = _grown(new.delivered, old.delivered)
        grown = {t: _grown(n, old.tenants.get(t, 0)) for t, n in new.tenants.items()}
        grown = {t: n for t, n in grown.items() if n > 0}
        total = sum(grown.values())
        tenants: dict[str, TenantShare] = {
            t: {"deliveries": n, "share": n / total} for t, n in sorted(grown.items(), key=lambda x: (-x[1], x[0]))
        }
        return {
            "span_seconds": span,
            "delivered": delivered,
            "per_second": delivered / span if delivered is not None and span > 0 else None,
            "tenants": tenants,
        }
