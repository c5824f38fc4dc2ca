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

Two more, for a plan of attempts (without ``fail_after``; ``fail_markers`` records the failures):

- ``fail_plan``: ``attempt:rows[,attempt:rows...]``: that attempt of each partition fails when
  the writer asks for the row after that many (the other attempts read every row);
- ``make_room``: a queue's name: before an attempt after the first reads its first row, the
  queue's waiting entries are leased (by a consumer that never acks them: they stay stored), so
  that a queue at its ``max_length``, which failed the first attempt mid-batch (``on_full``
  "reject"), has room again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

from celery_pq.spark.sink.source import CeleryPQDataSource

#: The options a fault takes (the writer never sees them).
FAULT_OPTIONS = ("fail_after", "fail_markers", "fail_plan", "make_room")


@dataclass(frozen=True)
class Fault:
    after: int | None
    markers: str
    #: {attempt: rows}, from ``fail_plan`` (None: ``after`` and the markers decide).
    plan: dict | None = None
    #: (broker, key_prefix, queue), from ``make_room`` and the writer's options.
    room: tuple[str, str, str] | None = None

    @classmethod
    def take(cls, options: dict) -> tuple[Fault | None, dict]:
        """The fault ``options`` ask for (None: none), and the options without its own."""
        rest = {k: v for k, v in options.items() if k.lower() not in FAULT_OPTIONS}
        given = {k.lower(): v for k, v in options.items() if k not in rest}
        if not given:
            return None, rest
        plan = None
        if "fail_plan" in given:
            plan = {int(a): int(n) for a, n in (p.split(":") for p in given["fail_plan"].split(","))}
        room = None
        if "make_room" in given:
            lowered = {k.lower(): v for k, v in rest.items()}
            room = (lowered["broker"], lowered.get("key_prefix", ""), given["make_room"])
        after = int(given["fail_after"]) if "fail_after" in given else None
        return cls(after, given["fail_markers"], plan, room), rest

    def rows(self, iterator):
        """The rows of ``iterator``, failing after ``after`` of them as the module says."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        markers = Path(self.markers)
        marker = markers / f"failed-{partition}"
        if self.room is not None and attempt > 0:
            self._make_room()
        if self.plan is not None:
            after = self.plan.get(attempt)
        elif marker.exists() and not (markers / "hold").exists():
            after = None
        else:
            after = self.after
        if after is None:
            yield from iterator
            return
        for n, row in enumerate(iterator):
            if n == after:
                with open(marker, "a") as f:
                    f.write(f"{attempt}\n")
                raise RuntimeError(f"injected failure of partition {partition} after {n} rows")
            yield row

    def _make_room(self) -> None:
        """Lease every waiting entry of the queue (for an hour, never acked)."""
        import redis

        from celery_pq.queue import QueueSettings, open_queue

        assert self.room is not None
        broker, prefix, name = self.room
        client = redis.Redis.from_url("redis://" + broker.split("://", 1)[1])
        try:
            queue = open_queue(client, name, QueueSettings(key_prefix=prefix), declare=False)
            while queue.pop(50, lease_seconds=3600):
                pass
        finally:
            client.close()


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
