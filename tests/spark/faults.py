"""A write's Spark task failing mid-partition, injected from outside the product: the
``celery_pq`` data source with the rows Spark hands each writer wrapped, so that a partition's
attempt fails after a given number of rows, as when the stage before the write fails (or its
executor is lost) in the middle of the partition.

``FailingDataSource`` is the ``celery_pq`` format (registered by the ``failing_writes`` fixture)
with two options of its own, taken before the writer reads its options:

- ``fail_after``: the first attempt of each partition fails when the writer asks for the row
  after that many. The writer stores its rows ``batch_rows`` at a time and before it reads the
  next one, so with ``batch_rows`` dividing ``fail_after`` that many rows were stored when it
  fails (a streaming sink has recorded them as handled too);
- ``fail_markers``: a directory. A failed attempt appends its attempt number to the file
  ``failed-<partition>`` there, and a partition whose file exists does not fail again (its first
  attempt of the write, or of the query, failed), unless the directory holds a file ``hold``:
  then every attempt fails, Spark gives up and the write or the streaming query fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

from celery_pq.spark.sink.source import CeleryPQDataSource


@dataclass(frozen=True)
class Fault:
    after: int
    markers: str

    @classmethod
    def take(cls, options: dict) -> tuple[Fault | None, dict]:
        """The fault ``options`` ask for (None: none), and the options without its own."""
        rest = {k: v for k, v in options.items() if k.lower() not in ("fail_after", "fail_markers")}
        given = {k.lower(): v for k, v in options.items() if k not in rest}
        if not given:
            return None, rest
        return cls(int(given["fail_after"]), given["fail_markers"]), rest

    def rows(self, iterator):
        """The rows of ``iterator``, failing after ``after`` of them as the module says."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        markers = Path(self.markers)
        marker = markers / f"failed-{partition}"
        if marker.exists() and not (markers / "hold").exists():
            yield from iterator
            return
        for n, row in enumerate(iterator):
            if n == self.after:
                with open(marker, "a") as f:
                    f.write(f"{attempt}\n")
                raise RuntimeError(f"injected failure of partition {partition} after {n} rows")
            yield row


def failed_attempts(markers: Path) -> dict[int, list[int]]:
    """{partition: the attempt numbers that failed}, from the marker files."""
    return {
        int(p.name.split("-")[1]): [int(a) for a in p.read_text().split()]
        for p in sorted(markers.iterdir())
        if p.name.startswith("failed-")
    }


class FailingDataSource(CeleryPQDataSource):
    """``format("celery_pq")`` with the options ``fail_after`` and ``fail_markers``."""

    def writer(self, schema, overwrite):
        fault, self.options = Fault.take(dict(self.options))
        writer = super().writer(schema, overwrite)
        return writer if fault is None else FailingWriter(writer, fault)

    def streamWriter(self, schema, overwrite):
        fault, self.options = Fault.take(dict(self.options))
        writer = super().streamWriter(schema, overwrite)
        return writer if fault is None else FailingStreamWriter(writer, fault)


class FailingWriter(DataSourceWriter):
    def __init__(self, writer, fault: Fault):
        self.writer, self.fault = writer, fault

    def write(self, iterator):
        return self.writer.write(self.fault.rows(iterator))

    def commit(self, messages):
        self.writer.commit(messages)

    def abort(self, messages):
        self.writer.abort(messages)


class FailingStreamWriter(DataSourceStreamWriter):
    def __init__(self, writer, fault: Fault):
        self.writer, self.fault = writer, fault

    def write(self, iterator):
        return self.writer.write(self.fault.rows(iterator))

    def commit(self, messages, batchId):
        self.writer.commit(messages, batchId)

    def abort(self, messages, batchId):
        self.writer.abort(messages, batchId)
