"""``df.writeStream.format("celery_pq")``: a rerun sends rows with a ``task_id`` or ``key`` once by
their ids, and skips the others ``record.py`` says an earlier attempt handled. docs/spark.md
("Each row once, across retries and restarts")."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from itertools import chain, islice

from pyspark.sql.datasource import DataSourceStreamWriter

from ...storage.errors import ConfigError
from .partition import PartitionReport, PartitionWriter, Sink, prune_rate, write_partition
from .record import PartitionState, Progress, RowDigest, SinkRecord, redis_ms

logger = logging.getLogger("celery_pq.spark")

#: The Spark task's local properties naming its query, run (Spark's job group) and micro-batch.
LOCAL_PROPERTIES = ("sql.streaming.queryId", "spark.jobGroup.id", "streaming.sql.batchId")


class CeleryPQStreamWriter(PartitionWriter, DataSourceStreamWriter):
    """``df.writeStream.format("celery_pq")``: options in ``settings.py``."""

    # -- on the executors ----------------------------------------------------------------------
    def write(self, iterator) -> PartitionReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query, run, batch_id = (ctx.getLocalProperty(n) for n in LOCAL_PROPERTIES) if ctx else (None, None, None)
        if ctx is None or not query or not run or batch_id is None:
            raise ConfigError(
                "celery_pq stream writer: the Spark task does not name its streaming query, run and "
                f"micro-batch (local properties {', '.join(LOCAL_PROPERTIES)})"
            )
        batch = int(batch_id)
        report = PartitionReport(ctx.partitionId(), ctx.attemptNumber(), batch=batch, query=query)
        s = replace(self.settings, write_id=f"{query}:{batch}")
        with self._sink(s, report, sink=query, on_full="wait") as (sink, rows):
            if s.key or "task_id" in s.roles:
                return write_partition(rows, iterator, sink, report)  # the queue knows them
            record = SinkRecord(sink.client, query, s.transport.key_prefix, run)
            record.claim()
            progress = Progress(record, batch, report.partition, rows)
            rest = self._replay(record.load(batch, report.partition), iter(iterator), sink, report, progress)
            rows.write_id = f"{query}:{batch}:{run}.{report.attempt}"
            return write_partition(rows, rest, sink, report, hooks=progress)

    def _replay(self, earlier: PartitionState | None, rows_in, sink: Sink, report: PartitionReport, progress: Progress):
        """Skip the segments ``earlier`` handled whose rows have their digest, resend its pending
        one under its identities if they do; the rows left (from the first that differs)."""
        if earlier is None:
            return rows_in
        rows, position = progress.rows, 0
        for end, digest in earlier.segments:
            segment = list(islice(rows_in, end - position))
            if len(segment) < end - position or RowDigest(segment).hexdigest() != digest:
                return self._unmatched(earlier, position, segment, rows_in, report)
            for row in segment:
                rows.skip(row)
            report.rows += len(segment)
            report.skipped += len(segment)
            progress.state.segments.append((end, digest))
            position = end
        if earlier.pending is None:
            if position:
                progress.save()
            return rows_in
        # (saved only when its rows are sent again, still pending (``Progress.begin``): a read
        # failing here leaves it pending, else the next attempt would send it under new identities)
        end, digest, namespace = earlier.pending
        segment = list(islice(rows_in, end - position))
        if len(segment) < end - position or RowDigest(segment).hexdigest() != digest:
            return self._unmatched(earlier, position, segment, rows_in, report)
        self._warn_if_late(report, earlier, position, sink.client)
        rows.write_id = namespace
        write_partition(rows, segment, sink, report, hooks=progress)
        return rows_in

    def _unmatched(self, earlier: PartitionState, position: int, segment: list, rows_in, report: PartitionReport):
        report.resent += earlier.end - position
        logger.warning(
            "celery_pq stream writer: micro-batch %d partition %d: an earlier attempt handled or was "
            "sending rows %d to %d, and this one reads other rows there (a shuffle before the sink, "
            "other file splits): they are sent again under new identities, so those the earlier "
            "attempt had stored are in the queue twice (give the rows a task_id or key to send them once)",
            report.batch,
            report.partition,
            position,
            earlier.end - 1,
        )
        return chain(segment, rows_in)

    def _warn_if_late(self, report: PartitionReport, earlier: PartitionState, start: int, client) -> None:
        age = (redis_ms(client) - earlier.ms) / 1000
        window = self.settings.transport.dedupe_seconds
        if age > window:
            logger.warning(
                "celery_pq stream writer: micro-batch %d partition %d: an earlier attempt stopped %.0f s "
                "ago while sending its rows %d to %d, longer ago than dedupe_seconds=%g: those of "
                "them it had stored are stored again (raise dedupe_seconds above the longest stop "
                "of the query)",
                report.batch,
                report.partition,
                age,
                start,
                earlier.end - 1,
                window,
            )

    # -- on the driver -------------------------------------------------------------------------
    def commit(self, messages, batchId: int) -> None:
        reports = self._finish(
            messages,
            self.settings.rejects and os.path.join(self.settings.rejects, f"batch-{batchId}"),
            "celery_pq stream writer: micro-batch %(batch)d: %(rows)d rows, %(sent)d sent, %(already_stored)d "
            "found already stored, %(skipped)d skipped (recorded as handled), %(rejected)d rejected; %(resent)d "
            "resent (handled by a failed attempt, read in another order)",
            ("rejected", "resent"),
            batch=batchId,
        )
        query = next((m.query for m in reports if m.query), None)
        if query is None:
            return
        # Spark runs batchId once every earlier micro-batch is committed: their records go (this
        # one's stays: Spark runs it again if it fails to log this commit)
        with self.settings.client() as client:
            prefix = self.settings.transport.key_prefix
            SinkRecord(client, query, prefix, run="").prune(batchId)
            if self.settings.rows_per_second:
                prune_rate(client, query, prefix)

    def abort(self, messages, batchId: int) -> None:
        self._aborted(
            messages,
            "celery_pq stream writer: micro-batch %d failed; %d partitions had finished, %d rows "
            "sent by them (they stay queued; the micro-batch's next run skips the rows it reads "
            "as they were, and sends the others)",
            batchId,
        )
