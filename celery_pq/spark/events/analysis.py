"""What the queue did, from its event log (a DataFrame of the ``celery_pq_events`` columns, read
from Redis or an export): ``analyze``. docs/spark.md ("Analysis") says what each frame holds."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

#: Window lengths auto-selection chooses from: round numbers a reader takes in at a glance.
_NICE_SECONDS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
NICE_WINDOWS_MS = tuple(round(s * 1000) for s in _NICE_SECONDS)
TARGET_WINDOWS = 60
RANKS = 256  # ranks 0..255; 0 is served first

#: The events after which an entry is waiting (can be popped), and those after which it is not.
TO_WAITING = ("requeue", "expire", "due")
FROM_WAITING = ("deliver", "remove", "dead")

#: What an entry's enqueue event says of it.
ENQUEUED = ("priority", "rank", "task")
REQUIRED = ("event", "queue", "id", "rank", "tenant", "deliveries", "ms", "sid")

RANK_ERROR_SCHEMA = (
    "queue string, id string, sid string, ms bigint, tenant string, rank int, rank_error int, waiting int"
)


def choose_window_ms(span_ms: int, target: int = TARGET_WINDOWS) -> int:
    """The smallest round window length giving at most ``target`` windows over ``span_ms``."""
    return next((w for w in NICE_WINDOWS_MS if span_ms / w <= target), NICE_WINDOWS_MS[-1])


def analyze(
    events: DataFrame, *, window_seconds: float | None = None, weights: dict[str, float] | None = None
) -> dict[str, DataFrame]:
    """The analysis DataFrames of an event log, by name. Time windows are ``window_seconds`` long
    (default: a round length giving about 60 windows over the log's span), aligned to the epoch.
    ``weights`` (``{tenant: weight}``, others 1): Jain's index of deliveries / weight (fair scores 1)."""
    missing = [c for c in REQUIRED if c not in events.columns]
    if missing:
        raise ValueError(
            f"events has no column {', '.join(map(repr, missing))}: expected the columns of the "
            f"celery_pq_events source (got {', '.join(events.columns)})"
        )
    if window_seconds is not None and not (isinstance(window_seconds, (int, float)) and window_seconds > 0):
        raise ValueError(f"window_seconds must be a positive number of seconds, got {window_seconds!r}")
    for tenant, weight in (weights or {}).items():
        if not (isinstance(weight, (int, float)) and weight > 0):
            raise ValueError(f"weight of tenant {tenant!r} must be a positive number, got {weight!r}")

    ev = events.withColumn("tenant", F.coalesce(F.col("tenant"), F.lit(""))).cache()
    span = ev.agg(F.min("ms").alias("lo"), F.max("ms").alias("hi")).first()
    assert span is not None  # an aggregate without grouping has one row
    lo, hi = (span["lo"] or 0), (span["hi"] or 0)
    window_ms = max(int(window_seconds * 1000) if window_seconds else choose_window_ms(hi - lo), 1)
    base = lo - lo % window_ms

    def bucket(col):
        return F.floor((F.col(col) - F.lit(base)) / F.lit(window_ms)).cast("long")

    def windowed(frame: DataFrame, *columns: str, order=()) -> DataFrame:
        """``frame`` with its windows' ``window_start``, as ``queue, window_start, bucket, *columns``."""
        start = F.timestamp_millis(F.lit(base) + F.col("bucket") * F.lit(window_ms))
        frame = frame.withColumn("window_start", start).select("queue", "window_start", "bucket", *columns)
        return frame.orderBy("queue", "bucket", *order)

    ev = ev.withColumn("bucket", bucket("ms"))
    # Cached: the other frames are built from ev and entries, and rank_error is the costliest pass.
    entries = _entries(ev).cache()
    fairness = _fairness(ev, entries, bucket, windowed, weights or {})
    rank_error = _rank_error(ev).cache()
    dead = (
        ev.where(F.col("event") == "dead")
        .drop("task")
        .join(entries.select("queue", "id", "task"), ["queue", "id"], "left")
    )
    return {
        "summary": _summary(ev, entries, rank_error, fairness, window_ms),
        "entries": entries,
        "waits": _waits(ev, entries),
        "share": windowed(_shares(ev, "queue", "bucket"), "tenant", "deliveries", "share", order=["tenant"]),
        "fairness": fairness,
        "rank_error": rank_error,
        "redeliveries": _redeliveries(ev),
        "dead": dead.select("queue", "id", "tenant", "task", "priority", "deliveries", "reason", "ts", "ms").orderBy(
            "ms"
        ),
        "throughput": _throughput(ev, windowed, window_ms),
        "worker_time": _worker_time(ev, "queue"),
    }


def _count(event: str):
    return F.sum(F.when(F.col("event") == event, 1).otherwise(0)).cast("long")


#: The count of each event in the frames: column -> event.
_COUNTED = {
    "enqueued": "enqueue",
    "delivered": "deliver",
    "acked": "ack",
    "requeued": "requeue",
    "expired": "expire",
    "dead": "dead",
    "removed": "remove",
}


def _counts(*columns: str) -> list:
    return [_count(_COUNTED[c]).alias(c) for c in columns]


def _wait_percentiles(*percents: int) -> list:
    return [F.percentile("wait_ms", p / 100).alias(f"wait_p{p}_ms") for p in percents]


def _entries(ev: DataFrame) -> DataFrame:
    def first_ms(*names):
        return F.min(F.when(F.col("event").isin(*names), F.col("ms")))

    per = ev.groupBy("queue", "id").agg(
        F.max(F.when(F.col("tenant") != "", F.col("tenant"))).alias("tenant"),
        *(F.first(F.when(F.col("event") == "enqueue", F.col(c)), ignorenulls=True).alias(c) for c in ENQUEUED),
        first_ms("enqueue").alias("enqueue_ms"),
        first_ms("due").alias("due_ms"),
        first_ms("deliver").alias("first_deliver_ms"),
        _count("deliver").alias("deliveries"),
        (_count("ack") > 0).alias("acked"),
        (_count("dead") > 0).alias("dead"),
        (_count("remove") > 0).alias("removed"),
    )
    return (
        per.where(F.col("id").isNotNull())
        .withColumn("tenant", F.coalesce(F.col("tenant"), F.lit("")))
        .withColumn("ready_ms", F.coalesce(F.col("due_ms"), F.col("enqueue_ms")))
        .withColumn("wait_ms", F.col("first_deliver_ms") - F.col("ready_ms"))
    )


def _shares(ev: DataFrame, *by: str) -> DataFrame:
    """Deliveries per ``by`` and tenant, and their ``share`` of ``by``'s deliveries."""
    counts = ev.where(F.col("event") == "deliver").groupBy(*by, "tenant").agg(F.count(F.lit(1)).alias("deliveries"))
    return counts.withColumn("share", F.col("deliveries") / F.sum("deliveries").over(Window.partitionBy(*by)))


def _worker_time(ev: DataFrame, *by: str) -> DataFrame:
    """The ms tenants held leases (``held_ms`` of ack, requeue and expire events: queues with
    ``fair_cost="time"``; a log without the column has none) per ``by`` and tenant, and their
    ``worker_share`` of ``by``'s."""
    if "held_ms" not in ev.columns:
        ev = ev.withColumn("held_ms", F.lit(None).cast("long"))
    held = (
        ev.where(F.col("held_ms").isNotNull())
        .groupBy(*by, "tenant")
        .agg(F.sum("held_ms").cast("long").alias("held_ms"))
    )
    return held.withColumn("worker_share", F.col("held_ms") / F.sum("held_ms").over(Window.partitionBy(*by)))


def _waits(ev: DataFrame, entries: DataFrame) -> DataFrame:
    delivered = _shares(ev, "queue")
    w = F.col("wait_ms")
    stats = (
        entries.where(w.isNotNull())
        .groupBy("queue", "tenant")
        .agg(
            F.count(F.lit(1)).alias("waited"),
            *_wait_percentiles(50, 90, 99),
            F.avg(w).alias("wait_mean_ms"),
            F.max(w).alias("wait_max_ms"),
        )
    )
    enq = entries.groupBy("queue", "tenant").agg(F.count(F.lit(1)).alias("entries"))
    return (
        enq.join(delivered, ["queue", "tenant"], "full")
        .join(stats, ["queue", "tenant"], "left")
        .fillna(0, ["entries", "deliveries", "waited"])
        .fillna(0.0, ["share"])
        .orderBy("queue", "tenant")
    )


def _jain(ev, entries, bucket, weights, by: list[str]) -> DataFrame:
    """Jain's index per ``by`` and window over the tenants served or waiting for a first delivery."""
    spark = ev.sparkSession
    keys = [*by, "tenant", "bucket"]

    def entries_by_window(col: str, name: str) -> DataFrame:
        """The entries per ``keys`` whose ``col`` falls in the window, as column ``name``."""
        bucketed = entries.where(F.col(col).isNotNull()).withColumn("bucket", bucket(col))
        return bucketed.groupBy(*keys).agg(F.count(F.lit(1)).alias(name))

    # Backlog per tenant and window: waiting before the window's end, not delivered before its start
    ready = entries_by_window("ready_ms", "ready")
    firsts = entries_by_window("first_deliver_ms", "firsts")
    served = ev.where(F.col("event") == "deliver").groupBy(*keys).agg(F.count(F.lit(1)).alias("deliveries"))
    bounds = ev.groupBy("queue").agg(F.min("bucket").alias("b0"), F.max("bucket").alias("b1"))
    members = (
        entries.select(*by, "tenant")
        .union(ev.where(F.col("event") == "deliver").select(*by, "tenant"))
        .where(F.col(by[-1]).isNotNull())
        .distinct()
    )
    grid = bounds.select("queue", F.explode(F.sequence("b0", "b1")).alias("bucket")).join(members, "queue")
    g = (
        grid.join(ready, keys, "left")
        .join(firsts, keys, "left")
        .join(served, keys, "left")
        .fillna(0, ["ready", "firsts", "deliveries"])
    )
    upto = Window.partitionBy(*by, "tenant").orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    g = g.withColumn("backlog", F.sum("ready").over(upto) - (F.sum("firsts").over(upto) - F.col("firsts")))
    weight = F.lit(1.0)
    if weights:
        w_df = spark.createDataFrame([(str(t), float(v)) for t, v in weights.items()], "tenant string, weight double")
        g = g.join(F.broadcast(w_df), "tenant", "left")
        weight = F.coalesce(F.col("weight"), F.lit(1.0))
    g = g.withColumn("x", F.col("deliveries") / weight)
    active = g.where((F.col("backlog") > 0) | (F.col("deliveries") > 0))
    out = active.groupBy(*by, "bucket").agg(
        F.count(F.lit(1)).alias("tenants"),
        F.sum("deliveries").alias("deliveries"),
        F.sum("x").alias("sx"),
        F.sum(F.col("x") * F.col("x")).alias("sxx"),
    )
    jain = F.when(F.col("sxx") > 0, F.col("sx") * F.col("sx") / (F.col("tenants") * F.col("sxx")))
    return out.withColumn("jain", jain).drop("sx", "sxx")


def _fairness(ev, entries, bucket, windowed, weights) -> DataFrame:
    """Per queue and window: Jain's index over all tenants (``jain``) and within each rank
    (``jain_within_rank``, the window's ranks weighted by their deliveries; docs/spark.md)."""
    overall = _jain(ev, entries, bucket, weights, ["queue"])
    per_rank = _jain(ev, entries, bucket, weights, ["queue", "rank"])
    within = (
        per_rank.where(F.col("jain").isNotNull())
        .groupBy("queue", "bucket")
        .agg((F.sum(F.col("jain") * F.col("deliveries")) / F.sum("deliveries")).alias("jain_within_rank"))
    )
    fair = overall.join(within, ["queue", "bucket"], "left")
    return windowed(fair, "tenants", "deliveries", "jain", "jain_within_rank")


def rank_errors(events) -> list[tuple]:
    """One queue's events (tuples of ``event, id, rank, tenant, ms, sid``), in stream
    order, as rows ``(id, sid, ms, tenant, rank, rank_error, waiting)`` per delivery. An entry
    waits from its enqueue (its ``due`` if delayed) until delivered, removed or dead, and again
    after a requeue or an expired lease."""
    events = list(events)
    delayed = {e[1] for e in events if e[0] == "due"}
    per_rank = [0] * RANKS  # waiting entries of each rank
    waiting: dict[str, int] = {}  # entry id -> rank, of the entries waiting now
    known: dict[str, int] = {}  # entry id -> its last rank seen (a requeue may not repeat it)
    out = []

    def start(eid, rank):
        if rank is None or eid in waiting:
            return
        waiting[eid] = rank
        per_rank[rank] += 1

    def stop(eid):
        rank = waiting.pop(eid, None)
        if rank is not None:
            per_rank[rank] -= 1

    for event, eid, rank, tenant, ms, sid in events:
        rank = None if rank is None or rank != rank else int(rank)  # NaN from pandas: none
        if rank is None:
            rank = known.get(eid)
        else:
            known[eid] = rank
        if event == "enqueue":
            if eid not in delayed:
                start(eid, rank)
        elif event in TO_WAITING:
            start(eid, rank)
        elif event == "deliver":
            stop(eid)
            if rank is not None:
                out.append((eid, sid, ms, tenant, rank, sum(per_rank[:rank]), len(waiting)))
        elif event in FROM_WAITING:
            stop(eid)
        elif event == "reprioritize" and eid in waiting and rank is not None:
            stop(eid)
            start(eid, rank)
    return out


def _rank_error_group(pdf):
    import pandas as pd

    sid = pdf["sid"].str.split("-", n=1, expand=True)
    pdf = pdf.assign(_ms=sid[0].astype("int64"), _seq=sid[1].astype("int64")).sort_values(["_ms", "_seq"])
    queue = pdf["queue"].iloc[0] if len(pdf) else ""
    rows = rank_errors(zip(pdf["event"], pdf["id"], pdf["rank"], pdf["tenant"], pdf["ms"], pdf["sid"]))
    out = pd.DataFrame(rows, columns=["id", "sid", "ms", "tenant", "rank", "rank_error", "waiting"])
    out.insert(0, "queue", queue)
    return out.astype({"ms": "int64", "rank": "int32", "rank_error": "int32", "waiting": "int32"})


def _rank_error(ev: DataFrame) -> DataFrame:
    cols = ev.select("queue", "event", "id", "rank", "tenant", "ms", "sid")
    return cols.groupBy("queue").applyInPandas(_rank_error_group, RANK_ERROR_SCHEMA)


def _redeliveries(ev: DataFrame) -> DataFrame:
    return (
        ev.groupBy("queue", "tenant")
        .agg(
            _count("deliver").alias("deliveries"),
            F.sum(F.when((F.col("event") == "deliver") & (F.col("deliveries") > 1), 1).otherwise(0))
            .cast("long")
            .alias("redeliveries"),
            _count("requeue").alias("requeues"),
            *_counts("expired", "dead"),
        )
        .orderBy("queue", "tenant")
    )


def _throughput(ev: DataFrame, windowed, window_ms: int) -> DataFrame:
    counts = ev.groupBy("queue", "bucket").agg(*_counts("enqueued", "delivered", "acked", "dead"))
    tput = counts.withColumn("acked_per_s", F.col("acked") / F.lit(window_ms / 1000.0))
    return windowed(tput, "enqueued", "delivered", "acked", "dead", "acked_per_s")


def _summary(ev, entries, rank_error, fairness, window_ms) -> DataFrame:
    counts = (
        ev.groupBy("queue")
        .agg(
            F.count(F.lit(1)).alias("events"),
            *_counts("enqueued", "delivered", "acked", "requeued", "expired", "dead", "removed"),
            F.min("ms").alias("first_ms"),
            F.max("ms").alias("last_ms"),
        )
        .withColumn("span_s", (F.col("last_ms") - F.col("first_ms")) / 1000.0)
        .withColumn("acked_per_s", F.when(F.col("span_s") > 0, F.col("acked") / F.col("span_s")))
    )
    waits = entries.where(F.col("wait_ms").isNotNull()).groupBy("queue").agg(*_wait_percentiles(50, 99))
    errors = rank_error.groupBy("queue").agg(
        F.avg("rank_error").alias("rank_error_mean"),
        F.max("rank_error").alias("rank_error_max"),
        F.avg(F.when(F.col("rank_error") == 0, 1.0).otherwise(0.0)).alias("rank_exact_share"),
    )
    fair = fairness.groupBy("queue").agg(
        F.avg("jain").alias("jain_mean"),
        F.min("jain").alias("jain_min"),
        F.avg("jain_within_rank").alias("jain_within_rank_mean"),
        F.min("jain_within_rank").alias("jain_within_rank_min"),
    )
    return (
        counts.join(waits, "queue", "left")
        .join(errors, "queue", "left")
        .join(fair, "queue", "left")
        .withColumn("window_ms", F.lit(window_ms))
        .orderBy("queue")
    )
