"""The streaming sink when a micro-batch's Spark task runs again and reads its rows in another
order (a shuffle before the sink), and when two applications run one checkpoint: a row is
skipped only when the rerun reads the same rows at the same positions, and never taken for
another row."""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.spark import read_rejects
from celery_pq.storage.codec import decode
from tests.spark.faults import failed_attempts

pytestmark = pytest.mark.spark


def add_file(folder, name, numbers):
    tmp = folder.parent / f".{name}"
    tmp.write_text("".join(json.dumps({"n": n}) + "\n" for n in numbers))
    tmp.rename(folder / name)


def queued(client, prefix) -> Counter:
    """How many entries of the queue "celery" carry each ``n`` (the task's first arg)."""
    q = open_queue(client, "celery", QueueSettings(key_prefix=prefix), declare=False)
    return Counter(
        json.loads(base64.b64decode(decode(v.split(b"|", 1)[1])["body"]))[0][0] for v in client.hvals(q.keys.entries)
    )


def arrive(reorder: bool):
    """A mapInPandas function passing a partition's rows on: in reverse on a retried attempt when
    ``reorder`` (as a shuffle's blocks may arrive in another order on a cluster)."""

    def f(batches):
        import pandas as pd
        from pyspark import TaskContext

        frames = list(batches)
        if frames:
            df = pd.concat(frames)
            yield df.iloc[::-1] if reorder and TaskContext.get().attemptNumber() > 0 else df

    return f


def start(spark, folder, url, prefix, checkpoint, shape=None, **options):
    df = spark.readStream.schema("n long").json(str(folder))
    if shape is not None:
        df = shape(df)
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


@pytest.mark.parametrize(
    "identity, reorder, counts",
    [
        # (sent, found already stored, skipped, resent) over both partitions of micro-batch 0
        ("key", True, (10, 20, 0, 0)),
        ("position", False, (10, 0, 20, 0)),
        ("position", True, (30, 0, 0, 20)),
    ],
)
def test_a_retry_after_a_shuffle_skips_only_the_rows_it_reads_as_they_were(
    failing_writes, redis_server, redis_client, key_prefix, tmp_path, identity, reorder, counts
):
    # Given 30 rows shuffled into two partitions by a column (repartition(col)), each
    # partition's first attempt failing after storing 10 of its 15 rows, and its retry reading
    # them in the same order, or in reverse
    folder, markers = tmp_path / "in", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    add_file(folder, "a.json", range(30))

    def shape(df):
        # (g 2 and 3 hash to partitions 0 and 1)
        return df.withColumn("g", df.n % 2 + 2).repartition(2, "g").mapInPandas(arrive(reorder), "n long, g long")

    options = {"key": "n"} if identity == "key" else {}
    # When the query runs and Spark retries the failed tasks
    q = start(
        failing_writes,
        folder,
        f"pq://127.0.0.1:{redis_server.port}/0",
        key_prefix,
        tmp_path / "ck",
        shape,
        batch_rows=5,
        rejects=tmp_path / "summary",
        fail_after=10,
        fail_markers=markers,
        **options,
    )
    q.awaitTermination(120)
    assert q.exception() is None
    assert failed_attempts(markers) == {0: [0], 1: [0]}
    # Then every row is queued; once, unless the retry read other rows where the failed attempt
    # had stored some without a key (those 20 are sent again, under new identities)
    got = queued(redis_client, key_prefix)
    assert set(got) == set(range(30))
    assert sum(got.values()) == 30 + counts[3]
    # and the summary says which rows were sent, found stored, skipped as recorded, resent
    summary, _ = read_rejects(failing_writes, str(tmp_path / "summary" / "batch-0"))
    assert (summary["sent"], summary["already_stored"], summary["skipped"], summary["resent"]) == counts
    assert summary["rows"] == 30 and summary["rejected"] == 0


def test_two_applications_on_one_checkpoint_do_not_skip_each_others_rows(
    failing_writes, redis_server, redis_client, key_prefix, tmp_path
):
    # Given an application whose query stopped in micro-batch 0 after storing part of its rows
    # (every attempt fails after reading 10 rows of a partition), recorded as handled
    spark = failing_writes
    folder, markers, checkpoint = tmp_path / "in", tmp_path / "markers", tmp_path / "ck"
    folder.mkdir()
    markers.mkdir()
    add_file(folder, "a.json", range(30))
    url = f"pq://127.0.0.1:{redis_server.port}/0"
    (markers / "hold").touch()
    q = start(spark, folder, url, key_prefix, checkpoint, batch_rows=5, fail_after=10, fail_markers=markers)
    with pytest.raises(Exception, match=r"injected failure of partition 0 after 10 rows"):
        q.awaitTermination(120)
    first = queued(redis_client, key_prefix)
    assert 10 <= sum(first.values()) < 30
    # When another application, with other rows, is started on the same checkpoint
    q = start(spark, folder, url, key_prefix, checkpoint, lambda df: df.selectExpr("n + 100 AS n"), batch_rows=5)
    q.awaitTermination(120)
    assert q.exception() is None
    # Then every one of its rows is queued, once: none taken for a row the first one stored
    got = queued(redis_client, key_prefix)
    assert got - first == Counter(range(100, 130))


def test_a_run_fenced_off_by_a_later_one_sends_no_more(redis_client, key_prefix):
    from celery_pq.spark.sink.record import Fenced, PartitionState, SinkRecord

    # Given run "a" of a query writing its record, and run "b" started on the same checkpoint
    a = SinkRecord(redis_client, "q1", key_prefix, run="a")
    b = SinkRecord(redis_client, "q1", key_prefix, run="b")
    a.claim()
    a.save(0, 0, PartitionState(segments=[(5, "d1")]))
    b.claim()
    # Then "a" is fenced off at its next write and its next task, "b" goes on, and each run
    # reads its own record first
    with pytest.raises(Fenced, match="run b was started later on the same checkpoint"):
        a.save(0, 0, PartitionState(segments=[(10, "d2")]))
    with pytest.raises(Fenced):
        a.claim()
    b.claim()
    assert b.load(0, 0).segments in ([(5, "d1")], [(10, "d2")])
    b.save(0, 0, PartitionState(segments=[(7, "d3")]))
    assert b.load(0, 0).segments == [(7, "d3")]


def test_a_retry_failing_while_it_reads_the_rows_being_sent_keeps_them_pending(
    failing_writes, redis_server, redis_client, key_prefix, tmp_path
):
    # Given 10 rows in one partition, sent 5 a time in calls of 2 into a queue of at most 7,
    # on_full="reject": the first attempt stores rows 0-4, then 5 and 6 of the batch 5-9 it was
    # sending, and fails (the record: 0-4 handled, 5-9 being sent under its identities)
    folder, markers = tmp_path / "in", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    add_file(folder, "a.json", range(10))
    # When the retry (the queue drained: its entries leased) skips rows 0-4 and fails while it
    # reads rows 5-9 (the source's read fails after 7 rows), and the next attempt finishes
    q = start(
        failing_writes,
        folder,
        f"pq://127.0.0.1:{redis_server.port}/0",
        key_prefix,
        tmp_path / "ck",
        batch_rows=5,
        chunk=2,
        max_length=7,
        on_full="reject",
        fail_plan="1:7",
        fail_markers=markers,
        make_room="celery",
        rejects=tmp_path / "summary",
    )
    q.awaitTermination(120)
    assert q.exception() is None
    assert failed_attempts(markers) == {0: [1]}
    # Then every row is stored once: the last attempt sent rows 5-9 again under the first
    # attempt's identities, and the queue had 5 and 6 already
    assert queued(redis_client, key_prefix) == Counter(range(10))
    summary, _ = read_rejects(failing_writes, str(tmp_path / "summary" / "batch-0"))
    assert (summary["skipped"], summary["already_stored"], summary["sent"], summary["resent"]) == (5, 2, 3, 0)
