"""The writer's options, checked on the driver before any row is read; plain data pickled to the
executors, no pyspark. docs/spark.md ("Options")."""

from __future__ import annotations

import json
import math
import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from ...storage import constants as C
from ...storage.checks import count
from ...storage.errors import ConfigError
from ...transport.options import Options
from ..events.log import broker_url

#: Columns with a meaning of their own when present (docs/spark.md, Columns).
ROLE_COLUMNS = ("priority", "tenant", "task_id", "countdown", "eta", "queue")

#: The queue of a row without a ``queue`` column (or with a null in it): Celery's default.
DEFAULT_QUEUE = "celery"

#: The broker's password when the ``broker`` URL has none (an option shows in Spark's plans and
#: UI; this does not). ``enqueue()`` sets it; ``spark.executorEnv`` does on a cluster.
PASSWORD_ENV = "CELERY_PQ_BROKER_PASSWORD"

#: The namespace of task ids derived from a ``key`` column (uuid5), fixed for good: changing it
#: would give every derived id a new value, so a rerun would enqueue its rows again.
KEY_NAMESPACE = uuid.UUID("6f1d1c52-3f0b-5b7e-9a57-2f3c6c1b7a10")

_TRANSPORT_FIELDS = {f.name: f for f in fields(Options) if f.init}


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


def _transport(given: dict) -> Options:
    """The transport options: ``transport_options`` (JSON), each one given by name winning."""
    transport = {}
    if given.get("transport_options"):
        try:
            transport = json.loads(given["transport_options"])
        except ValueError as exc:
            raise ConfigError(f"option 'transport_options' must be a JSON object: {exc}") from None
        if not isinstance(transport, dict):
            raise ConfigError(f"option 'transport_options' must be a JSON object, got {given['transport_options']!r}")
    transport.update((name, _transport_value(name, given[name])) for name in _TRANSPORT_FIELDS if name in given)
    if "visibility_timeout" in given:
        transport["visibility_timeout"] = _transport_value("lease_seconds", given["visibility_timeout"])
    try:
        return Options.from_transport_options(transport)
    except ConfigError as exc:
        raise ConfigError(f"celery_pq writer: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"celery_pq writer: transport_options: {exc}") from None


def _count(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer >= 1, got {text!r}") from None
    return count(f"option {name!r}", value, none=False, error=ConfigError)


def _positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ConfigError(f"option {name!r} must be a number > 0, got {text!r}")
    return value


def _rate(name: str, text: str) -> float:
    value = _positive(name, text)
    if value < 1:
        raise ConfigError(f"option {name!r} must be a number >= 1, got {text!r}")
    return value


def _choice(*allowed: str):
    def read(name: str, text: str) -> str:
        if text.lower() not in allowed:
            raise ConfigError(f"option {name!r} must be one of {allowed}, got {text!r}")
        return text.lower()

    return read


def trace_context() -> str:
    """The option ``trace_context`` for a write started in this process (the driver): the current
    trace context as message headers (``{"traceparent": ...}``, OpenTelemetry's propagators, as
    opentelemetry-instrumentation-celery injects at a publish) in JSON; "" without opentelemetry
    or without a current span. (A Spark Python worker, not the driver, reads the options.)"""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return ""
    carrier: dict[str, str] = {}
    inject(carrier)
    return json.dumps(carrier) if carrier else ""


def _trace_headers(name: str, text: str) -> tuple[tuple[str, str], ...]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"option {name!r} must be a JSON object of header names and strings, got {text!r}")
    return tuple(sorted(value.items()))


#: The writer's own options read from their text alone: name -> reader (an empty text: the default).
_READERS = {
    "on_reject": _choice("keep", "fail"),
    "batch_rows": _count,
    "chunk": _count,
    "rejects_limit": _count,
    "on_full": _choice("wait", "reject"),
    "full_wait_seconds": _positive,
    "rows_per_second": _rate,
    "trace_context": _trace_headers,
}
#: The writer's own options, as the error for an unknown one lists them.
_OWN = ("broker", "task", "args", "kwargs", "queue", "key", "job", "rejects", *_READERS, "transport_options")


@dataclass(frozen=True)
class WriterSettings:
    """Everything one write needs, checked on the driver (defaults: docs/spark.md, "Options")."""

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
    #: Rows per round trip of pipelined insert calls.
    batch_rows: int = 10_000
    chunk: int = C.BULK_CHUNK
    #: Rejected rows a partition carries back to the driver; the counts are exact beyond it.
    rejects_limit: int = 10_000
    #: "wait" or "reject"; None: the writer's default (streaming waits, a batch write fails).
    on_full: str | None = None
    #: Seconds a write waits for room in a full queue before it fails (from the last row stored).
    full_wait_seconds: float = 300.0
    #: Rows per second at most, over all the write's (the query's) Spark tasks; None: no cap.
    rows_per_second: float | None = None
    columns: tuple[str, ...] = ()
    #: The ``ROLE_COLUMNS`` the DataFrame has; the column ``fair_key`` names, if any (``tenant`` wins).
    roles: tuple[str, ...] = ()
    fair_column: str | None = None
    #: Made once per write by ``parse``: part of the identity of a row without ``task_id`` or ``key``.
    write_id: str = ""
    #: The option ``trace_context`` (``enqueue`` gives the driver's): headers every message carries.
    trace_context: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: dict, columns: list[str]) -> WriterSettings:
        """The settings of ``options`` (names in any case) for a DataFrame with ``columns``;
        ConfigError naming a missing, unknown or bad one."""
        given = {str(k).lower(): v for k, v in options.items()}
        if not given.get("path"):
            given.pop("path", None)  # save() without a path
        # checkpointLocation: a streaming query's own option, which Spark hands to the sink too
        known = {*_OWN, *_TRANSPORT_FIELDS, "visibility_timeout", "checkpointlocation"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for format 'celery_pq' "
                f"(options: {', '.join(_OWN)} and the transport options)"
            )
        broker = broker_url(given.get("broker"))
        task = (given.get("task") or "").strip()
        if not task:
            raise ConfigError("option 'task' is required: the Celery task name")
        opts = _transport(given)
        names = list(columns)
        values: dict[str, Any] = {name: _columns(name, given.get(name), names) for name in ("args", "kwargs", "key")}
        if values["key"] and "task_id" in names:
            raise ConfigError("option 'key' derives task ids, but the DataFrame has a task_id column: give one of them")
        roles = tuple(c for c in ROLE_COLUMNS if c in names)
        fair_column = opts.fair_key if opts.tenant_fn is None and opts.fair_key in names else None
        if "tenant" in roles and opts.fair_key is None:
            raise ConfigError(
                "the DataFrame has a 'tenant' column, and a tenant needs fairness on: give option "
                "'fair_key' (the broker's fair_key transport option, e.g. \"tenant\")"
            )
        values.update((name, reader(name, given[name])) for name, reader in _READERS.items() if given.get(name))
        return cls(
            broker=broker,
            task=task,
            transport=opts,
            queue=given.get("queue") or DEFAULT_QUEUE,
            job=given.get("job") or task,
            rejects=given.get("rejects") or None,
            columns=tuple(names),
            roles=roles,
            fair_column=fair_column,
            write_id=uuid.uuid4().hex,
            **values,
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
        """The broker URL as kombu reads it (``;``-separated hosts allowed), with the password of
        ``PASSWORD_ENV`` when it has none; TLS (certificate checked) for pqs:// and rediss://."""
        from kombu import Connection

        from ...transport import channel as transport  # noqa: F401  registers pq:// and pqs://

        return Connection(self.broker, ssl=self.tls or False, password=os.environ.get(PASSWORD_ENV) or None)

    @property
    def tls(self) -> bool:
        return self.broker.split("://", 1)[0].lower() in ("pqs", "rediss")

    @contextmanager
    def client(self):
        """A client of the broker as the transport makes its own: one server, the sentinels' master
        (``master_name``) or a Redis Cluster (``cluster``); closed with its pool after the block
        (redis-py leaves a pool it was handed open, and an executor's Python worker lives on)."""
        import redis

        from ...storage import connections

        conninfo = self.conninfo()
        client: redis.Redis | redis.RedisCluster
        pool: redis.ConnectionPool | redis.RedisCluster
        if self.transport.cluster:
            client = pool = connections.make_cluster(conninfo, self.transport, self.tls)
        else:
            pool = connections.make_pool(conninfo, self.transport, self.tls)
            client = redis.Redis(connection_pool=pool)
        try:
            if not self.transport.cluster:
                connections.check_not_a_cluster_node(client)
            yield client
        finally:
            try:
                connections.close_pool(pool)
            finally:
                client.close()
