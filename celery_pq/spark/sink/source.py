"""The ``celery_pq`` data source and its batch writer (``df.write``): each Spark task writes its
partition (``partition.write_partition``); the driver logs the counts and writes the ``rejects``
directory. ``df.writeStream`` is ``stream.py``, the options ``settings.py``. docs/spark.md ("From
DataFrames to tasks", "Every row is a task: identity and exactly once").
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ...storage.errors import ConfigError
from .partition import PartitionReport, PartitionWriter, summarize, write_partition
from .settings import WriterSettings
from .stream import CeleryPQStreamWriter


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
        self._aborted(
            messages,
            "celery_pq writer: write %s failed; %d partitions had finished, %d rows sent by them "
            "(stored rows stay queued; running the write again sends its rows with a task_id or key "
            "once, and every row without one again: it is a new write)",
            self.settings.write_id,
        )


class CeleryPQDataSource(DataSource):
    """``df.write.format("celery_pq")`` and ``df.writeStream.format("celery_pq")``."""

    @classmethod
    def name(cls) -> str:
        return "celery_pq"

    def writer(self, schema: StructType, overwrite: bool) -> CeleryPQWriter:
        return CeleryPQWriter(self._settings(schema, overwrite, '.mode("append")'), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> CeleryPQStreamWriter:
        return CeleryPQStreamWriter(self._settings(schema, overwrite, 'outputMode("append")'), schema)

    def _settings(self, schema: StructType, overwrite: bool, append: str) -> WriterSettings:
        if overwrite:
            raise ConfigError(
                f"format 'celery_pq' only appends tasks to a queue: use {append} (a queue cannot be overwritten)"
            )
        return WriterSettings.parse(dict(self.options), schema.fieldNames())
