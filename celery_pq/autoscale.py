"""A Celery autoscaler that sizes the pool by reserved tasks plus this worker's backlog in Redis
(``worker_autoscaler = "celery_pq.autoscale:BacklogAutoscaler"``): it grows at once and shrinks
after ``pq_autoscale_idle_seconds`` of lower demand (docs/operations.md, "Autoscaling")."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from time import monotonic

from celery import current_app
from celery.worker import state
from celery.worker.autoscale import Autoscaler

from .storage.checks import count, number
from .transport.broker import Broker, queue_and_view

logger = logging.getLogger("celery_pq.autoscale")


@dataclass(frozen=True)
class AutoscaleSettings:
    """The ``pq_autoscale_*`` settings of ``app.conf``, checked (ValueError)."""

    interval: float = 1.0
    backlog_per_process: int = 1
    max_age: float = 30.0
    idle_seconds: float = 30.0

    @classmethod
    def from_conf(cls, conf) -> AutoscaleSettings:
        get = lambda name: conf.get(f"pq_autoscale_{name}", getattr(cls, name))  # noqa: E731
        return cls(
            interval=float(number("pq_autoscale_interval", get("interval"), low=0.05, allow_low=True)),
            backlog_per_process=count("pq_autoscale_backlog_per_process", get("backlog_per_process"), none=False),
            max_age=float(number("pq_autoscale_max_age", get("max_age"), allow_low=True)),
            idle_seconds=float(number("pq_autoscale_idle_seconds", get("idle_seconds"), allow_low=True)),
        )


class BacklogAutoscaler(Autoscaler):
    """Celery's Autoscaler, deciding on reserved tasks plus this worker's backlog in Redis."""

    def __init__(self, pool, max_concurrency, min_concurrency=0, worker=None, keepalive=None, mutex=None):
        app = getattr(worker, "app", None) or current_app._get_current_object()
        self.settings = AutoscaleSettings.from_conf(app.conf)
        # keepalive: how often Celery's loop asks us, our decision interval
        super().__init__(
            pool,
            max_concurrency,
            min_concurrency,
            worker=worker,
            keepalive=keepalive or self.settings.interval,
            mutex=mutex,
        )
        self.app = app
        self.broker = Broker.of(app)
        self._read_at = None
        self._seen = (0, None)  # (backlog, seconds the oldest next entry waited)
        self._lower_since = None
        self._warned_at = None

    def queue_names(self) -> list[str]:
        """The queues and views this worker consumes (``-Q``, ``add_consumer``)."""
        consumer = getattr(self.worker, "consumer", None)
        tc = getattr(consumer, "task_consumer", None)
        if tc is not None and tc.queues:
            return sorted({q.name for q in tc.queues})
        return sorted(self.app.amqp.queues.consume_from or self.app.amqp.queues)

    def backlog(self) -> tuple[int, float | None]:
        """(due entries this worker could take, seconds the oldest next one waited), read at most
        once per interval; (0, None) when Redis cannot be read (warned once a minute)."""
        now = monotonic()
        if self._read_at is not None and now - self._read_at < self.settings.interval:
            return self._seen
        self._read_at = now
        try:
            counts, ages = [], []
            with self.broker.channel() as channel:
                sec, usec = channel.client.time()
                now_ms = int(sec) * 1000 + int(usec) // 1000
                for name in self.queue_names():
                    q, view = queue_and_view(channel, name)
                    counts.append(n := q.backlog(view))
                    if n and view is None:
                        ages += [(now_ms - e.enqueued_ms) / 1000 for e in q.peek(1)]
            self._seen = (sum(counts), max(ages, default=None))
        except Exception as exc:  # sized by the reserved tasks alone, as Celery's autoscaler
            if self._warned_at is None or now - self._warned_at > 60:
                self._warned_at = now
                logger.warning("celery-pq autoscaler: cannot read the backlog (%s); sizing by reserved tasks", exc)
            self._seen = (0, None)
        return self._seen

    def wanted(self) -> int:
        """Processes wanted before MIN and MAX: ``ceil((reserved + backlog) / backlog_per_process)``,
        and one more than now when the next entry waited over ``max_age``."""
        reserved = len(state.reserved_requests)
        backlog, age = self.backlog()
        want = math.ceil((reserved + backlog) / self.settings.backlog_per_process)
        if backlog and age is not None and self.settings.max_age and age > self.settings.max_age:
            want = max(want, self.processes + 1)
        return want

    def _maybe_scale(self, req=None):
        procs = self.processes
        target = min(max(self.wanted(), self.min_concurrency), self.max_concurrency)
        if target < procs:  # shrink only after idle_seconds of lower demand
            if self._lower_since is None:
                self._lower_since = monotonic()
            if monotonic() - self._lower_since < self.settings.idle_seconds:
                return False
        self._lower_since = None
        if target == procs:
            return False
        (self.scale_up if target > procs else self._shrink)(abs(target - procs))
        return True

    def info(self):
        backlog, age = self._seen
        return {**super().info(), "backlog": backlog, "oldest_age_seconds": age}
