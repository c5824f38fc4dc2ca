"""The streaming sink of the ``celery_pq`` data source: ``df.writeStream.format("celery_pq")``
with the batch writer's options and a checkpoint location. Every micro-batch is written as a
batch write is (``sink.write_partition``), and each row is enqueued once across Spark's task
retries, a micro-batch run again and a query stopped and restarted from its checkpoint.

How a row is enqueued once:

- its identity, its task id: the ``task_id`` column, else derived from the ``key`` columns,
  else derived from the query's id (kept in the checkpoint: the same after a restart), the
  micro-batch's id, the partition and the row's position in it. Spark runs a micro-batch again
  (after a failure, or after a restart when it was not committed) with the same id and the same
  rows, so a row gets the same task id in every run, and its publish id (made from the task id)
  is stored once within the queue's ``dedupe_seconds`` window;
- a record in Redis of what each partition of each micro-batch has handled (``SinkRecord``,
  key ``keys.sink_record_key``): a run of a micro-batch after the window (a query restarted an
  hour later) skips the rows an earlier run stored, without asking the window. Each batch of
  rows is marked as being sent before its insert and as handled after it; the rows of a mark
  left "being sent" by a run that stopped are sent again with their publish ids, so they are
  stored once when the new run comes within ``dedupe_seconds`` of the old one (a Spark task
  retry, a quick restart); after that, the rows of that one batch (``batch_rows``) that the
  stopped run had stored are stored again, and the sink logs a warning naming them. Raise
  ``dedupe_seconds`` to cover the longest stop of a query;
- the record of a micro-batch is dropped when the next one commits (Spark then never runs it
  again): it holds at most two micro-batches' partitions.

The executors learn the query and the micro-batch from the Spark task's local properties
(``sql.streaming.queryId``, ``streaming.sql.batchId``); the driver's ``commit`` is told the
batch id by Spark and the query's id by the commit messages.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..keys import sink_record_key
from .rows import TaskRows
from .settings import WriterSettings, close_client
from .sink import PartitionReport, Sink, prune_rate, write_partition
from .writer import eta_is_local, summarize, write_rejects

logger = logging.getLogger("celery_pq.spark")

#: The Spark task's local properties naming its streaming query and micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class StreamReport(PartitionReport):
    """A ``PartitionReport`` of one partition of micro-batch ``batch`` of query ``query``."""

    batch: int = -1
    query: str = ""


class SinkRecord:
    """What each partition of each micro-batch of one query has handled, in one Redis hash:
    field ``"<batch>:<partition>"`` -> ``"<n>"`` (its first ``n`` rows handled: stored, found
    stored or rejected) or ``"<n>:<end>:<ms>"`` (as ``"<n>"``, and rows ``n`` to ``end - 1``
    being sent since ``ms``, Unix milliseconds)."""

    def __init__(self, client, query: str, prefix: str):
        self.client = client
        self.key = sink_record_key(query, prefix)

    def read(self, batch: int, partition: int) -> tuple[int, tuple[int, float] | None]:
        """``(rows handled, None or (end, ms) of a batch of rows left being sent))``."""
        value = self.client.hget(self.key, f"{batch}:{partition}")
        if value is None:
            return 0, None
        parts = value.decode().split(":")
        return int(parts[0]), (None if len(parts) == 1 else (int(parts[1]), float(parts[2])))

    def begin(self, batch: int, partition: int, start: int, end: int) -> None:
        self.client.hset(self.key, f"{batch}:{partition}", f"{start}:{end}:{int(time.time() * 1000)}")

    def done(self, batch: int, partition: int, end: int) -> None:
        self.client.hset(self.key, f"{batch}:{partition}", str(end))

    def prune(self, below: int) -> int:
        """Drop the fields of micro-batches before ``below``; how many."""
        old = [f for f in self.client.hkeys(self.key) if int(f.split(b":", 1)[0]) < below]
        return self.client.hdel(self.key, *old) if old else 0


class _Hooks:
    """``write_partition``'s hooks writing one partition's progress to its ``SinkRecord``."""

    def __init__(self, record: SinkRecord, batch: int, partition: int):
        self.record, self.batch, self.partition = record, batch, partition

    def begin(self, start: int, end: int) -> None:
        self.record.begin(self.batch, self.partition, start, end)

    def done(self, end: int) -> None:
        self.record.done(self.batch, self.partition, end)


class CeleryPQStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("celery_pq")``: options in ``celery_pq.spark.settings``."""

    def __init__(self, settings: WriterSettings, schema: StructType):
        self.settings = settings
        self.schema_json = schema.json()
        self.eta_is_local = eta_is_local(schema)

    # -- on the executors ----------------------------------------------------------------------
    def write(self, iterator) -> StreamReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
        if ctx is None or not query or batch_id is None:
            raise ConfigError(
                "celery_pq stream writer: the Spark task does not name its streaming query and "
                f"micro-batch (local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})"
            )
        batch = int(batch_id)
        report = StreamReport(ctx.partitionId(), ctx.attemptNumber(), batch=batch, query=query)
        s = replace(self.settings, write_id=f"{query}:{batch}")  # the rows' identities
        client = s.client()
        try:
            record = SinkRecord(client, query, s.transport.key_prefix)
            handled, pending = record.read(batch, report.partition)
            if pending is not None:
                self._warn_if_late(report, handled, pending)
            sink = Sink(client, s, sink=query, on_full="wait")
            rows = TaskRows(s, partition=report.partition, eta_is_local=self.eta_is_local)
            hooks = _Hooks(record, batch, report.partition)
            return write_partition(rows, iterator, sink, report, skip=handled, hooks=hooks)
        finally:
            close_client(client)

    def _warn_if_late(self, report: StreamReport, handled: int, pending: tuple[int, float]) -> None:
        end, ms = pending
        age = time.time() - ms / 1000
        window = self.settings.transport.dedupe_seconds
        if age > window:
            logger.warning(
                "celery_pq stream writer: micro-batch %d partition %d: an earlier run stopped %.0f s "
                "ago while sending its rows %d to %d, longer ago than dedupe_seconds=%g: those of "
                "them it had stored are stored again (raise dedupe_seconds above the longest stop "
                "of the query)",
                report.batch,
                report.partition,
                age,
                handled,
                end - 1,
                window,
            )

    # -- on the driver -------------------------------------------------------------------------
    def commit(self, messages, batchId: int) -> None:
        reports = [m for m in messages if isinstance(m, StreamReport)]
        summary = summarize(reports)
        log = logger.warning if summary["rejected"] else logger.info
        log(
            "celery_pq stream writer: micro-batch %d: %d rows, %d sent, %d already stored, %d rejected%s",
            batchId,
            summary["rows"],
            summary["sent"],
            summary["already_stored"],
            summary["rejected"],
            "".join(f"; {n} x {r}" for r, n in list(summary["reasons"].items())[:5]),
        )
        if self.settings.rejects and summary["rejected"]:
            write_rejects(
                os.path.join(self.settings.rejects, f"batch-{batchId}"),
                {**summary, "batch": batchId},
                [r for m in reports for r in m.rejects],
                self.schema_json,
            )
        query = next((m.query for m in reports if m.query), None)
        if query is None:
            return
        # Spark runs micro-batch batchId only once every earlier one is committed: their
        # records are no longer needed (this one's is: Spark runs it again when it fails to
        # log this commit)
        client = self.settings.client()
        try:
            SinkRecord(client, query, self.settings.transport.key_prefix).prune(batchId)
            if self.settings.rows_per_second:
                prune_rate(client, query, self.settings.transport.key_prefix, time.time())
        finally:
            close_client(client)

    def abort(self, messages, batchId: int) -> None:
        reports = [m for m in messages if isinstance(m, StreamReport)]
        logger.error(
            "celery_pq stream writer: micro-batch %d failed; %d partitions had finished, %d rows "
            "sent by them (they stay queued; the micro-batch's next run sends each of its rows once)",
            batchId,
            len(reports),
            sum(m.sent for m in reports),
        )
