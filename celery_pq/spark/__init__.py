"""celery-pq and Spark (the ``[spark]`` extra; ``import celery_pq`` never imports pyspark): the data
sources ``celery_pq`` (into a queue, ``sink/``) and ``celery_pq_events`` (its event log, ``events/``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from .events.analysis import analyze
from .events.source import EventsDataSource
from .session import check_python_workers
from .sink.rejects import REJECTS_FILE, SUMMARY_FILE, read_rejected_rows
from .sink.settings import PASSWORD_ENV, trace_context
from .sink.source import CeleryPQDataSource

__all__ = ["CeleryPQDataSource", "EnqueueResult", "analyze", "enqueue", "read_rejects", "register", "trace_context"]


def register(spark, *, check_workers: bool = True) -> None:
    """Register ``celery_pq`` and ``celery_pq_events`` with ``spark`` (again is harmless); first, unless
    ``check_workers=False``, ``ConfigError`` when Spark's Python workers cannot import celery_pq."""
    if check_workers:
        check_python_workers(spark)
    spark.dataSource.register(CeleryPQDataSource)
    spark.dataSource.register(EventsDataSource)


@dataclass
class EnqueueResult:
    """What ``enqueue`` did: ``rows`` seen, of them ``sent`` (stored by this write),
    ``already_stored`` (the queue had their ids within the dedupe window) and ``rejected``;
    ``rejects``: a DataFrame of the rejected rows with a ``reason`` column, ``reasons`` their
    counts; ``write_id`` names the write (docs/spark.md, "What the write reports")."""

    rows: int
    sent: int
    rejected: int
    reasons: dict
    rejects: object  # pyspark.sql.DataFrame
    already_stored: int = 0
    write_id: str = ""


def read_rejects(spark, path: str):
    """``(summary, DataFrame)`` of a write's ``rejects`` directory: the counts as a dict, and the
    rejected rows (at most ``rejects_limit`` per partition) with their ``reason``."""
    from pyspark.sql.types import StringType, StructType

    out = Path(path)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    schema = StructType.fromJson(summary.pop("schema")).add("reason", StringType(), False)
    return summary, spark.createDataFrame(read_rejected_rows(str(out / REJECTS_FILE), schema), schema)


def enqueue(
    df,
    app_or_url,
    task: str,
    *,
    args: Sequence[str] = (),
    kwargs: Sequence[str] = (),
    queue: str | None = None,
    key: Sequence[str] = (),
    job: str | None = None,
    transport_options: dict | None = None,
    on_reject: str = "keep",
    **options,
) -> EnqueueResult:
    """Every row of ``df`` as one task ``task``, as the ``celery_pq`` writer does it. ``app_or_url``:
    a Celery app (its broker URL and ``broker_transport_options``) or a broker URL; ``key`` names
    columns whose values (with ``job``, default the task name) derive each row's task id;
    ``transport_options`` override the app's; other keyword arguments are writer options. The
    messages carry the trace context current here (``trace_context``, with opentelemetry)."""
    if isinstance(app_or_url, str):
        url, base = app_or_url, {}
    else:
        with app_or_url.connection_for_write() as conn:
            # every host of a URL of several (the sentinels of master_name, a cluster's seed nodes)
            url = ";".join(conn.alt) if conn.alt else conn.as_uri(include_password=True)
        base = dict(app_or_url.conf.broker_transport_options or {})
    url, password = _without_password(url)
    base.update(transport_options or {})
    given = {"broker": url, "task": task, "on_reject": on_reject, **{k: str(v) for k, v in options.items()}}
    given.setdefault("trace_context", trace_context())
    if base:
        given["transport_options"] = json.dumps(base)
    for name, cols in (("args", args), ("kwargs", kwargs), ("key", key)):
        if cols:
            given[name] = cols if isinstance(cols, str) else ",".join(cols)
    given.update((name, value) for name, value in (("queue", queue), ("job", job)) if value is not None)
    with tempfile.TemporaryDirectory(prefix="celery-pq-rejects-", ignore_cleanup_errors=True) as out:
        given["rejects"] = out
        with _registered_with_password(df.sparkSession, password):
            df.write.format("celery_pq").mode("append").options(**given).save()
        summary, rejects = read_rejects(df.sparkSession, out)
        rejects = rejects.cache()  # read from the driver's memory; the directory goes
        rejects.count()
    return EnqueueResult(
        rejects=rejects, **{f.name: summary[f.name] for f in fields(EnqueueResult) if f.name != "rejects"}
    )


def _without_password(url: str) -> tuple[str, str | None]:
    """``url`` (each ``;``-separated host of it) without its password, and the password."""
    password = None
    hosts = []
    for part in url.split(";"):
        parts = urlsplit(part)
        if parts.password is not None:
            password = unquote(parts.password)
            host = parts.netloc.rsplit("@", 1)[1]
            part = urlunsplit(parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host))
        hosts.append(part)
    return ";".join(hosts), password


@contextmanager
def _registered_with_password(spark, password: str | None):
    """The data sources registered with the broker's password in their workers' ``PASSWORD_ENV``
    for the ``with`` block, the context's ``environment`` left as it was. (Spark hands a source's
    workers the ``environment`` of when it was registered, and shows it in no plan or UI page.)"""
    if password is None:
        register(spark)
        yield
        return
    env = spark.sparkContext.environment
    before = env.get(PASSWORD_ENV)
    env[PASSWORD_ENV] = password
    try:
        register(spark)
    finally:
        if before is None:
            env.pop(PASSWORD_ENV, None)
        else:
            env[PASSWORD_ENV] = before
    try:
        yield
    finally:
        register(spark, check_workers=False)
