"""End to end: a DataFrame written with the celery_pq writer, run by a real Celery worker."""

from __future__ import annotations

import time

import pytest

import celery_pq.spark
from celery_pq.spark import enqueue
from celery_pq.testing import wait_for
from tests.e2e.test_celery_e2e import Harness
from tests.spark.faults import FailingDataSource, failed_attempts

pytestmark = [pytest.mark.spark, pytest.mark.e2e]


def test_a_celery_worker_runs_every_row_of_a_dataframe_in_priority_order(spark, redis_server, key_prefix, tmp_path):
    # Given 60 rows with priorities, written to queue q while no worker runs
    h = Harness(redis_server, key_prefix, tmp_path, {}, acks_late=False)
    try:
        rows = [(i, (i * 37) % 256) for i in range(60)]
        df = spark.createDataFrame(rows, "n int, priority int")
        (
            df.write.format("celery_pq")
            .mode("append")
            .option("broker", h.url)
            .option("key_prefix", key_prefix)
            .option("task", "e2e.record")
            .option("args", "n")
            .option("kwargs", "priority")
            .option("queue", "q")
            .option("key", "n")
            .save()
        )
        # When an unchanged Celery worker consumes q
        h.worker("w1")
        wait_for(lambda: len(h.records("order")) == 60, 60, "60 tasks")
        # Then each row ran once, with its args and kwargs, highest priority first
        ran = [tuple(r) for r in h.records("order")]
        assert sorted(ran) == sorted(rows)
        assert [p for _, p in ran] == sorted((p for _, p in rows), reverse=True)
        assert h.queue("q").stats()["leased"] == 0
    finally:
        h.close()


def test_identical_rows_run_once_each_even_when_spark_retries_the_write(
    failing_writes, redis_server, key_prefix, tmp_path, monkeypatch
):
    # Given 12 identical rows without task_id or key, 4 in each of 3 partitions, whose first
    # write attempt fails after storing 2 rows of each partition (Spark then retries it)
    spark = failing_writes
    # (enqueue registers the data sources itself: the failing one here)
    monkeypatch.setattr(celery_pq.spark, "register", lambda s, **_: s.dataSource.register(FailingDataSource))
    h = Harness(redis_server, key_prefix, tmp_path, {}, acks_late=False)
    try:
        df = spark.sparkContext.parallelize([(5, 9)] * 12, 3).toDF("n int, priority int")
        markers = tmp_path / "markers"
        markers.mkdir()
        result = enqueue(
            df,
            h.url,
            "e2e.record",
            args=["n"],
            kwargs=["priority"],
            queue="q",
            transport_options={"key_prefix": key_prefix},
            batch_rows=2,
            fail_after=2,
            fail_markers=str(markers),
        )
        assert failed_attempts(markers) == {0: [0], 1: [0], 2: [0]}
        assert (result.rows, result.sent, result.already_stored, result.rejected) == (12, 6, 6, 0)
        # When an unchanged Celery worker consumes q
        h.worker("w1")
        wait_for(lambda: len(h.records("order")) >= 12 and h.queue("q").size() == 0, 60, "12 tasks")
        time.sleep(1)  # (a 13th would show up now)
        # Then it ran the identical row 12 times, no more
        assert h.records("order") == [[5, 9]] * 12
        assert h.queue("q").stats()["leased"] == 0
    finally:
        h.close()
