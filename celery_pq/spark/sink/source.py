"""The ``celery_pq`` data source and its batch writer, ``df.write`` (``df.writeStream`` is
``stream.py``). docs/spark.md ("From DataFrames to tasks")."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ...storage.errors import ConfigError
from .partition import PartitionReport, PartitionWriter, write_partition
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
        self._finish(
            messages,
            self.settings.rejects,
            "celery_pq writer: write %(write_id)s: %(rows)d rows, %(sent)d sent, %(already_stored)d already "
            "stored, %(rejected)d rejected",
            ("rejected",),
            write_id=self.settings.write_id,
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
