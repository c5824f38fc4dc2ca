"""The celery_pq streaming sink (df.writeStream.format("celery_pq")) on local Spark against a
real redis-server: each row once across task retries and restarts, a full queue waited for,
on_full="reject", and the rate cap."""

from __future__ import annotations

import base64
import json
import time

import pytest

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.spark import register
from celery_pq.spark.sink.partition import RateCap
from celery_pq.spark.sink.record import PartitionState
from celery_pq.storage.codec import decode
from celery_pq.storage.keys import sink_rate_key, sink_record_key
from tests.spark.faults import failed_attempts

pytestmark = pytest.mark.spark


@pytest.fixture
def url(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


@pytest.fixture
def registered(spark):
    register(spark)
    return spark


def add_file(folder, name, numbers):
    """One JSON-lines file of rows {"n": n}, renamed into place whole (as a file source wants)."""
    tmp = folder.parent / f".{name}"
    tmp.write_text("".join(json.dumps({"n": n}) + "\n" for n in numbers))
    tmp.rename(folder / name)


def stream(spark, folder, url, prefix, checkpoint, files_per_batch=1, **options):
    """A started query from the JSON files of ``folder`` into queue "celery", availableNow."""
    df = spark.readStream.schema("n long").option("maxFilesPerTrigger", files_per_batch).json(str(folder))
    w = (
        df.writeStream.format("celery_pq")
        .option("broker", url)
        .option("key_prefix", prefix)
        .option("task", "proj.t")
        .option("args", "n")
        .option("checkpointLocation", str(checkpoint))
    )
    for k, v in options.items():
        w = w.option(k, str(v))
    return w.trigger(availableNow=True).start()


def numbers_in_queue(client, prefix, queue="celery") -> list[int]:
    """The ``n`` (first arg) of every task message stored in the queue, one per entry."""
    q = open_queue(client, queue, QueueSettings(key_prefix=prefix), declare=False)
    out = []
    for value in client.hvals(q.keys.entries):
        message = decode(value.split(b"|", 1)[1])
        out.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return sorted(out)


def test_a_query_failed_mid_batch_and_restarted_later_enqueues_each_row_once(
    failing_writes, url, redis_client, key_prefix, tmp_path
):
    # Given files of 30, 30 and 20 rows without task_id or key, one micro-batch per file, and a
    # publish id window of 1 s (so only the sink's own record can tell a rerun what was stored)
    spark, folder, checkpoint, markers = failing_writes, tmp_path / "in", tmp_path / "ck", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    add_file(folder, "a.json", range(0, 30))
    add_file(folder, "b.json", range(30, 60))
    options = dict(batch_rows=5, dedupe_seconds=1, fail_after=10, fail_markers=markers)
    # When every attempt of the first micro-batch fails after reading 10 rows (the first one
    # stores them, the others skip them as the record says and fail again), so that Spark gives
    # up and the query stops with the micro-batch not committed
    (markers / "hold").touch()
    q = stream(spark, folder, url, key_prefix, checkpoint, **options)
    with pytest.raises(Exception, match=r"injected failure of partition 0 after 10 rows"):
        q.awaitTermination(60)
    assert failed_attempts(markers) == {0: [0, 1, 2, 3]}
    stored = numbers_in_queue(redis_client, key_prefix)
    assert 10 <= len(stored) < 30 and stored == list(range(len(stored)))
    # and the query is restarted from its checkpoint after the window has passed
    (markers / "hold").unlink()
    time.sleep(2.5)  # two windows: the publish ids are forgotten
    q = stream(spark, folder, url, key_prefix, checkpoint, **options)
    assert q.awaitTermination(60) in (None, True) and q.exception() is None
    # and once more after a third file arrived
    add_file(folder, "c.json", range(60, 80))
    q = stream(spark, folder, url, key_prefix, checkpoint, **options)
    q.awaitTermination(60)
    assert q.exception() is None
    # Then each row is in the queue exactly once: the rerun of micro-batch 0 skipped the 10
    # rows its failed runs had stored
    assert numbers_in_queue(redis_client, key_prefix) == list(range(80))
    # and the sink's record holds only the last micro-batch (the earlier ones are committed):
    # its one partition's 20 rows handled, written by the last run, which owns the record
    record = redis_client.hgetall(sink_record_key(q.id, key_prefix))
    batches = {f: v for f, v in record.items() if f[:1].isdigit()}
    assert [f.split(b":")[:2] for f in batches] == [[b"2", b"0"]]
    assert PartitionState.decode(next(iter(batches.values()))).handled == 20
    assert next(iter(batches)).split(b":", 2)[2] == record[b"owner"]


def test_a_spark_task_killed_mid_partition_and_retried_enqueues_each_row_once(
    failing_writes, url, redis_client, key_prefix, tmp_path
):
    # Given two files of 25 rows read in one micro-batch (two partitions), each partition's
    # first attempt failing after storing 10 rows
    spark, folder, markers = failing_writes, tmp_path / "in", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    add_file(folder, "a.json", range(0, 25))
    add_file(folder, "b.json", range(25, 50))
    # When the query runs and Spark retries the failed tasks
    q = stream(
        spark,
        folder,
        url,
        key_prefix,
        tmp_path / "ck",
        files_per_batch=2,
        batch_rows=5,
        fail_after=10,
        fail_markers=markers,
    )
    q.awaitTermination(60)
    assert q.exception() is None
    # Then both partitions failed once, and each row is in the queue once
    assert failed_attempts(markers) == {0: [0], 1: [0]}
    assert numbers_in_queue(redis_client, key_prefix) == list(range(50))
    assert q.lastProgress["numInputRows"] == 50


def test_a_full_queue_makes_the_sink_wait_and_every_row_arrives(registered, url, redis_server, key_prefix, tmp_path):
    # Given a queue of at most 8 waiting entries and 60 rows streamed into it
    spark, folder = registered, tmp_path / "in"
    folder.mkdir()
    add_file(folder, "a.json", range(60))
    q = stream(spark, folder, url, key_prefix, tmp_path / "ck", max_length=8, batch_rows=20)
    # When a consumer drains the queue while the query runs
    client = redis_server.client(decode_responses=False)
    queue = open_queue(client, "celery", QueueSettings(key_prefix=key_prefix, max_length=8), declare=False)
    got: list[int] = []
    most = 0
    deadline = time.monotonic() + 90
    while (q.isActive or queue.size()) and time.monotonic() < deadline:
        most = max(most, queue.size())
        leases = queue.pop(3)
        for lease in leases:
            got.append(json.loads(base64.b64decode(decode(lease.payload)["body"]))[0][0])
        if leases:
            queue.ack(leases)
        time.sleep(0.05)
    q.awaitTermination(10)
    counters = queue.counters()
    client.close()
    # Then the queue refused inserts, and the query waited for room: every row arrived once,
    # none dropped, and the queue never held more than 8
    assert q.exception() is None
    assert counters["refused_full"] > 0
    assert counters["enqueued"] == 60
    assert sorted(got) == list(range(60))
    assert most <= 8


def test_on_full_reject_fails_the_query_naming_the_full_queue(registered, url, redis_client, key_prefix, tmp_path):
    # Given a queue of at most 5 entries, nobody consuming, and 20 rows with on_full="reject"
    spark, folder = registered, tmp_path / "in"
    folder.mkdir()
    add_file(folder, "a.json", range(20))
    q = stream(spark, folder, url, key_prefix, tmp_path / "ck", max_length=5, batch_rows=5, on_full="reject")
    # Then the query fails with an error naming the queue, its limit and the option
    with pytest.raises(
        Exception, match=r"queue 'celery' is full: 5 waiting entries, max_length=5, and on_full='reject'"
    ):
        q.awaitTermination(60)
    # and the rows that fitted stay queued, each once
    assert numbers_in_queue(redis_client, key_prefix) == list(range(5))


def test_the_rate_cap_counts_rows_per_second_on_the_redis_clock(redis_client, key_prefix, monkeypatch):
    # Given a cap of 10 rows per second shared by two tasks of a sink, on an executor whose
    # clock is an hour ahead of the Redis server's
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    cap = RateCap(redis_client, "q1", key_prefix, 10)
    other = RateCap(redis_client, "q1", key_prefix, 10)
    # When the two tasks take 7 and 18 rows
    started = time.monotonic()
    cap.take(7)
    other.take(18)
    # Then the rows were counted in the Redis server's seconds, and no second granted more
    # than 10: the 25 rows took at least three seconds
    now = int(redis_client.time()[0])
    counts = {int(s): int(n) for s, n in redis_client.hgetall(sink_rate_key("q1", key_prefix)).items()}
    assert all(now - 5 <= s <= now for s in counts)
    granted = [min(10, counts[s]) for s in sorted(counts)]
    assert sum(granted) == 25 and len(granted) >= 3
    assert time.monotonic() - started > 0.5  # (held back: at least a second's turn, less a little)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("on_full", "drop", "option 'on_full' must be one of ('wait', 'reject')"),
        ("full_wait_seconds", "-1", "option 'full_wait_seconds' must be a number > 0"),
        ("rows_per_second", "fast", "option 'rows_per_second' must be a number > 0"),
        ("rows_per_second", "0.5", "option 'rows_per_second' must be a number >= 1"),
    ],
)
def test_bad_stream_options_are_named(option, value, message):
    from celery_pq.spark.sink.settings import WriterSettings
    from celery_pq.storage.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WriterSettings.parse({"broker": "pq://localhost:6379/0", "task": "t", option: value}, ["n"])
