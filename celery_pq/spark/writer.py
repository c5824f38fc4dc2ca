"""The ``celery_pq`` data source of PySpark's Python Data Source API: a batch writer that turns
every row of a DataFrame into a Celery task message in a celery-pq queue.

Each Spark task (one partition) opens one client of the broker, as the transport opens its own
(one server, Sentinel's master, or a Redis Cluster: ``WriterSettings.client``), builds its rows'
messages (``rows.TaskRows``) and inserts them ``batch_rows`` at a time with
``PriorityQueue.insert_many``: pipelined insert scripts of ``chunk`` entries each.

Every row has an identity, its task id: the ``task_id`` column, else one derived from the ``key``
columns, else one derived from the write (an id made once on the driver), the partition, the
row's values and how many rows of the partition had the same values before it (the same ids in
any order a retry reads the rows in). Every row is inserted with a publish id made from its task id, so a Spark
task that runs again (a retry after a failure, a speculative copy) stores nothing new for a row
whose id the queue has seen within its ``dedupe_seconds`` window, and the insert says so
(``insert_many(repeats=True)``): the partition counts it as already stored, not as sent. Rejected
rows go back to the driver in the commit messages (at most ``rejects_limit`` per partition, with
exact counts); the driver logs the counts and, with the ``rejects`` option, writes them to that
directory (``read_rejects``).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import os
from collections import Counter
from pathlib import Path

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType, TimestampType

from ..errors import ConfigError
from .rows import TaskRows
from .settings import WriterSettings, close_client
from .sink import PartitionReport, Sink, write_partition

logger = logging.getLogger("celery_pq.spark")

#: Files of a ``rejects`` directory: the counts (JSON) and the rejected rows (JSON lines: each a
#: list of the row's values, then the reason, each value in the JSON form of its column's type,
#: ``json_value``), read back by ``read_rejects``. Data only: reading them runs no code.
SUMMARY_FILE = "summary.json"
REJECTS_FILE = "rejects.jsonl"


class CeleryPQDataSource(DataSource):
    """``df.write.format("celery_pq")``: options in ``celery_pq.spark.settings``."""

    @classmethod
    def name(cls) -> str:
        return "celery_pq"

    def writer(self, schema: StructType, overwrite: bool) -> CeleryPQWriter:
        if overwrite:
            raise ConfigError(
                "format 'celery_pq' only appends tasks to a queue: use .mode(\"append\") "
                "(a queue cannot be overwritten)"
            )
        return CeleryPQWriter(WriterSettings.parse(dict(self.options), schema.fieldNames()), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        """``df.writeStream.format("celery_pq")``: ``stream.CeleryPQStreamWriter``."""
        from .stream import CeleryPQStreamWriter

        if overwrite:
            raise ConfigError(
                "format 'celery_pq' only appends tasks to a queue: use outputMode(\"append\") "
                "(a queue cannot be overwritten)"
            )
        return CeleryPQStreamWriter(WriterSettings.parse(dict(self.options), schema.fieldNames()), schema)


def eta_is_local(schema: StructType) -> bool:
    """Whether the rows' ``eta`` column is Spark's TimestampType, whose values reach Python as naive
    local times (``TaskRows``' ``eta_is_local``)."""
    eta = next((f for f in schema.fields if f.name == "eta"), None)
    return eta is not None and isinstance(eta.dataType, TimestampType)


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


def summarize(reports) -> dict:
    reasons: Counter = Counter()
    for m in reports:
        reasons.update(m.reasons)
    return {
        "rows": sum(m.rows for m in reports),
        "sent": sum(m.sent for m in reports),
        "already_stored": sum(m.already_stored for m in reports),
        "skipped": sum(m.skipped for m in reports),
        "rejected": sum(m.rejected for m in reports),
        "resent": sum(m.resent for m in reports),
        "rejects_kept": sum(len(m.rejects) for m in reports),
        "partitions": len(reports),
        "reasons": dict(reasons.most_common()),
    }


def write_rejects(path: str, summary: dict, rejects: list, schema_json: str) -> None:
    """The ``rejects`` directory: ``summary.json`` (counts, reasons, the DataFrame's schema) and
    ``rejects.jsonl`` (the rejected rows with their reasons, one JSON list a line)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    fields = [f.dataType for f in StructType.fromJson(json.loads(schema_json)).fields] + [T.StringType()]
    tmp = out / f".{REJECTS_FILE}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rejects:
            f.write(json.dumps([json_value(t, v) for t, v in zip(fields, row)]) + "\n")
    os.replace(tmp, out / REJECTS_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps({**summary, "schema": json.loads(schema_json)}, indent=1))


def read_rejected_rows(path: str, schema: StructType) -> list[tuple]:
    """The rows of a ``rejects.jsonl`` (``write_rejects``) as tuples of ``schema``'s Python
    values; ValueError naming the file and line for one that is not such a row."""
    types = [f.dataType for f in schema.fields]
    rows = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):  # (bytes: json.loads reads UTF-8, and says where it is not)
            try:
                values = json.loads(line)
                if not isinstance(values, list) or len(values) != len(types):
                    raise ValueError(f"not a list of {len(types)} values")
                rows.append(tuple(value_of_json(t, v) for t, v in zip(types, values)))
            except (ValueError, TypeError, decimal.InvalidOperation) as exc:
                raise ValueError(f"{path}, line {number}: not a rejected row of this schema ({exc})") from None
    return rows


#: Spark's TIME type, where this PySpark has it (4.1 on)
_TIME = tuple(getattr(T, name) for name in ("TimeType",) if hasattr(T, name))


def json_value(t: T.DataType, v):
    """``v``, a value of Spark type ``t`` as PySpark gives it, as JSON: bytes as base64, a decimal
    as its text, dates, times and timestamps in ISO 8601, intervals in microseconds, a map as a
    list of [key, value], a struct as a list; a value of another type as it is."""
    if v is None:
        return None
    if isinstance(t, T.UserDefinedType):
        return json_value(t.sqlType(), t.serialize(v))
    if isinstance(t, T.BinaryType):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(t, T.DecimalType):
        return str(v)
    if isinstance(t, (T.DateType, T.TimestampType, T.TimestampNTZType, *_TIME)):
        return v.isoformat()
    if isinstance(t, T.DayTimeIntervalType):
        return (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
    if isinstance(t, T.ArrayType):
        return [json_value(t.elementType, x) for x in v]
    if isinstance(t, T.MapType):
        return [[json_value(t.keyType, k), json_value(t.valueType, x)] for k, x in v.items()]
    if isinstance(t, T.StructType):
        items = [v.get(f.name) for f in t.fields] if isinstance(v, dict) else v
        return [json_value(f.dataType, x) for f, x in zip(t.fields, items)]
    if isinstance(t, T.VariantType):
        return [base64.b64encode(v.value).decode("ascii"), base64.b64encode(v.metadata).decode("ascii")]
    return v


def value_of_json(t: T.DataType, v):
    """The value of Spark type ``t`` that ``json_value`` wrote as ``v``."""
    if v is None:
        return None
    if isinstance(t, T.UserDefinedType):
        return t.deserialize(value_of_json(t.sqlType(), v))
    if isinstance(t, T.BinaryType):
        return bytearray(base64.b64decode(v, validate=True))
    if isinstance(t, T.DecimalType):
        return decimal.Decimal(v)
    if isinstance(t, T.DateType):
        return datetime.date.fromisoformat(v)
    if isinstance(t, (T.TimestampType, T.TimestampNTZType)):
        return datetime.datetime.fromisoformat(v)
    if isinstance(t, _TIME):
        return datetime.time.fromisoformat(v)
    if isinstance(t, T.DayTimeIntervalType):
        return datetime.timedelta(microseconds=v)
    if isinstance(t, T.ArrayType):
        return [value_of_json(t.elementType, x) for x in v]
    if isinstance(t, T.MapType):
        return {value_of_json(t.keyType, k): value_of_json(t.valueType, x) for k, x in v}
    if isinstance(t, T.StructType):
        return tuple(value_of_json(f.dataType, x) for f, x in zip(t.fields, v))
    if isinstance(t, T.VariantType):
        return T.VariantVal(base64.b64decode(v[0]), base64.b64decode(v[1]))
    return v
