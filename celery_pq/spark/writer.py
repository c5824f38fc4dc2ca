"""The ``celery_pq`` data source of PySpark's Python Data Source API: a batch writer that turns
every row of a DataFrame into a Celery task message in a celery-pq queue.

Each Spark task (one partition) opens one client of the broker, as the transport opens its own
(one server, Sentinel's master, or a Redis Cluster: ``WriterSettings.client``), builds its rows'
messages (``rows.TaskRows``) and inserts them ``batch_rows`` at a time with
``PriorityQueue.insert_many``: pipelined insert scripts of ``chunk`` entries each.

Every row has an identity, its task id: the ``task_id`` column, else one derived from the ``key``
columns, else one derived from the write (an id made once on the driver), the partition and the
row's position in it. Every row is inserted with a publish id made from its task id, so a Spark
task that runs again (a retry after a failure, a speculative copy) stores nothing new for a row
whose id the queue has seen within its ``dedupe_seconds`` window, and the insert says so
(``insert_many(repeats=True)``): the partition counts it as already stored, not as sent. Rejected
rows go back to the driver in the commit messages (at most ``rejects_limit`` per partition, with
exact counts); the driver logs the counts and, with the ``rejects`` option, writes them to that
directory (``read_rejects``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType, TimestampType

from ..errors import ConfigError
from ..queue import open_queue
from ..routing import RoutingTables
from .rows import Rejected, TaskRows
from .settings import WriterSettings, close_client

logger = logging.getLogger("celery_pq.spark")

#: Files of a ``rejects`` directory: the counts (JSON) and the rejected rows (a pickled list of
#: tuples: the row's values, then the reason), read back by ``read_rejects``.
SUMMARY_FILE = "summary.json"
REJECTS_FILE = "rejects.pickle"


@dataclass
class PartitionReport(WriterCommitMessage):
    """What one Spark task did with its rows: sent (stored by it), already stored (the queue had
    seen the row's publish id: stored by an earlier attempt of this task, or by an earlier write
    of the same ``task_id`` or ``key``), rejected (with the first ``rejects_limit`` rows and every
    reason counted). ``rows == sent + already_stored + rejected``."""

    partition: int
    attempt: int
    rows: int = 0
    sent: int = 0
    already_stored: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    rejects: list = field(default_factory=list)


class CeleryPQDataSource(DataSource):
    """``df.write.format("celery_pq")``: options in ``celery_pq.spark.settings``."""

    @classmethod
    def name(cls) -> str:
        return "celery_pq"

    def writer(self, schema: StructType, overwrite: bool) -> CeleryPQWriter:
        if overwrite:
            raise ConfigError("format 'celery_pq' only appends tasks to a queue: use .mode(\"append\") "
                              "(a queue cannot be overwritten)")
        return CeleryPQWriter(WriterSettings.parse(dict(self.options), schema.fieldNames()), schema)


class CeleryPQWriter(DataSourceWriter):
    def __init__(self, settings: WriterSettings, schema: StructType):
        self.settings = settings
        self.schema_json = schema.json()
        eta = next((f for f in schema.fields if f.name == "eta"), None)
        self.eta_is_local = eta is not None and isinstance(eta.dataType, TimestampType)

    # -- on the executors ----------------------------------------------------------------------
    def write(self, iterator) -> PartitionReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        report = PartitionReport(ctx.partitionId() if ctx else 0, ctx.attemptNumber() if ctx else 0)
        s = self.settings
        client = s.client()
        try:
            sink = _Sink(client, s)
            rows = TaskRows(s, partition=report.partition, eta_is_local=self.eta_is_local)
            batch: list = []
            now = time.time()
            for row in iterator:
                report.rows += 1
                try:
                    batch.append(rows.build(row, now))
                except Rejected as exc:
                    reason = str(exc)
                    if s.on_reject == "fail":
                        raise Rejected(f"celery_pq writer: a row was rejected ({reason}) and on_reject='fail': "
                                       f"{report.sent + report.already_stored} rows of partition "
                                       f"{report.partition} were stored before it, the rest of it was not") from None
                    report.rejected += 1
                    report.reasons[reason] += 1
                    if len(report.rejects) < s.rejects_limit:
                        report.rejects.append((*row, reason))
                if len(batch) >= s.batch_rows:
                    sink.send(batch, report)
                    batch = []
                    now = time.time()
                    self._test_failure(report)
            sink.send(batch, report)
            self._test_failure(report)
        finally:
            close_client(client)
        return report

    def _test_failure(self, report: PartitionReport) -> None:
        """Tests only (options test_fail_once_after and test_fail_once_marker): the first attempt
        of each partition fails once after sending that many rows, as an executor lost mid-write."""
        s = self.settings
        done = report.sent + report.already_stored
        if s.test_fail_once_after is None or done < s.test_fail_once_after:
            return
        marker = Path(s.test_fail_once_marker or ".") / f"failed-{report.partition}"
        if not marker.exists():
            marker.touch()
            raise RuntimeError(f"test failure of partition {report.partition} after {done} rows")

    # -- on the driver -------------------------------------------------------------------------
    def commit(self, messages) -> None:
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        summary = {**summarize(reports), "write_id": self.settings.write_id}
        log = logger.warning if summary["rejected"] else logger.info
        log("celery_pq writer: write %s: %d rows, %d sent, %d already stored, %d rejected%s", summary["write_id"],
            summary["rows"], summary["sent"], summary["already_stored"], summary["rejected"],
            "".join(f"; {n} x {r}" for r, n in list(summary["reasons"].items())[:5]))
        if self.settings.rejects:
            write_rejects(self.settings.rejects, summary, [r for m in reports for r in m.rejects], self.schema_json)

    def abort(self, messages) -> None:
        reports = [m for m in messages if isinstance(m, PartitionReport)]
        logger.error("celery_pq writer: write %s failed; %d partitions had finished, %d rows sent by them "
                     "(stored rows stay queued; running the write again sends its rows with a task_id or key "
                     "once, and every row without one again: it is a new write)",
                     self.settings.write_id, len(reports), sum(m.sent for m in reports))


class _Sink:
    """One partition's connection and queues: batches in, pipelined insert calls out."""

    def __init__(self, client, settings: WriterSettings):
        self.client = client
        self.settings = settings
        self.queues: dict = {}
        self.routing = RoutingTables(client, settings.transport)

    def queue(self, name):
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = open_queue(self.client, name, self.settings.transport.queue_settings(name))
            self.routing.add_queue(name)  # declared, as a Celery producer's queue is (pq stats lists it)
        return q

    def send(self, batch, report: PartitionReport) -> None:
        """Insert a batch of ``(queue, StoredItem)``, counting in ``report`` the rows stored and
        those the queue had already (their publish ids seen)."""
        by_queue: dict = {}
        for name, item in batch:
            by_queue.setdefault(name, []).append(item.as_tuple())
        for name, items in by_queue.items():
            _, repeated = self.queue(name).insert_many(items, chunk=self.settings.chunk, repeats=True)
            again = sum(repeated)
            report.already_stored += again
            report.sent += len(items) - again


def summarize(reports) -> dict:
    reasons: Counter = Counter()
    for m in reports:
        reasons.update(m.reasons)
    return {
        "rows": sum(m.rows for m in reports),
        "sent": sum(m.sent for m in reports),
        "already_stored": sum(m.already_stored for m in reports),
        "rejected": sum(m.rejected for m in reports),
        "rejects_kept": sum(len(m.rejects) for m in reports),
        "partitions": len(reports),
        "reasons": dict(reasons.most_common()),
    }


def write_rejects(path: str, summary: dict, rejects: list, schema_json: str) -> None:
    """The ``rejects`` directory: ``summary.json`` (counts, reasons, the DataFrame's schema) and
    ``rejects.pickle`` (the rejected rows with their reasons)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{REJECTS_FILE}.{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(rejects, f)
    os.replace(tmp, out / REJECTS_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps({**summary, "schema": json.loads(schema_json)}, indent=1))
