"""One Spark task's rows into the queues (batch writer and streaming sink), waiting for room in a
full queue (``on_full``) and under ``rows_per_second``. docs/spark.md ("A full queue, and a rate cap")."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType, TimestampType

from ...queue import open_queue
from ...storage.constants import TASK_TENANT_PREFIX
from ...storage.errors import PQError, QueueFull
from ...storage.keys import sink_rate_key
from ...transport.routing import RoutingTables
from .record import redis_ms
from .rejects import write_rejects
from .rows import Rejected, TaskRows
from .settings import WriterSettings

logger = logging.getLogger("celery_pq.spark")

#: First and longest pause between two tries of rows refused by a full queue (seconds).
FULL_BACKOFF = (0.05, 2.0)

#: Seconds a one-second rate counter is kept (``RateCap.take`` and ``prune_rate`` drop older ones).
RATE_KEY_SECONDS = 10


class QueueStillFull(PQError):
    """Rows found no room in a full queue (at once with ``on_full="reject"``, else within
    ``full_wait_seconds``). The Spark task fails; the rows before stay stored, none is dropped."""


@dataclass
class PartitionReport(WriterCommitMessage):
    """What one Spark task did with its rows, ``rows == sent + already_stored + skipped +
    rejected`` (docs/spark.md, "What the write reports"); ``resent`` (streaming) is counted apart;
    ``rejects`` keeps the first ``rejects_limit`` rejected rows."""

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
    #: The streaming sink's: the query and micro-batch of the partition.
    batch: int = -1
    query: str = ""


class PartitionWriter:
    """The batch writer's and the streaming sink's: a Spark task's sink, the commit's log and rejects."""

    def __init__(self, settings: WriterSettings, schema: StructType):
        self.settings = settings
        self.schema_json = schema.json()
        # Is the eta column Spark's TimestampType (naive local times in Python; TaskRows)?
        self.eta_is_local = any(f.name == "eta" and isinstance(f.dataType, TimestampType) for f in schema.fields)

    @contextmanager
    def _sink(self, settings: WriterSettings, report: PartitionReport, *, sink: str, on_full: str):
        """``(Sink, TaskRows)`` of one Spark task; the client is closed after."""
        with settings.client() as client:
            rows = TaskRows(settings, partition=report.partition, eta_is_local=self.eta_is_local)
            yield Sink(client, settings, sink=sink, on_full=on_full), rows

    def _finish(self, messages, path: str | None, message: str, warn_if: tuple, **extra) -> list:
        """Log ``message % summary`` (the partitions' counts summed, and ``extra``) with the
        commonest reasons for rejects, a warning when a count of ``warn_if`` is not 0; write the
        ``rejects`` directory at ``path`` (if the write has one); the partitions' reports."""
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        counts = ("rows", "sent", "already_stored", "skipped", "rejected", "resent")
        summary = {
            **{name: sum(getattr(m, name) for m in reports) for name in counts},
            "rejects_kept": sum(len(m.rejects) for m in reports),
            "partitions": len(reports),
            "reasons": dict(sum((m.reasons for m in reports), Counter()).most_common()),
            **extra,
        }
        reasons = "".join(f"; {n} x {r}" for r, n in list(summary["reasons"].items())[:5])
        log = logger.warning if any(summary[k] for k in warn_if) else logger.info
        log(message + "%(top_reasons)s", {**summary, "top_reasons": reasons})
        if path:
            write_rejects(path, summary, [r for m in reports for r in m.rejects], self.schema_json)
        return reports

    def _aborted(self, messages, message: str, *args) -> None:
        """Log ``message % (*args, partitions finished, rows they sent)`` as an error."""
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        logger.error(message, *args, len(reports), sum(m.sent for m in reports))


class RateCap:
    """``rows_per_second`` over every Spark task of one sink, counted per second of the Redis
    server's clock: what a second has no room for waits for the next."""

    def __init__(self, client, sink: str, prefix: str, rows_per_second: float):
        self.client = client
        self.key = sink_rate_key(sink, prefix)
        self.cap = max(1, int(rows_per_second))

    def take(self, n: int) -> None:
        """Return when ``n`` rows may go."""
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
                time.sleep(second + 1 - now)


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
        rate = settings.rows_per_second
        self.rate = RateCap(client, sink, settings.transport.key_prefix, rate) if rate else None

    @property
    def batch_rows(self) -> int:
        """``batch_rows``, at most half a second's worth under a rate cap (even, not bursts)."""
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

    def send(self, batch, report: PartitionReport) -> None:
        """Insert a batch of ``(queue, Item)``, counting the rows stored and already stored."""
        by_queue: dict = {}
        for name, item in batch:
            limits = self.queue(name).task_limits  # a task the queue limits: under its limit
            if limits and item.task and TASK_TENANT_PREFIX + item.task in limits:
                item = replace(item, tenant=TASK_TENANT_PREFIX + item.task)
            by_queue.setdefault(name, []).append(item)
        for name, items in by_queue.items():
            self._insert(self.queue(name), items, report)

    def _insert(self, q, items: list, report: PartitionReport) -> None:
        """``insert_many`` of ``items`` into ``q``, a full queue's refusal handled as ``on_full``
        says. A refused call stored nothing; the pipeline's other calls count as sent."""
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
                wait, reject = self.settings.full_wait_seconds, self.on_full == "reject"
                if reject or now - since >= wait:
                    why = ", and on_full='reject'" if reject else f"; no row found room for full_wait_seconds={wait:g}"
                    raise QueueStillFull(
                        f"celery_pq writer: {exc}{why}: partition {report.partition} stored "
                        f"{report.sent + report.already_stored} rows, not the {len(items)} refused nor "
                        f"those after them (the Spark task fails; the rows stored stay stored)"
                    ) from None
                # room for this many entries, as the refusal counted it: smaller calls fit in
                chunk = max(1, min(self.settings.chunk, exc.limit - exc.size))
                time.sleep(pause)
                pause = min(pause * 2, longest) if not done else FULL_BACKOFF[0]
                continue
            again = sum(repeated)
            report.already_stored += again
            report.sent += len(items) - again
            return


def write_partition(rows: TaskRows, iterator, sink: Sink, report: PartitionReport, *, hooks=None):
    """Build and send the partition's next rows (after ``rows.position``) batch by batch, counting
    in ``report``. ``hooks`` (``record.Progress``), if given: ``see(row)`` for every row,
    ``begin(end)`` before a batch is sent and ``done(end)`` after."""
    s = sink.settings
    batch: list = []
    start = position = rows.position + 1
    now = time.time()
    limit = sink.batch_rows

    def flush():
        nonlocal batch, start, now
        if sink.rate is not None and batch:
            sink.rate.take(len(batch))
        if hooks is not None:
            hooks.begin(position)
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
