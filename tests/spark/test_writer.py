"""The celery_pq writer and enqueue() on local Spark against a real redis-server."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.spark import enqueue
from celery_pq.storage.codec import decode
from celery_pq.storage.keys import shard_names
from tests.spark.faults import failed_attempts
from tests.support.tenants import tenant_counts

pytestmark = pytest.mark.spark


def write(df, url, prefix, **options):
    w = df.write.format("celery_pq").mode("append").option("broker", url).option("key_prefix", prefix)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def stored(client, prefix, queue="celery", **kw):
    """{task id: (priority, tenant, message)} of every entry of a queue (waiting or delayed)."""
    q = open_queue(client, queue, QueueSettings(key_prefix=prefix, **kw), declare=False)
    out = {}
    for eid, value in client.hgetall(q.keys.entries).items():
        header, payload = value.split(b"|", 1)
        message = decode(payload)
        out[message["headers"]["id"]] = message
    return q, out


@pytest.fixture
def url(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


def test_each_row_becomes_the_task_message_celery_itself_would_store(spark, url, redis_client, key_prefix):
    # Given one row, and the same task sent by Celery with the same id, args and kwargs
    df = spark.createDataFrame([("t-1", 7, "cat.png", 3)], "task_id string, image_id int, name string, priority int")
    write(df, url, key_prefix, task="proj.resize", args="image_id", kwargs="name", queue="spark")
    app = Celery("ref", broker=url, set_as_current=False)
    app.conf.broker_transport_options = {"key_prefix": key_prefix}
    app.send_task("proj.resize", args=[7], kwargs={"name": "cat.png"}, task_id="t-1", queue="celery", priority=3)
    # Then both messages agree on everything but what differs per publish
    _, ours = stored(redis_client, key_prefix, "spark")
    _, theirs = stored(redis_client, key_prefix, "celery")
    a, b = ours["t-1"], theirs["t-1"]
    assert a["body"] == b["body"]  # base64 of [args, kwargs, embed]
    assert {k: a[k] for k in ("content-type", "content-encoding")} == {
        k: b[k] for k in ("content-type", "content-encoding")
    }
    assert set(a["headers"]) == set(b["headers"])
    for h in (
        "lang",
        "task",
        "id",
        "root_id",
        "parent_id",
        "group",
        "retries",
        "eta",
        "expires",
        "argsrepr",
        "kwargsrepr",
        "timelimit",
        "stamps",
    ):
        assert a["headers"][h] == b["headers"][h], h
    assert set(a["properties"]) == set(b["properties"])
    for p in ("correlation_id", "priority", "body_encoding", "delivery_mode"):
        assert a["properties"][p] == b["properties"][p], p
    assert a["properties"]["delivery_info"] == {"exchange": "", "routing_key": "spark"}


def test_priorities_tenants_queues_and_delays_land_where_the_columns_say(spark, url, redis_client, key_prefix):
    now = datetime.now(UTC)
    rows = [
        (i, i % 256, ["acme", "beta"][i % 2], None if i % 5 else 3600.0, "other" if i == 7 else None) for i in range(40)
    ]
    df = spark.createDataFrame(rows, "n int, priority int, tenant string, countdown double, queue string")
    write(df, url, key_prefix, task="proj.t", args="n", fair_key="tenant")
    q, msgs = stored(redis_client, key_prefix, "celery", fair=True)
    q2, other = stored(redis_client, key_prefix, "other", fair=True)
    assert len(msgs) == 39 and len(other) == 1
    by_n = {json.loads(base64.b64decode(m["body"]))[0][0]: m for m in [*msgs.values(), *other.values()]}
    for n, p, tenant, countdown, _ in rows:
        m = by_n[n]
        assert m["properties"]["priority"] == p and m["headers"]["tenant"] == tenant
        if countdown:
            eta = datetime.fromisoformat(m["headers"]["eta"])
            assert timedelta(seconds=3500) < eta - now < timedelta(seconds=3700)
    st = q.stats()
    assert st["delayed"] == 8 and st["waiting"] == 31
    assert tenant_counts(q) == {"acme": {"waiting": 16, "leased": 0}, "beta": {"waiting": 15, "leased": 0}}
    # delivery order: strict priority (higher first), as for any publish
    leases = q.pop(31)
    assert [lease.priority for lease in leases] == sorted(
        (p for n, p, _, c, qn in rows if not c and qn is None), reverse=True
    )
    assert {lease.tenant for lease in leases} == {"acme", "beta"}


def summary_of(directory) -> dict:
    """The counts a write with option("rejects", directory) left there."""
    return json.loads((directory / "summary.json").read_text())


def reversed_on_retry(batches):
    """A mapInPandas function passing a partition's rows on, in reverse on a retried attempt (as
    a shuffle's blocks may reach a retry in another order)."""
    import pandas as pd
    from pyspark import TaskContext

    frames = list(batches)
    if frames:
        df = pd.concat(frames)
        yield df.iloc[::-1] if TaskContext.get().attemptNumber() > 0 else df


@pytest.mark.parametrize("ids", ["task_id", "key", "none", "none, read in reverse by the retry"])
def test_spark_task_retries_enqueue_each_row_exactly_once(failing_writes, url, redis_client, key_prefix, tmp_path, ids):
    # Given 4 partitions of 500 rows whose first attempt fails after storing 300 of them (the
    # retry reading them in reverse, for the last case)
    spark = failing_writes
    n = 2000
    df = spark.range(n).selectExpr("id as n", "concat('job-', id) as task_id", "cast(id % 10 as int) as priority")
    if ids != "task_id":
        df = df.drop("task_id")
    df = df.repartition(4)
    if ids.endswith("reverse by the retry"):
        df = df.mapInPandas(reversed_on_retry, df.schema)
        ids = "none"
    markers, first, again = tmp_path / "markers", tmp_path / "first", tmp_path / "again"
    markers.mkdir()
    key = {"key": "n"} if ids == "key" else {}
    # When Spark runs the write, retrying each failed task
    write(
        df,
        url,
        key_prefix,
        task="proj.t",
        args="n",
        batch_rows="100",
        fail_after="300",
        fail_markers=str(markers),
        rejects=str(first),
        **key,
    )
    # Then every partition failed once, and each row is in the queue once
    assert failed_attempts(markers) == {i: [0] for i in range(4)}
    q, msgs = stored(redis_client, key_prefix)
    assert q.size() == n == len(msgs)
    body_ns = sorted(json.loads(base64.b64decode(m["body"]))[0][0] for m in msgs.values())
    assert body_ns == list(range(n))
    # And the summary (of the attempts that succeeded) counts what the failed ones had stored apart
    summary = summary_of(first)
    assert (summary["rows"], summary["sent"], summary["already_stored"], summary["rejected"]) == (n, 800, 1200, 0)
    # And the whole write run again: rows with a task_id or key are stored already, rows without
    # one are new rows of a new write
    write(df, url, key_prefix, task="proj.t", args="n", rejects=str(again), **key)
    summary = summary_of(again)
    if ids == "none":
        assert q.size() == 2 * n and (summary["sent"], summary["already_stored"]) == (n, 0)
    else:
        assert q.size() == n and (summary["sent"], summary["already_stored"]) == (0, n)


def test_a_retried_upstream_failure_gives_rows_without_identity_their_ids_again(
    spark, url, redis_client, key_prefix, tmp_path
):
    # Given 3 partitions of 500 identical rows, made by a Python function whose first attempt
    # fails at its 400th row, after the writer has stored the rows before it (rows of 2 KB, so the
    # function's output leaves its buffer, and Arrow batches of 20 rows to the writer)
    def flaky(index, rows, marker=str(tmp_path)):
        import os
        import time

        from pyspark import TaskContext

        for i, row in enumerate(rows):
            if i == 400 and TaskContext.get().attemptNumber() == 0:
                open(os.path.join(marker, f"failed-{index}"), "w").close()
                time.sleep(1)  # (the writer goes on storing what reached it)
                raise RuntimeError(f"partition {index} fails its first attempt")
            yield row

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = (
            spark.sparkContext.parallelize([(7, "x" * 2000)] * 1500, 3)
            .mapPartitionsWithIndex(flaky)
            .toDF("n int, pad string")
        )
        # When Spark runs the write, recomputing each failed partition from the start
        result = enqueue(df, url, "proj.t", args=["n"], batch_rows=20, transport_options={"key_prefix": key_prefix})
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # Then each partition failed once, the queue holds each row once, and the rows the failed
    # attempts had stored are counted as stored already
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed-0", "failed-1", "failed-2"]
    q, msgs = stored(redis_client, key_prefix)
    assert q.size() == 1500 == len(msgs)
    assert result.sent + result.already_stored == 1500 and result.already_stored > 0


def test_identical_rows_in_three_partitions_are_three_tasks(spark, url, redis_client, key_prefix, tmp_path):
    # Given three identical rows without task_id or key, one in each of three partitions
    df = spark.sparkContext.parallelize([(7, "same")] * 3, 3).toDF("n int, word string")
    assert df.rdd.glom().map(len).collect() == [1, 1, 1]
    # When they are written
    write(df, url, key_prefix, task="proj.t", args="n,word", rejects=str(tmp_path))
    # Then each is its own task, and the summary says 3 sent
    q, msgs = stored(redis_client, key_prefix)
    assert q.size() == 3 == len(msgs)
    assert {m["body"] for m in msgs.values()} == {
        base64.b64encode(
            json.dumps([[7, "same"], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
        ).decode()
    }
    summary = summary_of(tmp_path)
    assert (summary["rows"], summary["sent"], summary["already_stored"], summary["rejected"]) == (3, 3, 0, 0)
    assert len(summary["write_id"]) == 32


def test_a_write_with_task_ids_run_twice_stores_each_once_and_says_so(spark, url, redis_client, key_prefix):
    # Given 20 rows with a task_id, some identical but for it, written once
    df = spark.createDataFrame([(f"t-{i}", i % 3) for i in range(20)], "task_id string, n int").repartition(3)
    opts = dict(args=["n"], transport_options={"key_prefix": key_prefix})
    first = enqueue(df, url, "proj.t", **opts)
    # When the same write runs again
    second = enqueue(df, url, "proj.t", **opts)
    # Then the queue holds each row once, and the second run says they were stored already
    assert (first.rows, first.sent, first.already_stored, first.rejected) == (20, 20, 0, 0)
    assert (second.rows, second.sent, second.already_stored, second.rejected) == (20, 0, 20, 0)
    q, msgs = stored(redis_client, key_prefix)
    assert q.size() == 20 and set(msgs) == {f"t-{i}" for i in range(20)}
    assert first.write_id != second.write_id


def test_two_rows_with_one_task_id_are_one_task_counted_once_sent(spark, url, redis_client, key_prefix):
    df = spark.createDataFrame([("dup", 1), ("dup", 2), ("solo", 3)], "task_id string, n int").coalesce(1)
    result = enqueue(df, url, "proj.t", args=["n"], transport_options={"key_prefix": key_prefix})
    assert (result.sent, result.already_stored) == (2, 1)
    q, msgs = stored(redis_client, key_prefix)
    assert set(msgs) == {"dup", "solo"} and q.size() == 2


def test_bad_rows_come_back_as_rejects_with_reasons_and_the_rest_is_sent(spark, url, redis_client, key_prefix):
    df = spark.createDataFrame(
        [
            ("ok-1", 1, 5, None, None),
            ("ok-2", 2, None, 10.0, None),  # no priority: default
            ("bad-1", 3, 300, None, None),  # out of range
            ("bad-2", 4, -1, None, None),
            (None, 5, 1, None, None),  # null task id
            ("bad-3", 6, 1, -5.0, None),  # negative countdown
            ("bad-4", 7, 1, None, "tomorrow"),  # not an ISO time
            ("bad-5", 8, 1, 1.0, "2030-01-01T00:00:00"),  # both
            ("ok-3", 9, 1, None, "2030-01-01T00:00:00"),
        ],
        "task_id string, n int, priority int, countdown double, eta string",
    )
    result = enqueue(df, url, "proj.t", args=["n"], transport_options={"key_prefix": key_prefix})
    assert (result.rows, result.sent, result.rejected) == (9, 3, 6)
    rejects = {r["n"]: r["reason"] for r in result.rejects.collect()}
    assert set(rejects) == {3, 4, 5, 6, 7, 8}
    assert "300" in rejects[3] and "out of range" in rejects[3]
    assert "task_id" in rejects[5]
    assert "countdown" in rejects[6] and "ISO 8601" in rejects[7] and "both" in rejects[8]
    assert result.rejects.columns == ["task_id", "n", "priority", "countdown", "eta", "reason"]
    assert sum(result.reasons.values()) == 6
    q, msgs = stored(redis_client, key_prefix)
    assert set(msgs) == {"ok-1", "ok-2", "ok-3"} and q.stats()["delayed"] == 2


def test_on_reject_fail_fails_the_write_naming_the_reason(spark, url, key_prefix):
    df = spark.createDataFrame([("a", 1), ("b", 999)], "task_id string, priority int").coalesce(1)
    with pytest.raises(Exception, match="on_reject='fail'") as info:
        write(df, url, key_prefix, task="proj.t", on_reject="fail")
    assert "999" in str(info.value)


def test_a_float_or_string_priority_is_rejected_not_rounded(spark, url, key_prefix):
    df = spark.createDataFrame([("a", 1.5), ("b", 2.0)], "task_id string, priority double")
    result = enqueue(df, url, "proj.t", transport_options={"key_prefix": key_prefix})
    assert result.rejected == 2 and all("integer" in r["reason"] for r in result.rejects.collect())


@pytest.mark.parametrize(
    "options, message",
    [
        ({"task": "proj.t"}, "option 'broker' is required"),
        ({"broker": "URL"}, "option 'task' is required"),
        ({"broker": "URL", "task": "proj.t", "args": "n,nope"}, "option 'args' names column(s) 'nope'"),
        ({"broker": "URL", "task": "proj.t", "kwargs": "missing"}, "option 'kwargs' names column(s) 'missing'"),
        ({"broker": "URL", "task": "proj.t", "priority_order": "sideways"}, "priority_order must be one of"),
        ({"broker": "URL", "task": "proj.t", "kwarg": "n"}, "unknown option(s) 'kwarg'"),
        ({"broker": "URL", "task": "proj.t", "batch_rows": "lots"}, "option 'batch_rows' must be an integer"),
        ({"broker": "URL", "task": "proj.t", "on_reject": "shrug"}, "option 'on_reject' must be one of"),
        ({"broker": "amqp://localhost", "task": "proj.t"}, "option 'broker' must be a pq://"),
        ({"broker": "amqp://guest:hunter2@localhost//", "task": "proj.t"}, "got 'amqp://guest:***@localhost//'"),
        ({"broker": "URL", "task": "proj.t", "cluster": "true", "master_name": "m"}, "'cluster' and 'master_name'"),
    ],
)
def test_option_errors_name_the_option(spark, url, key_prefix, options, message):
    df = spark.createDataFrame([(1,)], "n int")
    w = df.write.format("celery_pq").mode("append").option("key_prefix", key_prefix)
    for k, v in options.items():
        w = w.option(k, url if v == "URL" else v)
    with pytest.raises(Exception, match=re.escape(message)) as info:
        w.save()
    assert "hunter2" not in str(info.value)


def test_overwrite_mode_and_a_tenant_without_fair_key_are_refused(spark, url, key_prefix):
    df = spark.createDataFrame([(1, "acme")], "n int, tenant string")
    w = df.write.format("celery_pq").option("broker", url).option("task", "t").option("key_prefix", key_prefix)
    with pytest.raises(Exception, match="fair_key"):
        w.mode("append").save()
    with pytest.raises(Exception, match="append"):
        w.mode("overwrite").option("fair_key", "tenant").save()


def test_enqueue_takes_a_celery_app(spark, redis_server, redis_client, key_prefix):
    app = Celery("proj", broker=f"pq://127.0.0.1:{redis_server.port}/0", set_as_current=False)
    app.conf.broker_transport_options = {"key_prefix": key_prefix, "priority_order": "lower_first"}
    df = spark.createDataFrame([(i, i) for i in range(5)], "n int, priority int")
    result = enqueue(df, app, "proj.t", args="n", queue="work", key="n")
    assert (result.sent, result.rejected) == (5, 0)
    q = open_queue(redis_client, "work", QueueSettings(key_prefix=key_prefix), declare=False)
    assert q.mode["priority_order"] == "lower_first"
    assert [lease.priority for lease in q.pop(5)] == [0, 1, 2, 3, 4]
    assert b"work" in redis_client.smembers(f"{key_prefix}:queues")


def test_rows_written_to_a_queue_with_its_event_log_on_name_their_task(spark, url, make_pq, key_prefix):
    # Given a queue whose event log was turned on by another process (the write's options say nothing)
    q = make_pq("logged")
    q.set_event_log(1000)
    # When rows are written to it
    df = spark.createDataFrame([(i,) for i in range(3)], "image_id int")
    write(df, url, key_prefix, task="proj.resize", args="image_id", queue="logged")
    # Then each enqueue event names the task
    enqueues = [e for e in q.events() if e["e"] == "enqueue"]
    assert len(enqueues) == 3 and {e["task"] for e in enqueues} == {"proj.resize"}


def test_the_writer_writes_to_a_redis_cluster_with_the_cluster_option(spark, key_prefix):
    from celery_pq.testing import RedisCluster

    with RedisCluster() as cluster:
        # Given three queues whose hash tags live on three different masters
        names = cluster.tags_on_distinct_masters(prefix="sp-")
        rows = [(i, names[i % 3]) for i in range(30)]
        df = spark.createDataFrame(rows, "n int, queue string").repartition(2)
        # When rows are written with the cluster option (the URL names seed nodes)
        result = enqueue(
            df, cluster.pq_url, "proj.t", args=["n"], transport_options={"key_prefix": key_prefix, "cluster": True}
        )
        # Then each queue, on its own master, holds its rows
        assert (result.sent, result.already_stored, result.rejected) == (30, 0, 0)
        client = cluster.client()
        try:
            for name in names:
                q = open_queue(client, name, QueueSettings(key_prefix=key_prefix), declare=False)
                assert q.size() == 10
                assert sorted(json.loads(base64.b64decode(decode(e.payload)["body"]))[0][0] for e in q.peek(10)) == [
                    n for n, qn in rows if qn == name
                ]
            assert len({cluster.master_of(f"{key_prefix}:{{{name}}}:ii").port for name in names}) == 3
        finally:
            client.close()


def test_the_writer_writes_to_the_master_sentinel_names(spark, key_prefix):
    from celery_pq.testing import free_port
    from tests.deploy.conftest import SentinelGroup

    group = SentinelGroup()
    try:
        # Given a Celery app whose broker URL names three sentinels, the first not answering
        # (its port closed), with master_name
        app = Celery("proj", broker=f"pq://127.0.0.1:{free_port()};{group.url}", set_as_current=False)
        app.conf.broker_transport_options = {"key_prefix": key_prefix, **group.options()}
        df = spark.createDataFrame([(i,) for i in range(12)], "n int")
        # When rows are written with enqueue(app)
        result = enqueue(df, app, "proj.t", args=["n"])
        # Then the rows are on the master the sentinels name
        assert (result.sent, result.rejected) == (12, 0)
        q = open_queue(group.master.client(), "celery", QueueSettings(key_prefix=key_prefix), declare=False)
        assert q.size() == 12
    finally:
        group.close()


def test_a_sharded_queue_tells_rows_stored_already_too(spark, url, redis_client, key_prefix):
    # Given a queue split over 4 shards, and 40 rows with a task_id written to it once
    df = spark.createDataFrame([(f"s-{i}", i) for i in range(40)], "task_id string, n int").repartition(2)
    opts = dict(args=["n"], transport_options={"key_prefix": key_prefix, "shards": 4})
    first = enqueue(df, url, "proj.t", **opts)
    # When the write runs again
    second = enqueue(df, url, "proj.t", **opts)
    # Then each row is in one shard once, and the second run says so
    assert (first.sent, first.already_stored) == (40, 0) and (second.sent, second.already_stored) == (0, 40)
    sizes = [
        open_queue(redis_client, name, QueueSettings(key_prefix=key_prefix), declare=False).size()
        for name in shard_names("celery", 4)
    ]
    assert sum(sizes) == 40 and sum(1 for s in sizes if s) > 1


def test_rows_of_a_task_the_queue_limits_go_under_its_limit_and_lift_nothing(spark, url, redis_client, key_prefix):
    # Given a queue whose consumers declared a task_rate limit on proj.resize (the write's options
    # name none) and a weight for tenant "acme"
    from celery_pq.queue import open_queue
    from celery_pq.transport.options import Options

    worker = Options(
        key_prefix=key_prefix, task_rate={"proj.resize": 0.01}, fair_key="tenant", fair_weights={"acme": 3}
    )
    open_queue(redis_client, "limited", worker.queue_settings("limited"))
    # When rows are written to it by a Spark job without those options
    df = spark.createDataFrame([(i,) for i in range(3)], "image_id int")
    write(df, url, key_prefix, task="proj.resize", args="image_id", queue="limited")
    # Then the rows wait under the task's limit, and the queue's tables are as declared
    q = open_queue(redis_client, "limited", QueueSettings(key_prefix=key_prefix), declare=False)
    assert {t: s["waiting"] for t, s in tenant_counts(q).items()} == {"task:proj.resize": 3}
    tables = redis_client.hgetall(q.keys.tenant_settings)
    assert float(tables[b"r:task:proj.resize"]) == 0.01 and float(tables[b"w:acme"]) == 3
