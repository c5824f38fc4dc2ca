"""The batch writer of the ``celery_pq`` data source: each Spark task writes its partition
(``partition.write_partition``); the driver logs the counts and writes the ``rejects`` directory.
docs/spark.md ("Every row is a task: identity and exactly once").
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from .partition import PartitionReport, Sink, eta_is_local, summarize, write_partition
from .rejects import write_rejects
from .rows import TaskRows
from .settings import WriterSettings, close_client

logger = logging.getLogger("celery_pq.spark")


class CeleryPQWriter(DataSourceWriter):
    def __init__(self, settings: WriterSettings, schema: StructType):
        self.settings = settings
        self.schema_json = schema.json()
        self.eta_is_local = eta_is_local(schema)

    # -- on the executors ----------------------------------------------------------------------
    def write(self, iterator) -> PartitionReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        report = PartitionReport(ctx.partitionId() if ctx else 0, ctx.attemptNumber() if ctx else 0)
        s = self.settings
        client = s.client()
        try:
            sink = Sink(client, s, sink=s.write_id, on_full="reject")
            rows = TaskRows(s, partition=report.partition, eta_is_local=self.eta_is_local)
            return write_partition(rows, iterator, sink, report)
        finally:
            close_client(client)

    # -- on the driver -------------------------------------------------------------------------
    def commit(self, messages) -> None:
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        summary = {**summarize(reports), "write_id": self.settings.write_id}
        log = logger.warning if summary["rejected"] else logger.info
        log(
            "celery_pq writer: write %s: %d rows, %d sent, %d already stored, %d rejected%s",
            summary["write_id"],
            summary["rows"],
            summary["sent"],
            summary["already_stored"],
            summary["rejected"],
            "".join(f"; {n} x {r}" for r, n in list(summary["reasons"].items())[:5]),
        )
        if self.settings.rejects:
            write_rejects(self.settings.rejects, summary, [r for m in reports for r in m.rejects], self.schema_json)

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
