"""The writer's options, checked on the driver before any row is read (``WriterSettings.parse``:
``ConfigError`` naming a missing, unknown or bad one); plain data pickled to the executors, no
pyspark. docs/spark.md ("Options").
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, fields

from ...storage import constants as C
from ...storage.checks import count
from ...storage.errors import ConfigError
from ...storage.redact import redact
from ...transport.options import Options

#: Columns with a meaning of their own when present (docs/spark.md, Columns).
ROLE_COLUMNS = ("priority", "tenant", "task_id", "countdown", "eta", "queue")

#: The queue of a row without a ``queue`` column (or with a null in it): Celery's default.
DEFAULT_QUEUE = "celery"

#: Rows per round trip of pipelined insert calls (``batch_rows``).
BATCH_ROWS = 10_000

#: Rejected rows a partition carries back to the driver with their reasons (``rejects_limit``);
#: the counts are exact beyond it.
REJECTS_LIMIT = 10_000

#: Seconds a write waits for room in a full queue before it fails (``full_wait_seconds``); the
#: wait starts again whenever a row finds room.
FULL_WAIT_SECONDS = 300.0

#: What a write does when the queue is full (``on_full``): wait for room (the streaming sink's
#: default) or fail (the batch writer's).
ON_FULL = ("wait", "reject")

#: The broker's password when the ``broker`` URL has none (an option shows in Spark's plans and
#: UI; this does not). ``enqueue()`` sets it; ``spark.executorEnv`` does on a cluster.
PASSWORD_ENV = "CELERY_PQ_BROKER_PASSWORD"

#: The namespace of task ids derived from a ``key`` column (uuid5), fixed for good: changing it
#: would give every derived id a new value, so a rerun would enqueue its rows again.
KEY_NAMESPACE = uuid.UUID("6f1d1c52-3f0b-5b7e-9a57-2f3c6c1b7a10")

_TRANSPORT_FIELDS = {f.name: f for f in fields(Options) if f.init}
_OWN = {
    "broker",
    "task",
    "args",
    "kwargs",
    "queue",
    "key",
    "job",
    "transport_options",
    "rejects",
    "on_reject",
    "batch_rows",
    "chunk",
    "rejects_limit",
    "on_full",
    "full_wait_seconds",
    "rows_per_second",
    # a streaming query's own option, which Spark hands to the sink too
    "checkpointlocation",
}
ON_REJECT = ("keep", "fail")


def _columns(name: str, value: str | None, schema_names: list[str]) -> tuple[str, ...]:
    """A comma-separated list of column names, each one of the DataFrame's."""
    if value is None:
        return ()
    cols = tuple(c.strip() for c in value.split(","))
    if any(not c for c in cols):
        raise ConfigError(f"option {name!r} must be column names separated by commas, got {value!r}")
    missing = [c for c in cols if c not in schema_names]
    if missing:
        raise ConfigError(
            f"option {name!r} names column(s) {', '.join(map(repr, missing))} that the DataFrame "
            f"does not have (its columns: {', '.join(schema_names)})"
        )
    return cols


def _transport_value(name: str, text: str):
    """A transport option given as a string: JSON (numbers, null, true, objects), else the text
    itself for an option that takes a string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if "str" in str(_TRANSPORT_FIELDS[name].type) and not isinstance(value, (str, type(None))):
        return text  # key_prefix "123" stays a string
    return value


def _positive_option(name: str, text: str | None, default: float | None) -> float | None:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"option {name!r} must be a number > 0, got {text!r}")
    return value


def _int_option(name: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer >= 1, got {text!r}") from None
    return count(f"option {name!r}", value, none=False, error=ConfigError)


@dataclass(frozen=True)
class WriterSettings:
    """Everything one write needs, checked on the driver."""

    broker: str
    task: str
    transport: Options
    args: tuple[str, ...] = ()
    kwargs: tuple[str, ...] = ()
    queue: str = DEFAULT_QUEUE
    key: tuple[str, ...] = ()
    job: str = ""
    rejects: str | None = None
    on_reject: str = "keep"
    batch_rows: int = BATCH_ROWS
    chunk: int = C.BULK_CHUNK
    rejects_limit: int = REJECTS_LIMIT
    #: "wait" or "reject"; None: the writer's default (streaming waits, a batch write fails).
    on_full: str | None = None
    full_wait_seconds: float = FULL_WAIT_SECONDS
    #: Rows per second at most, over all the write's (the query's) Spark tasks; None: no cap.
    rows_per_second: float | None = None
    columns: tuple[str, ...] = ()
    #: The ``ROLE_COLUMNS`` the DataFrame has, and the column ``fair_key`` names if any (a
    #: ``tenant`` column wins over it).
    roles: tuple[str, ...] = ()
    fair_column: str | None = None
    #: Made once per write by ``parse``: part of the identity of a row without ``task_id`` or ``key``.
    write_id: str = ""

    @classmethod
    def parse(cls, options: dict, columns: list[str]) -> WriterSettings:
        """The settings of ``options`` (names in any case) for a DataFrame with ``columns``;
        ConfigError naming the option for anything missing, unknown or bad."""
        given = {str(k).lower(): v for k, v in options.items()}
        if not given.get("path"):
            given.pop("path", None)  # save() without a path
        unknown = sorted(set(given) - _OWN - set(_TRANSPORT_FIELDS) - {"visibility_timeout"})
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for format 'celery_pq' "
                f"(options: broker, task, args, kwargs, queue, key, job, rejects, on_reject, "
                f"batch_rows, chunk, rejects_limit, on_full, full_wait_seconds, rows_per_second, "
                f"transport_options and the transport options)"
            )
        for required in ("broker", "task"):
            if not (given.get(required) or "").strip():
                what = "the broker URL (pq://HOST:PORT/DB)" if required == "broker" else "the Celery task name"
                raise ConfigError(f"option {required!r} is required: {what}")
        broker = given["broker"].strip()
        scheme = broker.split("://", 1)[0].lower() if "://" in broker else ""
        if scheme not in ("pq", "pqs", "redis", "rediss"):
            raise ConfigError(
                f"option 'broker' must be a pq://, pqs://, redis:// or rediss:// URL, got {redact(broker)}"
            )
        transport = {}
        if given.get("transport_options"):
            try:
                transport = json.loads(given["transport_options"])
            except ValueError as exc:
                raise ConfigError(f"option 'transport_options' must be a JSON object: {exc}") from None
            if not isinstance(transport, dict):
                raise ConfigError(
                    f"option 'transport_options' must be a JSON object, got {given['transport_options']!r}"
                )
        for name in _TRANSPORT_FIELDS:
            if name in given:
                transport[name] = _transport_value(name, given[name])
        if "visibility_timeout" in given:
            transport["visibility_timeout"] = _transport_value("lease_seconds", given["visibility_timeout"])
        try:
            opts = Options.from_transport_options(transport)
        except ConfigError as exc:
            raise ConfigError(f"celery_pq writer: {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"celery_pq writer: transport_options: {exc}") from None
        names = list(columns)
        args = _columns("args", given.get("args"), names)
        kwargs = _columns("kwargs", given.get("kwargs"), names)
        key = _columns("key", given.get("key"), names)
        if key and "task_id" in names:
            raise ConfigError("option 'key' derives task ids, but the DataFrame has a task_id column: give one of them")
        queue = given.get("queue") or DEFAULT_QUEUE
        roles = tuple(c for c in ROLE_COLUMNS if c in names)
        fair_column = None
        if opts.fair_key is not None and ":" not in opts.fair_key and opts.fair_key in names:
            fair_column = opts.fair_key
        if "tenant" in roles and opts.fair_key is None:
            raise ConfigError(
                "the DataFrame has a 'tenant' column, and a tenant needs fairness on: give option "
                "'fair_key' (the broker's fair_key transport option, e.g. \"tenant\")"
            )
        on_reject = (given.get("on_reject") or "keep").lower()
        if on_reject not in ON_REJECT:
            raise ConfigError(f"option 'on_reject' must be one of {ON_REJECT}, got {given['on_reject']!r}")
        on_full = given.get("on_full")
        if on_full is not None and on_full.lower() not in ON_FULL:
            raise ConfigError(f"option 'on_full' must be one of {ON_FULL}, got {on_full!r}")
        rate = _positive_option("rows_per_second", given.get("rows_per_second"), None)
        if rate is not None and rate < 1:
            raise ConfigError(f"option 'rows_per_second' must be a number >= 1, got {given['rows_per_second']!r}")
        return cls(
            broker=broker,
            task=given["task"].strip(),
            transport=opts,
            args=args,
            kwargs=kwargs,
            queue=queue,
            key=key,
            job=given.get("job") or given["task"].strip(),
            rejects=given.get("rejects") or None,
            on_reject=on_reject,
            batch_rows=_int_option("batch_rows", given.get("batch_rows"), BATCH_ROWS),
            chunk=_int_option("chunk", given.get("chunk"), C.BULK_CHUNK),
            rejects_limit=_int_option("rejects_limit", given.get("rejects_limit"), REJECTS_LIMIT),
            on_full=None if on_full is None else on_full.lower(),
            full_wait_seconds=_positive_option("full_wait_seconds", given.get("full_wait_seconds"), FULL_WAIT_SECONDS)
            or FULL_WAIT_SECONDS,
            rows_per_second=rate,
            columns=tuple(names),
            roles=roles,
            fair_column=fair_column,
            write_id=uuid.uuid4().hex,
        )._checked_broker()

    def _checked_broker(self) -> WriterSettings:
        """Self; ConfigError unless the transport can read the broker URL (hosts, database)."""
        from ...storage import connections

        if self.transport.cluster and self.transport.master_name is not None:
            raise ConfigError(
                "options 'cluster' and 'master_name' exclude each other: a Redis Cluster fails over "
                "by itself, without sentinels"
            )
        try:
            db = connections.broker_db(self.conninfo())
        except ConfigError as exc:
            raise ConfigError(f"option 'broker': {exc}") from None
        if self.transport.cluster and db != 0:
            raise ConfigError(
                f"option 'cluster': a Redis Cluster has only database 0; option 'broker' names database {db}"
            )
        return self

    def conninfo(self):
        """The broker URL as kombu reads it for the transport (``;``-separated hosts allowed), with
        the password of ``PASSWORD_ENV`` when it has none; TLS (certificate checked) for pqs://
        and rediss://."""
        from kombu import Connection

        from ...transport import channel as transport  # noqa: F401  registers pq:// and pqs://

        return Connection(self.broker, ssl=self.tls or False, password=os.environ.get(PASSWORD_ENV) or None)

    @property
    def tls(self) -> bool:
        return self.broker.split("://", 1)[0].lower() in ("pqs", "rediss")

    def client(self):
        """A client of the broker as the transport makes its own: one server, the sentinels' master
        (``master_name``) or a Redis Cluster (``cluster``). Close it with ``close_client``."""
        import redis

        from ...storage import connections

        conninfo = self.conninfo()
        if self.transport.cluster:
            return connections.make_cluster(conninfo, self.transport, self.tls)
        client = redis.Redis(connection_pool=connections.make_pool(conninfo, self.transport, self.tls))
        try:
            connections.check_not_a_cluster_node(client)
        except BaseException:
            close_client(client)
            raise
        return client


def close_client(client) -> None:
    """Close a client of ``WriterSettings.client`` and its pool (redis-py leaves a pool it was
    handed open, and an executor's Python worker lives on)."""
    from ...storage import connections

    try:
        connections.close_pool(client if connections.is_cluster(client) else client.connection_pool)
    finally:
        client.close()
