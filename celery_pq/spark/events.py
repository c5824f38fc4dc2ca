"""Spark reads the event log: the ``celery_pq_events`` data source, batch and streaming.

Each queue with the event log on appends one entry per state change to a capped Redis stream,
``<key_prefix>:{<queue>}:ev`` (see ``keys.py``; docs/spark.md lists the events). This module
reads those streams as a DataFrame with one typed column per field::

    df = (spark.read.format("celery_pq_events")
          .option("broker", "pq://localhost:6379/0").option("queue", "orders,emails").load())

    stream = (spark.readStream.format("celery_pq_events")
              .option("broker", url).option("queue", "orders").load())

Options: ``broker`` (``pq://``, ``pqs://``, ``redis://`` or ``rediss://`` URL; required),
``queue`` (one name or a comma-separated list; required), ``key_prefix`` (default ``pq``),
``on_gap`` (``warn``, the default, or ``fail``: what to do when events the reader has not read
yet were trimmed by the stream's cap), ``maxEventsPerTrigger`` (streaming: most events per
micro-batch, over all queues).

The stream reader's offset is the last stream id read per queue (``{"orders": "1700000000000-3"}``),
so a query restarted from its checkpoint goes on after the last event it committed: no gap and no
repeat. The stream is capped (``XADD ... MAXLEN ~``): a reader that falls further behind than the
cap finds the events it had not read yet trimmed. They are gone; the reader detects it from the
stream's ``max-deleted-entry-id`` and warns (or fails with ``on_gap=fail``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from ..constants import KEY_PREFIX
from ..errors import ConfigError
from ..keys import queue_keys

logger = logging.getLogger("celery_pq.spark.events")

NAME = "celery_pq_events"

#: The columns, in order: (column, stream field, Spark type). ``ts`` is ``ms`` as a timestamp.
COLUMNS = (
    ("event", "e", StringType()),
    ("queue", "q", StringType()),
    ("id", "id", StringType()),
    ("priority", "p", IntegerType()),
    ("rank", "k", IntegerType()),
    ("tenant", "t", StringType()),
    ("consumer", "c", StringType()),
    ("task", "task", StringType()),
    ("deliveries", "n", IntegerType()),
    ("reason", "r", StringType()),
    ("ts", "ms", TimestampType()),
    ("ms", "ms", LongType()),
    ("sid", None, StringType()),
)
SCHEMA = StructType([StructField(name, kind, True) for name, _, kind in COLUMNS])
INT_FIELDS = frozenset({"p", "k", "n", "ms"})

#: Stream entries fetched per XRANGE call: big enough to amortise the round trip, small enough
#: that a reply stays a few megabytes.
PAGE = 5000
ON_GAP = ("warn", "fail")
SCHEMES = {"pq": "redis", "pqs": "rediss", "redis": "redis", "rediss": "rediss"}


class EventLogGap(Exception):
    """Events the reader had not read yet were trimmed from the capped stream (``on_gap=fail``)."""


# -- options --------------------------------------------------------------------------------------

def redis_url(url) -> str:
    """A ``pq://``/``pqs://``/``redis://``/``rediss://`` broker URL as the redis-py URL of the same
    Redis; ConfigError naming the value otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"option 'broker' is required: a pq:// or redis:// URL, got {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"option 'broker' must be a pq://, pqs://, redis:// or rediss:// URL, got {url!r}")
    return urlunsplit((SCHEMES[parts.scheme],) + tuple(parts[1:]))


def queue_names(value) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; ConfigError when there is no name."""
    names = [n.strip() for n in str(value or "").split(",") if n.strip()]
    if not names:
        raise ConfigError(f"option 'queue' is required: a queue name or a comma-separated list, got {value!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"option 'queue' names a queue twice: {value!r}")
    return names


def events_key(queue: str, key_prefix: str = KEY_PREFIX) -> str:
    """The stream key of ``queue``'s event log."""
    keys = queue_keys(queue, key_prefix)
    return getattr(keys, "ev", None) or keys.stem + "ev"  # TODO(merge): keys.ev only


@dataclass(frozen=True)
class Settings:
    url: str  # redis-py URL
    queues: tuple[str, ...]
    key_prefix: str
    on_gap: str
    max_events: int | None  # maxEventsPerTrigger

    @classmethod
    def parse(cls, options) -> "Settings":
        opts = {k.lower(): v for k, v in dict(options).items()}
        prefix = opts.get("key_prefix", KEY_PREFIX)
        if not prefix:
            raise ConfigError("option 'key_prefix' must be a non-empty string")
        on_gap = opts.get("on_gap", "warn")
        if on_gap not in ON_GAP:
            raise ConfigError(f"option 'on_gap' must be one of {ON_GAP}, got {on_gap!r}")
        max_events = opts.get("maxeventspertrigger")
        if max_events is not None:
            try:
                max_events = int(max_events)
            except ValueError:
                max_events = 0
            if max_events < 1:
                raise ConfigError(f"option 'maxEventsPerTrigger' must be a positive integer, "
                                  f"got {opts['maxeventspertrigger']!r}")
        return cls(redis_url(opts.get("broker")), tuple(queue_names(opts.get("queue"))), prefix, on_gap, max_events)

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=30)

    def key(self, queue: str) -> str:
        return events_key(queue, self.key_prefix)


# -- stream ids and rows --------------------------------------------------------------------------

def parse_sid(sid: str) -> tuple[int, int]:
    ms, _, seq = sid.partition("-")
    return int(ms), int(seq or 0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def row(sid, fields: dict) -> tuple:
    """One stream entry (id, {field: value}) as a tuple in ``COLUMNS`` order; empty fields are
    null, numbers are ints, ``ts`` is a UTC datetime."""
    from datetime import datetime, timezone

    f = {_text(k): _text(v) for k, v in fields.items()}
    out = []
    for name, field, _ in COLUMNS:
        if field is None:
            out.append(_text(sid))
            continue
        value = f.get(field, "")
        if value == "":
            out.append(None)
        elif name == "ts":
            out.append(datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc))
        elif field in INT_FIELDS:
            out.append(int(value))
        else:
            out.append(value)
    return tuple(out)


def scan(client, key: str, after: str | None, upto: str, page: int = PAGE):
    """Entries of stream ``key`` with ids after ``after`` (exclusive; None: from the start) up to
    ``upto`` (inclusive), in id order, fetched ``page`` at a time."""
    lo = "-" if after is None else "(" + after
    while True:
        batch = client.xrange(key, lo, upto, count=page)
        yield from batch
        if len(batch) < page:
            return
        lo = "(" + _text(batch[-1][0])


def stream_info(client, key: str) -> dict:
    """``last`` (id of the newest entry, None when empty), ``trimmed`` (the highest id trimmed or
    deleted so far, "0-0" when none), ``length``."""
    try:
        info = client.xinfo_stream(key)
    except Exception as exc:  # a missing key: no events yet
        if "no such key" in str(exc).lower():
            return {"last": None, "trimmed": "0-0", "length": 0}
        raise
    last = info.get("last-entry")
    return {
        "last": _text(last[0]) if last else None,
        "trimmed": _text(info.get("max-deleted-entry-id", "0-0")),
        "length": int(info.get("length", 0)),
    }


def check_gap(queue: str, after: str | None, info: dict, on_gap: str) -> str | None:
    """A message when events after ``after`` (None: from the start) were trimmed before they were
    read; raises EventLogGap instead with ``on_gap="fail"``."""
    trimmed = info["trimmed"]
    if trimmed == "0-0" or (after is not None and parse_sid(trimmed) <= parse_sid(after)):
        return None
    since = "the start of the log" if after is None else f"event {after}"
    message = (f"event log of queue {queue!r}: events after {since} up to {trimmed} were trimmed by the "
               f"stream's cap before they were read; they are lost")
    if on_gap == "fail":
        raise EventLogGap(message)
    logger.warning(message)
    return message


# -- the data source ------------------------------------------------------------------------------

class EventsPartition(InputPartition):
    """One queue's events after ``after`` (exclusive; None: from the start) up to ``upto``."""

    def __init__(self, queue: str, key: str, after: str | None, upto: str):
        super().__init__((queue, key, after, upto))
        self.queue, self.key, self.after, self.upto = queue, key, after, upto


class EventsDataSource(DataSource):
    """``celery_pq_events``: the event logs of one or more queues (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> "EventsBatchReader":
        return EventsBatchReader(Settings.parse(self.options))

    def streamReader(self, schema: StructType) -> "EventsStreamReader":
        return EventsStreamReader(Settings.parse(self.options))


def _read(settings: Settings, partition: EventsPartition):
    client = settings.client()
    try:
        for sid, fields in scan(client, partition.key, partition.after, partition.upto):
            yield row(sid, fields)
    finally:
        client.close()


class EventsBatchReader(DataSourceReader):
    """The events in the streams when the query is planned (later events are not read)."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def partitions(self) -> list[EventsPartition]:
        client = self.settings.client()
        try:
            parts = []
            for queue in self.settings.queues:
                info = stream_info(client, self.settings.key(queue))
                check_gap(queue, None, info, self.settings.on_gap)
                if info["last"] is not None:
                    parts.append(EventsPartition(queue, self.settings.key(queue), None, info["last"]))
        finally:
            client.close()
        return parts or [EventsPartition("", "", None, "-")]  # an empty read still needs a partition

    def read(self, partition: EventsPartition):
        if not partition.key:
            return iter(())
        return _read(self.settings, partition)


try:  # Trigger.AvailableNow support (PySpark >= 4.2)
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark 4
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


class EventsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{queue: last stream id read}`` ("0-0" before the first event)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.target: dict | None = None  # Trigger.AvailableNow: the offset to stop at
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.settings.client()
        return self._client

    def initialOffset(self) -> dict:
        return {q: "0-0" for q in self.settings.queues}

    def _latest(self) -> dict:
        out = {}
        for queue in self.settings.queues:
            last = self.client.xrevrange(self.settings.key(queue), "+", "-", count=1)
            out[queue] = _text(last[0][0]) if last else "0-0"
        return out

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def getDefaultReadLimit(self):
        if self.settings.max_events and ReadMaxRows is not None:
            return ReadMaxRows(self.settings.max_events)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def reportLatestOffset(self):
        return self._latest()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        start = {**self.initialOffset(), **(start or {})}
        end = self.target if self.target is not None else self._latest()
        end = {q: max(end[q], start[q], key=parse_sid) for q in self.settings.queues}
        budget = getattr(limit, "max_rows", None)
        if budget is None:
            return end
        # At most ``budget`` events in all, taken queue by queue: ids of the entries up to the
        # budget, never past ``end``.
        out = dict(start)
        for queue in self.settings.queues:
            if budget <= 0 or end[queue] == start[queue]:
                continue
            after = None if start[queue] == "0-0" else start[queue]
            lo = "-" if after is None else "(" + after
            batch = self.client.xrange(self.settings.key(queue), lo, end[queue], count=budget)
            if batch:
                out[queue] = _text(batch[-1][0])
                budget -= len(batch)
        return out

    def partitions(self, start: dict, end: dict) -> list[EventsPartition]:
        start = {**self.initialOffset(), **(start or {})}
        parts = []
        for queue in self.settings.queues:
            a, b = start[queue], end.get(queue, start[queue])
            if a == b:
                continue
            after = None if a == "0-0" else a
            check_gap(queue, after, stream_info(self.client, self.settings.key(queue)), self.settings.on_gap)
            parts.append(EventsPartition(queue, self.settings.key(queue), after, b))
        return parts

    def read(self, partition: EventsPartition):
        return _read(self.settings, partition)

    def commit(self, end: dict) -> None:
        pass  # the stream is capped by its writers; a reader removes nothing

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
