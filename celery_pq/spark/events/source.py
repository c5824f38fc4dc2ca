"""The ``celery_pq_events`` data source: queues' event logs (capped Redis streams) as a DataFrame,
batch or streaming. docs/spark.md ("Reading the log")."""

from __future__ import annotations

from functools import cached_property

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from .log import COLUMNS, Settings, as_text, check_gap, parse_sid, row, scan, stream_info, trimmed

_TYPES = {"string": StringType(), "int": IntegerType(), "bigint": LongType(), "timestamp": TimestampType()}
SCHEMA = StructType([StructField(name, _TYPES[kind], True) for name, _, kind in COLUMNS])


class EventsPartition(InputPartition):
    """One queue's events after ``after`` (exclusive; None: from the start) up to ``upto``."""

    def __init__(self, queue: str, key: str, after: str | None, upto: str):
        super().__init__((queue, key, after, upto))
        self.queue, self.key, self.after, self.upto = queue, key, after, upto


class EventsDataSource(DataSource):
    """``celery_pq_events``: the event logs of one or more queues."""

    @classmethod
    def name(cls) -> str:
        return "celery_pq_events"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> EventsBatchReader:
        return EventsBatchReader(Settings.parse(self.options))

    def streamReader(self, schema: StructType) -> EventsStreamReader:
        return EventsStreamReader(Settings.parse(self.options))


def _read(reader, partition: InputPartition):
    """Both readers' ``read``: the rows of a partition (none for the keyless one of an empty read)."""
    assert isinstance(partition, EventsPartition)
    if not partition.key:
        return
    with reader.settings.client() as client:
        for sid, fields in scan(client, partition.key, partition.after, partition.upto):
            yield row(sid, fields)


class EventsBatchReader(DataSourceReader):
    """The events in the streams when the query is planned (later events are not read)."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def partitions(self) -> list[EventsPartition]:
        parts = []
        with self.settings.client() as client:
            for queue in self.settings.queues:
                info = stream_info(client, self.settings.key(queue))
                check_gap(queue, None, 0, info, self.settings.on_gap)
                if info["last"] is not None:
                    parts.append(EventsPartition(queue, self.settings.key(queue), None, info["last"]))
        return parts or [EventsPartition("", "", None, "-")]  # an empty read still needs a partition

    read = _read


try:  # Trigger.AvailableNow support (PySpark >= 4.2)
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

    READ_LIMITS = True
except ImportError:  # pragma: no cover - older PySpark 4
    READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]  # a stand-in for what older PySpark lacks
        pass


class EventsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{queue: {"sid": id of the last event read, "n": its position}}`` ("0-0", 0
    before the first); the position counts from the first event ever added (``log.trimmed``)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.target: dict | None = None  # Trigger.AvailableNow: the offset to stop at

    @cached_property
    def client(self):
        return self.settings.client()

    def initialOffset(self) -> dict:
        # "latest": a new query reads only what is logged from now on
        return self._latest() if self.settings.starting == "latest" else self._earliest()

    def _earliest(self) -> dict:
        return {q: {"sid": "0-0", "n": 0} for q in self.settings.queues}

    def _start(self, start: dict | None) -> dict:  # a queue added since the checkpoint: from its start
        return {**self._earliest(), **(start or {})}

    def _latest(self) -> dict:
        infos = {q: stream_info(self.client, self.settings.key(q)) for q in self.settings.queues}
        return {q: {"sid": info["last"] or "0-0", "n": info["added"]} for q, info in infos.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def getDefaultReadLimit(self):
        if not READ_LIMITS:
            return None
        if self.settings.max_events:
            return ReadMaxRows(self.settings.max_events)
        return ReadAllAvailable()

    reportLatestOffset = _latest

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        start = self._start(start)
        latest = self._latest()
        if self.target is not None:  # never past the target of Trigger.AvailableNow
            latest = {q: min(latest[q], self.target[q], key=lambda o: parse_sid(o["sid"])) for q in latest}
        budget = getattr(limit, "max_rows", None)
        out = {}
        for queue in self.settings.queues:
            a, b = start[queue], latest[queue]
            out[queue] = a
            if parse_sid(b["sid"]) <= parse_sid(a["sid"]):
                continue
            if budget is None:
                out[queue] = b
            elif budget > 0:
                lo = "-" if a["sid"] == "0-0" else "(" + a["sid"]
                batch = self.client.xrange(self.settings.key(queue), lo, b["sid"], count=budget)
                if batch:
                    # Positions continue from the start's, or from the oldest entry left if the
                    # events after the start were trimmed meanwhile (partitions() reports that gap).
                    info = stream_info(self.client, self.settings.key(queue))
                    out[queue] = {"sid": as_text(batch[-1][0]), "n": max(a["n"], trimmed(info)) + len(batch)}
                    budget -= len(batch)
        return out

    def partitions(self, start: dict, end: dict) -> list[EventsPartition]:
        start = self._start(start)
        parts = []
        for queue in self.settings.queues:
            a, b = start[queue], end.get(queue, start[queue])
            if parse_sid(b["sid"]) <= parse_sid(a["sid"]):
                continue
            after = None if a["sid"] == "0-0" else a["sid"]
            check_gap(queue, after, a["n"], stream_info(self.client, self.settings.key(queue)), self.settings.on_gap)
            parts.append(EventsPartition(queue, self.settings.key(queue), after, b["sid"]))
        return parts

    read = _read

    def stop(self) -> None:
        client = self.__dict__.pop("client", None)  # (cached_property's value, if made)
        if client is not None:
            client.close()
