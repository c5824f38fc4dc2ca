"""The ``celery_pq_events`` data source: batch and streaming reads of event-log streams filled in
the log's exact format, on a real redis-server and local Spark."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from celery_pq.spark.events.source import SCHEMA
from tests.support.events import xadd_event


def pq_url(redis_server) -> str:
    return f"pq://127.0.0.1:{redis_server.port}/0"


def read(spark, redis_server, queue, prefix, **options):
    reader = (
        spark.read.format("celery_pq_events")
        .option("broker", pq_url(redis_server))
        .option("queue", queue)
        .option("key_prefix", prefix)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_types_every_field(spark, redis_server, redis_client, key_prefix):
    # Given: two queues' logs with every kind of field filled or empty
    a = xadd_event(
        redis_client,
        "orders",
        "enqueue",
        prefix=key_prefix,
        id="t1",
        p=200,
        k=55,
        t="acme",
        task="proj.resize",
        ms=1_700_000_000_123,
    )
    b = xadd_event(
        redis_client,
        "orders",
        "deliver",
        prefix=key_prefix,
        id="t1",
        p=200,
        k=55,
        t="acme",
        c="host:1:ab",
        n=1,
        ms=1_700_000_000_200,
    )
    c = xadd_event(
        redis_client,
        "orders",
        "dead",
        prefix=key_prefix,
        id="t1",
        p=200,
        k=55,
        t="acme",
        n=10,
        r="max_deliveries",
        ms=1_700_000_000_300,
    )
    d = xadd_event(redis_client, "emails", "pause", prefix=key_prefix, ms=1_700_000_000_400)

    # When: both are read in one batch
    df = read(spark, redis_server, "orders, emails", key_prefix)
    rows = sorted(df.collect(), key=lambda r: (r.queue, r.sid))

    # Then: typed columns, empty fields null, ts from ms, sid the stream id
    assert df.schema == SCHEMA
    assert [r.sid for r in rows] == [d, a, b, c]
    enq = rows[1]
    assert (enq.event, enq.queue, enq.id, enq.priority, enq.rank, enq.tenant, enq.task) == (
        "enqueue",
        "orders",
        "t1",
        200,
        55,
        "acme",
        "proj.resize",
    )
    assert enq.consumer is None and enq.deliveries is None and enq.reason is None
    assert enq.ms == 1_700_000_000_123
    assert df.where(F.unix_millis("ts") != F.col("ms")).count() == 0  # ts is ms as a timestamp
    assert (rows[2].consumer, rows[2].deliveries) == ("host:1:ab", 1)
    assert (rows[3].event, rows[3].reason, rows[3].deliveries) == ("dead", "max_deliveries", 10)
    assert (rows[0].event, rows[0].queue, rows[0].id, rows[0].priority) == ("pause", "emails", None, None)


def test_batch_read_of_a_queue_without_events_is_empty(spark, redis_server, key_prefix):
    df = read(spark, redis_server, "nothing-here", key_prefix)
    assert df.count() == 0
    assert df.schema == SCHEMA


def test_batch_read_pages_through_a_long_log(spark, redis_server, redis_client, key_prefix):
    pipe = redis_client.pipeline(transaction=False)
    for i in range(12_000):  # more than two XRANGE pages
        xadd_event(pipe, "big", "enqueue", prefix=key_prefix, id=f"e{i}", p=i % 256, k=255 - i % 256, ms=i)
    pipe.execute()
    df = read(spark, redis_server, "big", key_prefix)
    assert df.count() == 12_000
    assert df.select("id").distinct().count() == 12_000


@pytest.mark.parametrize(
    "options, message",
    [
        ({"broker": ""}, "option 'broker' is required"),
        ({"broker": "amqp://localhost//"}, "must be a pq://, pqs://, redis:// or rediss:// URL"),
        ({"queue": " , "}, "option 'queue' is required"),
        ({"queue": "a,a"}, "names a queue twice"),
        ({"on_gap": "ignore"}, "option 'on_gap' must be one of"),
        ({"maxEventsPerTrigger": "0"}, "maxEventsPerTrigger' must be a positive integer"),
        ({"startingPosition": "now"}, "option 'startingPosition' must be one of"),
    ],
)
def test_bad_options_are_named(spark, redis_server, key_prefix, options, message):
    reader = spark.read.format("celery_pq_events").option("key_prefix", key_prefix)
    merged = {"broker": pq_url(redis_server), "queue": "q", **options}
    for k, v in merged.items():
        reader = reader.option(k, v)
    with pytest.raises(PySparkException, match=message):
        reader.load().collect()


def test_trimmed_events_are_detected(spark, redis_server, redis_client, key_prefix):
    # Given: a stream capped at 5 entries after 8 were written: the first 3 are gone
    for i in range(8):
        xadd_event(redis_client, "capped", "enqueue", prefix=key_prefix, id=f"e{i}", p=1, k=254, ms=i, maxlen=5)
    # Then: on_gap=fail refuses, naming the trim; the default (warn) reads what is left
    with pytest.raises(PySparkException, match="were trimmed by the stream's cap"):
        read(spark, redis_server, "capped", key_prefix, on_gap="fail").collect()
    assert sorted(r.id for r in read(spark, redis_server, "capped", key_prefix).collect()) == [
        f"e{i}" for i in range(3, 8)
    ]


def _stream_to_parquet(spark, redis_server, prefix, queues, out, checkpoint, **options):
    reader = (
        spark.readStream.format("celery_pq_events")
        .option("broker", pq_url(redis_server))
        .option("queue", queues)
        .option("key_prefix", prefix)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_stream_resumes_from_its_checkpoint_with_no_gap_and_no_repeat(
    spark, redis_server, redis_client, key_prefix, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    written = []

    def add(queue, n, start):
        for i in range(start, start + n):
            written.append(
                xadd_event(
                    redis_client,
                    queue,
                    "enqueue",
                    prefix=key_prefix,
                    id=f"{queue}-{i}",
                    p=i % 256,
                    k=255 - i % 256,
                    t=f"t{i % 3}",
                )
            )

    # Given: events in two queues, streamed to Parquet in micro-batches of at most 40 events
    add("s1", 100, 0)
    add("s2", 30, 0)
    first = _stream_to_parquet(spark, redis_server, key_prefix, "s1,s2", out, checkpoint, maxEventsPerTrigger="40")
    batches = [p for p in first.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 4 and max(p["numInputRows"] for p in batches) <= 40
    assert spark.read.parquet(str(out)).count() == 130

    # When: more events arrive while the query is stopped, and it restarts from the same checkpoint
    add("s1", 50, 100)
    add("s2", 20, 30)
    _stream_to_parquet(spark, redis_server, key_prefix, "s1,s2", out, checkpoint)

    # Then: every event exactly once
    sids = [r.sid for r in spark.read.parquet(str(out)).select("sid").collect()]
    assert len(sids) == len(written) == 200
    assert sorted(sids) == sorted(written)


def test_stream_that_fell_behind_the_cap_reports_the_lost_events(
    spark, redis_server, redis_client, key_prefix, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    for i in range(5):
        xadd_event(redis_client, "fast", "enqueue", prefix=key_prefix, id=f"a{i}", p=1, k=254, maxlen=10)
    _stream_to_parquet(spark, redis_server, key_prefix, "fast", out, checkpoint)
    # While the query is stopped, 20 more events go through a stream capped at 10: 15 are lost
    # (the 5 read and 10 unread ones trimmed)
    for i in range(20):
        xadd_event(redis_client, "fast", "enqueue", prefix=key_prefix, id=f"b{i}", p=1, k=254, maxlen=10)
    reader = (
        spark.readStream.format("celery_pq_events")
        .option("broker", pq_url(redis_server))
        .option("queue", "fast")
        .option("key_prefix", key_prefix)
        .option("on_gap", "fail")
    )
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"10 event\(s\) after event .* were trimmed"):
        query.awaitTermination(120)


def test_stream_from_the_latest_event_skips_the_past(spark, redis_server, redis_client, key_prefix, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    add = [xadd_event(redis_client, "late", "enqueue", prefix=key_prefix, id=f"old{i}") for i in range(3)]
    _stream_to_parquet(spark, redis_server, key_prefix, "late", out, checkpoint, startingPosition="latest")
    new = [xadd_event(redis_client, "late", "enqueue", prefix=key_prefix, id=f"new{i}") for i in range(2)]
    _stream_to_parquet(spark, redis_server, key_prefix, "late", out, checkpoint, startingPosition="latest")
    assert sorted(r.sid for r in spark.read.parquet(str(out)).collect()) == sorted(new)
    assert add  # the past was there, and was not read


def test_batch_read_of_a_sharded_queue_reads_every_shard(spark, redis_server, redis_client, key_prefix):
    from celery_pq.storage.keys import shard_names

    # Given: a queue of 4 shards, each shard's own stream holding its events
    shards = shard_names("orders", 4)
    sids = {
        name: [
            xadd_event(redis_client, name, "enqueue", prefix=key_prefix, id=f"{name}-{j}", p=1, k=254)
            for j in range(n + 1)
        ]
        for n, name in enumerate(shards)
    }
    # When: read with the queue's shard count, and without it
    every = read(spark, redis_server, "orders", key_prefix, shards=4).collect()
    first = read(spark, redis_server, "orders", key_prefix).collect()
    # Then: every shard's events, each under its shard's name; without the count, shard 0's only
    assert sorted((r.queue, r.sid) for r in every) == sorted((q, s) for q, got in sids.items() for s in got)
    assert [r.queue for r in first] == ["orders"]
