"""The event log's reading side without Spark, for ``source.py`` and ``export.py`` (and the broker
URL check the writer shares). docs/spark.md ("Reading the log"), docs/events.md."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypedDict

from ...storage.constants import KEY_PREFIX
from ...storage.errors import ConfigError
from ...storage.keys import MAX_SHARDS, queue_keys, shard_names
from ...storage.redact import redact

logger = logging.getLogger("celery_pq.spark.eventlog")


def table(text: str) -> tuple[tuple[str, ...], ...]:
    """The lines ``a | b | c`` of ``text`` as tuples ``(a, b, c)``."""
    return tuple(tuple(cell.strip() for cell in line.split("|")) for line in text.strip().splitlines())


#: The columns, in order: (column, stream field, type). ``ts`` is ``ms`` as a UTC timestamp;
#: ``sid`` is the stream entry id ("<ms>-<seq>"), the event's place in its queue's log.
COLUMNS = table("""
    event      | e    | string
    queue      | q    | string
    id         | id   | string
    priority   | p    | int
    rank       | k    | int
    tenant     | t    | string
    consumer   | c    | string
    task       | task | string
    deliveries | n    | int
    reason     | r    | string
    ts         | ms   | timestamp
    ms         | ms   | bigint
    held_ms    | h    | bigint
    sid        |      | string
""")

#: Stream entries per XRANGE call: a round trip amortised, a reply of a few megabytes at most.
PAGE = 5000
ON_GAP = ("warn", "fail")
STARTING = ("earliest", "latest")
SCHEMES = {"pq": "redis", "pqs": "rediss", "redis": "redis", "rediss": "rediss"}


class EventLogGap(Exception):
    """Events the reader had not read yet were trimmed from the capped stream (``on_gap=fail``)."""


def broker_url(value) -> str:
    """Option ``broker`` stripped; ConfigError unless it is a pq://, pqs://, redis:// or rediss:// URL."""
    url = value.strip() if isinstance(value, str) else ""
    if not url:
        raise ConfigError("option 'broker' is required: the broker URL (pq://HOST:PORT/DB)")
    if "://" not in url or url.split("://", 1)[0].lower() not in SCHEMES:
        raise ConfigError(f"option 'broker' must be a pq://, pqs://, redis:// or rediss:// URL, got {redact(url)}")
    return url


def redis_url(url) -> str:
    """Broker URL ``url`` (``broker_url``) as the redis-py URL of the same Redis."""
    scheme, rest = broker_url(url).split("://", 1)
    return f"{SCHEMES[scheme.lower()]}://{rest}"


def queue_names(value) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; ConfigError when there is no name."""
    names = [n.strip() for n in str(value or "").split(",") if n.strip()]
    if not names:
        raise ConfigError(f"option 'queue' is required: a queue name or a comma-separated list, got {value!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"option 'queue' names a queue twice: {value!r}")
    return names


def stream_queues(names, shards=1) -> list[str]:
    """The queues whose streams hold the event log of ``names``: each name, or every shard of it,
    shard 0 first (``shards``: the count, or a function of a name as ``Options.shards_of``)."""
    count = shards if callable(shards) else (lambda _name: shards)
    out: list[str] = []
    for name in names:
        n = count(name)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
            raise ConfigError(f"option 'shards' must be an integer 1..{MAX_SHARDS}, got {n!r}")
        out += [q for q in shard_names(name, n) if q not in out]
    return out


def events_key(queue: str, key_prefix: str = KEY_PREFIX) -> str:
    return queue_keys(queue, key_prefix).events


@dataclass(frozen=True)
class Settings:
    url: str = field(repr=False)  # redis-py URL (it may hold a password: not in the repr)
    queues: tuple[str, ...]  # one per stream: every shard of a sharded queue
    key_prefix: str
    on_gap: str
    max_events: int | None  # maxEventsPerTrigger
    starting: str = "earliest"  # startingPosition of a new streaming query

    @classmethod
    def parse(cls, options) -> Settings:
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
                raise ConfigError(
                    f"option 'maxEventsPerTrigger' must be a positive integer, got {opts['maxeventspertrigger']!r}"
                )
        starting = opts.get("startingposition", "earliest")
        if starting not in STARTING:
            raise ConfigError(f"option 'startingPosition' must be one of {STARTING}, got {starting!r}")
        shards = opts.get("shards", 1)
        try:
            shards = int(shards)
        except (TypeError, ValueError):
            raise ConfigError(f"option 'shards' must be an integer 1..{MAX_SHARDS}, got {shards!r}") from None
        queues = stream_queues(queue_names(opts.get("queue")), shards)
        return cls(redis_url(opts.get("broker")), tuple(queues), prefix, on_gap, max_events, starting)

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=30)

    def key(self, queue: str) -> str:
        return events_key(queue, self.key_prefix)


def parse_sid(sid: str) -> tuple[int, int]:
    ms, _, seq = sid.partition("-")
    return int(ms), int(seq or 0)


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: A column's value of its field's text, by the column's type.
_VALUE_OF: dict[str, Callable[[str], object]] = {
    "string": str,
    "int": int,
    "bigint": int,
    "timestamp": lambda ms: datetime.fromtimestamp(int(ms) / 1000, UTC),
}


def row(sid, fields: dict) -> tuple:
    """One stream entry (id, {field: value}) as a tuple in ``COLUMNS`` order; empty fields are
    null, numbers are ints, ``ts`` is a UTC datetime."""
    f = {as_text(k): as_text(v) for k, v in fields.items()}
    f[""] = as_text(sid)  # the column without a field
    return tuple(_VALUE_OF[kind](f[source]) if f.get(source) else None for _, source, kind in COLUMNS)


def scan(client, key: str, after: str | None, upto: str):
    """Entries of stream ``key`` with ids after ``after`` (exclusive; None: from the start) up to
    ``upto`` (inclusive), in id order, fetched ``PAGE`` at a time."""
    lo = "-" if after is None else "(" + after
    while True:
        batch = client.xrange(key, lo, upto, count=PAGE)
        yield from batch
        if len(batch) < PAGE:
            return
        lo = "(" + as_text(batch[-1][0])


class StreamInfo(TypedDict):
    last: str | None  # id of the newest entry, None when empty
    first: str | None  # id of the oldest entry still there
    added: int  # entries ever added
    length: int  # entries in the stream now


def stream_info(client, key: str) -> StreamInfo:
    """What XINFO STREAM says of ``key`` (nothing yet for a missing key)."""
    try:
        info = client.xinfo_stream(key)
    except Exception as exc:  # a missing key: no events yet
        if "no such key" in str(exc).lower():
            return {"last": None, "added": 0, "length": 0, "first": None}
        raise
    last, first = info.get("last-entry"), info.get("first-entry")
    length = int(info.get("length", 0))
    return {
        "last": as_text(last[0]) if last else None,
        "first": as_text(first[0]) if first else None,
        # Redis < 7 does not count entries added: then no trim can be detected.
        "added": int(info.get("entries-added", length)),
        "length": length,
    }


def trimmed(info: StreamInfo) -> int:
    """Entries trimmed so far: the position (1 = the first ever added) of the entry before the
    oldest still there. Writers trim only from the head (``XADD ... MAXLEN``)."""
    return max(info["added"] - info["length"], 0)


def check_gap(queue: str, after: str | None, position: int, info: StreamInfo, on_gap: str) -> str | None:
    """A message when events after the one read last (``after``, at ``position``; None and 0
    before the first) were trimmed before they were read; EventLogGap with ``on_gap="fail"``."""
    lost = trimmed(info) - position
    if lost <= 0:
        return None
    since = "the start of the log" if after is None else f"event {after}"
    message = (
        f"event log of queue {queue!r}: {lost} event(s) after {since} (up to {info['first'] or 'now'}) "
        f"were trimmed by the stream's cap before they were read; they are lost"
    )
    if on_gap == "fail":
        raise EventLogGap(message)
    logger.warning(message)
    return message
