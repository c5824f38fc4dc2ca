"""One Spark task's way into the queues, shared by the batch writer and the streaming sink: its
partition's rows built into messages and inserted batch by batch, waiting for room in a full
queue (``on_full``) and under the write's ``rows_per_second`` cap, counted in Redis on the Redis
server's clock. Runs on the executors, one ``Sink`` per Spark task. docs/spark.md ("A full
queue, and a rate cap").
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType, TimestampType

from ...queue import open_queue
from ...storage.constants import TASK_TENANT_PREFIX
from ...storage.errors import PQError, QueueFull
from ...storage.keys import sink_rate_key
from ...transport.routing import RoutingTables
from .record import redis_ms
from .rows import Rejected, TaskRows
from .settings import WriterSettings

logger = logging.getLogger("celery_pq.spark")

#: First and longest pause between two tries of rows refused by a full queue (seconds).
FULL_BACKOFF = (0.05, 2.0)

#: Seconds the rate counter of one second (of the Redis server's clock) is kept: the second
#: itself and a margin. Each take drops the counters of the seconds before (the driver drops any
#: left behind at each commit, ``prune_rate``).
RATE_KEY_SECONDS = 10


class QueueStillFull(PQError):
    """Rows that found no room in a full queue: at once with ``on_full="reject"``, else within
    ``full_wait_seconds``. The rows before them stay stored; none of them is dropped (the
    Spark task fails, and its retry, or the query's restart, sends them once)."""


@dataclass
class PartitionReport(WriterCommitMessage):
    """What one Spark task did with its rows: sent (stored by it), already stored (the queue had
    seen the row's publish id: stored by an earlier attempt of this task, or by an earlier write
    of the same ``task_id`` or ``key``), skipped (streaming: recorded as handled by an earlier
    attempt, the same rows at the same positions; not sent), rejected (with the first
    ``rejects_limit`` rows and every reason counted).
    ``rows == sent + already_stored + skipped + rejected``. ``resent`` (streaming, counted apart):
    rows an earlier attempt recorded as handled or being sent that this one did not find at their
    positions; this attempt sent the rows it read there. ``waited_full``: seconds spent waiting for
    room in a full queue; ``waited_rate``: seconds held back by ``rows_per_second``."""

    partition: int
    attempt: int
    rows: int = 0
    sent: int = 0
    already_stored: int = 0
    skipped: int = 0
    rejected: int = 0
    resent: int = 0
    reasons: Counter = field(default_factory=Counter)
    rejects: list = field(default_factory=list)
    waited_full: float = 0.0
    waited_rate: float = 0.0


def eta_is_local(schema: StructType) -> bool:
    """Whether the rows' ``eta`` column is Spark's TimestampType, whose values reach Python as naive
    local times (``TaskRows``' ``eta_is_local``)."""
    eta = next((f for f in schema.fields if f.name == "eta"), None)
    return eta is not None and isinstance(eta.dataType, TimestampType)


def summarize(reports) -> dict:
    """The counts of a write (or a micro-batch): its partitions' reports summed."""
    reasons: Counter = Counter()
    for m in reports:
        reasons.update(m.reasons)
    return {
        "rows": sum(m.rows for m in reports),
        "sent": sum(m.sent for m in reports),
        "already_stored": sum(m.already_stored for m in reports),
        "skipped": sum(m.skipped for m in reports),
        "rejected": sum(m.rejected for m in reports),
        "resent": sum(m.resent for m in reports),
        "rejects_kept": sum(len(m.rejects) for m in reports),
        "partitions": len(reports),
        "reasons": dict(reasons.most_common()),
    }


class RateCap:
    """``rows_per_second`` over every Spark task of one sink: each takes rows from the counter
    of the current second of the Redis server's clock (HINCRBY), and what the second has no room
    for waits for the next. The counters of all seconds together never exceed the cap per
    second."""

    def __init__(self, client, sink: str, prefix: str, rows_per_second: float):
        self.client = client
        self.key = sink_rate_key(sink, prefix)
        self.cap = max(1, int(rows_per_second))

    def take(self, n: int, report: PartitionReport) -> None:
        """Return when ``n`` rows may go (in as many seconds as the cap needs)."""
        while n > 0:
            now = redis_ms(self.client) / 1000
            second = int(now)
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(self.key, str(second), n)
            pipe.hdel(self.key, *(str(second - k) for k in range(RATE_KEY_SECONDS, 2 * RATE_KEY_SECONDS)))
            total = int(pipe.execute()[0])
            granted = max(0, min(n, self.cap - (total - n)))
            n -= granted
            if n:
                pause = second + 1 - now
                report.waited_rate += pause
                time.sleep(pause)


def prune_rate(client, sink: str, prefix: str) -> None:
    """Drop the rate counters of ``sink`` older than ``RATE_KEY_SECONDS`` (on the driver)."""
    key = sink_rate_key(sink, prefix)
    now = redis_ms(client) / 1000
    old = [f for f in client.hkeys(key) if int(f) < now - RATE_KEY_SECONDS]
    if old:
        client.hdel(key, *old)


class Sink:
    """One partition's connection and queues: batches in, pipelined insert calls out."""

    def __init__(self, client, settings: WriterSettings, *, sink: str, on_full: str):
        self.client = client
        self.settings = settings
        self.on_full = settings.on_full or on_full
        self.queues: dict = {}
        self.routing = RoutingTables(client, settings.transport)
        self.rate = (
            RateCap(client, sink, settings.transport.key_prefix, settings.rows_per_second)
            if settings.rows_per_second
            else None
        )

    @property
    def batch_rows(self) -> int:
        """Rows per batch: ``batch_rows``, at most half a second's worth under a rate cap (so
        the rows go out evenly, not in bursts a cap's length apart)."""
        s = self.settings
        if s.rows_per_second is None:
            return s.batch_rows
        return max(1, min(s.batch_rows, math.ceil(s.rows_per_second / 2)))

    def queue(self, name):
        q = self.queues.get(name)
        if q is None:
            settings = self.settings.transport.queue_settings(name)
            q = self.queues[name] = open_queue(self.client, name, settings, declare=False)  # a producer
            self.routing.add_queue(name)  # declared, as a Celery producer's queue is (pq stats lists it)
        return q

    def pace(self, batch, report: PartitionReport) -> None:
        """Return when ``rows_per_second`` lets ``batch`` go."""
        if self.rate is not None and batch:
            self.rate.take(len(batch), report)

    def send(self, batch, report: PartitionReport) -> None:
        """Insert a batch of ``(queue, Item)``, counting in ``report`` the rows stored and
        those the queue had already (their publish ids seen)."""
        by_queue: dict = {}
        for name, item in batch:
            limits = self.queue(name).task_limits  # a task the queue limits: under its limit
            if limits and item.task and TASK_TENANT_PREFIX + item.task in limits:
                item = replace(item, tenant=TASK_TENANT_PREFIX + item.task)
            by_queue.setdefault(name, []).append(item)
        for name, items in by_queue.items():
            self._insert(self.queue(name), items, report)

    def _insert(self, q, items: list, report: PartitionReport) -> None:
        """``insert_many`` of ``items`` into ``q``; a refusal of a full queue as ``on_full``
        says. Rows of a refused call stored nothing; the others of the same pipeline did and are
        counted as sent (each item carries its own publish id, so a row never goes twice)."""
        chunk = self.settings.chunk
        pause, longest = FULL_BACKOFF
        since = None
        while items:
            try:
                _, repeated = q.insert_many(items, chunk=chunk, repeats=True)
            except QueueFull as exc:
                stored = exc.stored  # type: ignore[attr-defined]
                done = sum(1 for e in stored if e is not None)
                report.sent += done
                items = [item for item, e in zip(items, stored) if e is None]
                now = time.monotonic()
                if done or since is None:
                    since = now
                if self.on_full == "reject":
                    raise QueueStillFull(
                        f"celery_pq writer: {exc}, and on_full='reject': partition {report.partition} "
                        f"stored {report.sent + report.already_stored} rows, not the {len(items)} refused "
                        f"nor those after them (the Spark task fails; the rows stored stay stored)"
                    ) from None
                if now - since >= self.settings.full_wait_seconds:
                    raise QueueStillFull(
                        f"celery_pq writer: {exc}; no row found room for full_wait_seconds="
                        f"{self.settings.full_wait_seconds:g}: partition {report.partition} stored "
                        f"{report.sent + report.already_stored} rows, not the {len(items)} refused nor "
                        f"those after them (the Spark task fails; the rows stored stay stored)"
                    ) from None
                # room for this many entries, as the refusal counted it: smaller calls fit in
                chunk = max(1, min(self.settings.chunk, exc.limit - exc.size))
                time.sleep(pause)
                report.waited_full += pause
                pause = min(pause * 2, longest) if not done else FULL_BACKOFF[0]
                continue
            again = sum(repeated)
            report.already_stored += again
            report.sent += len(items) - again
            return


def write_partition(rows: TaskRows, iterator, sink: Sink, report: PartitionReport, *, hooks=None):
    """Build and send the rows of ``iterator`` batch by batch, counting in ``report``; they are
    the partition's next rows (``rows`` counts the positions, from 0, of those built or skipped
    before). ``hooks`` (the streaming sink's ``record.Progress``), when given, sees every row
    (``see(row)``), is told ``begin(start, end)`` before the rows from position ``start`` to
    ``end`` are sent and ``done(end)`` after."""
    s = sink.settings
    batch: list = []
    start = position = rows.position + 1
    now = time.time()
    limit = sink.batch_rows

    def flush():
        nonlocal batch, start, now
        sink.pace(batch, report)
        if hooks is not None:
            hooks.begin(start, position)
        sink.send(batch, report)
        if hooks is not None:
            hooks.done(position)
        batch, start, now = [], position, time.time()

    for row in iterator:
        report.rows += 1
        position += 1
        if hooks is not None:
            hooks.see(row)
        try:
            batch.append(rows.build(row, now))
        except Rejected as exc:
            reason = str(exc)
            if s.on_reject == "fail":
                raise Rejected(
                    f"celery_pq writer: a row was rejected ({reason}) and on_reject='fail': "
                    f"{report.sent + report.already_stored} rows of partition "
                    f"{report.partition} were stored before it, the rest of it was not"
                ) from None
            report.rejected += 1
            report.reasons[reason] += 1
            if len(report.rejects) < s.rejects_limit:
                report.rejects.append((*row, reason))
        if len(batch) >= limit:
            flush()
    if batch or position > start:
        flush()
    return report
