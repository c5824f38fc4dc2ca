"""What the dashboard shows and does, through the queues' own methods: per queue ``stats()``, the
leases, the newest dead letters and the recent deliveries per tenant (sampled running totals: the
newest sample minus the oldest inside the window); the actions pause, resume and replay."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ...storage.checks import text as _text
from ...storage.errors import PQError


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, a monotonic clock
    delivered: int | None  # counters()["delivered"], None when the queue keeps no counters
    tenants: dict[str, int]  # {tenant: deliveries} of tenants()


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

    def summary(self) -> dict:
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
        tenants = {
            t: {"deliveries": n, "share": n / total} for t, n in sorted(grown.items(), key=lambda x: (-x[1], x[0]))
        }
        return {
            "span_seconds": span,
            "delivered": delivered,
            "per_second": delivered / span if delivered is not None and span > 0 else None,
            "tenants": tenants,
        }


#: Leases listed per queue (soonest deadline first); the count beside them is the full one.
LEASES_SHOWN = 20
#: Dead letters listed per queue, newest first, picked among the next DEAD_SCANNED of the
#: dead-letter queue in delivery order (a dead-letter queue may be long; its count is exact).
DEAD_SHOWN = 5
DEAD_SCANNED = 200
#: Seconds of deliveries the tenants' shares cover, and how often the totals are sampled.
WINDOW_SECONDS = 300.0
SAMPLE_SECONDS = 2.0


class BoardError(Exception):
    """An action the dashboard refuses, with the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Board:
    """The queues' state and the actions on them. ``queue_names()``: the names to show (read on
    every refresh); ``open_queue(name)``: its ``PriorityQueue``; ``window``: seconds of deliveries
    the tenants' shares cover. One lock serialises the threads' use of the kombu channel."""

    def __init__(
        self,
        queue_names: Callable[[], list[str]],
        open_queue: Callable,
        *,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not isinstance(window, (int, float)) or isinstance(window, bool) or window <= 0:
            raise ValueError(f"window must be a number of seconds > 0, got {window!r}")
        self._queue_names = queue_names
        self._open = open_queue
        self.window = float(window)
        self._clock = clock
        self._lock = threading.Lock()
        self._histories: dict[str, DeliveryHistory] = {}

    def sample(self) -> None:
        with self._lock:
            names = self._queue_names()
            for gone in set(self._histories) - set(names):  # a deleted queue's samples go too
                del self._histories[gone]
            for name in names:
                q = self._open(name)
                delivered = {t: r["deliveries"] for t, r in q.tenants().items() if r["deliveries"]}
                sample = Sample(self._clock(), q.counters().get("delivered"), delivered)
                self._histories.setdefault(name, DeliveryHistory(self.window)).add(sample)

    def state(self) -> dict:
        """Every queue's figures, in the order of ``queue_names`` (docs/dashboard.md gives the shape)."""
        with self._lock:
            return {"window_seconds": self.window, "queues": [self._queue_state(n) for n in self._queue_names()]}

    def _queue_state(self, name: str) -> dict:
        q = self._open(name)
        stats = q.stats()  # the very dict `pq stats --json` prints for this queue
        leases = q.leases(LEASES_SHOWN) if stats["leased"] else []
        dead = []
        if stats["dead"]:
            sec, usec = q.client.time()  # dead_ms is on Redis's clock
            now_ms = int(sec) * 1000 + int(usec) // 1000
            newest = sorted(q.dead.peek(DEAD_SCANNED), key=lambda e: e.dead_ms or 0, reverse=True)
            dead = [
                {
                    "id": e.id,
                    "priority": e.priority,
                    "tenant": e.tenant,
                    "reason": e.dead_reason,
                    "dead_ms": e.dead_ms,
                    "age_seconds": (now_ms - e.dead_ms) / 1000 if e.dead_ms else None,
                }
                for e in newest[:DEAD_SHOWN]
            ]
        return {
            "queue": name,
            "stats": stats,
            "fair": q.settings.fair,
            "priority_order": q.settings.priority_order,
            "leases": leases,
            "dead_letters": dead,
            "deliveries": self._histories.get(name, DeliveryHistory(self.window)).summary(),
        }

    def act(self, action: str, request: dict) -> dict:
        """Run ``action`` on ``{"queue", "tenant": name or None}`` (pause, resume) or ``{"queue",
        "ids": [at most REPLAY_IDS]}`` (replay). BoardError (400, 404) says what is wrong; no change."""
        if action not in ACTIONS:
            raise BoardError(404, f"no action {action!r}; there are {', '.join(ACTIONS)}")
        if not isinstance(request, dict):
            raise BoardError(400, f"the request must be a JSON object, got {type(request).__name__}")
        fields = ACTIONS[action]
        unknown = set(request) - set(fields)
        if unknown:
            raise BoardError(
                400,
                f"unknown field(s) {', '.join(sorted(map(repr, unknown)))}; "
                f"{action} takes {', '.join(map(repr, fields))}",
            )
        name, tenant, ids = request.get("queue"), request.get("tenant"), request.get("ids")
        try:
            _text("queue", name)
            if tenant is not None:
                _text("tenant", tenant)
            if action == "replay":
                if not isinstance(ids, list) or not 1 <= len(ids) <= REPLAY_IDS:
                    raise ValueError(f"ids must be a list of 1 to {REPLAY_IDS} dead letter ids, got {ids!r}")
                for i in ids:
                    _text("id", i)
        except ValueError as exc:
            raise BoardError(400, str(exc)) from None
        with self._lock:
            if name not in self._queue_names():
                raise BoardError(404, f"no queue named {name!r} on this dashboard")
            q = self._open(name)
            if tenant is not None and not q.settings.fair:
                raise BoardError(400, f"queue {name!r} is not fair (no tenants): pause or resume the whole queue")
            try:
                if action == "replay":
                    return {"queue": name, "done": action, **q.replay(ids)}
                getattr(q, action)(tenant=tenant)
            except (PQError, ValueError) as exc:
                raise BoardError(400, str(exc)) from None
            state = q.recorded()
            paused = {"queue": state["paused"], "tenants": state["paused_tenants"]}
            return {"queue": name, "tenant": tenant, "done": action, "paused": paused}


ACTIONS = {"pause": ("queue", "tenant"), "resume": ("queue", "tenant"), "replay": ("queue", "ids")}
#: Most dead letters one replay request names (the page sends one, or the few it shows).
REPLAY_IDS = 100
