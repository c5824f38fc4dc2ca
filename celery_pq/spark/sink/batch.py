"""The batch writer of the ``celery_pq`` data source: each Spark task writes its partition
(``partition.write_partition``); the driver logs the counts and writes the ``rejects`` directory.
docs/spark.md ("Every row is a task: identity and exactly once").
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceWriter

from .partition import PartitionReport, PartitionWriter, summarize, write_partition

logger = logging.getLogger("celery_pq.spark")


class CeleryPQWriter(PartitionWriter, DataSourceWriter):
    # -- on the executors ----------------------------------------------------------------------
    def write(self, iterator) -> PartitionReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        report = PartitionReport(ctx.partitionId() if ctx else 0, ctx.attemptNumber() if ctx else 0)
        s = self.settings
        with self._sink(s, report, sink=s.write_id, on_full="reject") as (sink, rows):
            return write_partition(rows, iterator, sink, report)

    # -- on the driver -------------------------------------------------------------------------
    def commit(self, messages) -> None:
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        summary = {**summarize(reports), "write_id": self.settings.write_id}
        self._finish(
            reports,
            summary,
            self.settings.rejects,
            bool(summary["rejected"]),
            "celery_pq writer: write %s: %d rows, %d sent, %d already stored, %d rejected",
            *(summary[k] for k in ("write_id", "rows", "sent", "already_stored", "rejected")),
        )

    def abort(self, messages) -> None:
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        logger.error(
            "celery_pq writer: write %s failed; %d partitions had finished, %d rows sent by them "
            "(stored rows stay queued; running the write again sends its rows with a task_id or key "
            "once, and every row without one again: it is a new write)",
            self.settings.write_id,
            len(reports),
            sum(m.sent for m in reports),
        )
