"""Spark -> queue: rows/s of the ``celery_pq`` writer from local Spark (``local[2]``) into one
queue, against ``PriorityQueue.insert_many``'s bulk rate on the same redis-server in the same run
(the same stored messages, task ids and publish ids, in the writer's batches and chunks), and
Redis ``used_memory`` (less client buffers) per entry after the write.

    python -m benchmarks.spark_bulk [--rows 1000000] [--smoke] [--out DIR]

Needs Java 17 (scripts/ensure-java.sh). Each row is ``(n, priority)``; the task gets ``n`` as its
argument, its task id is derived from ``n`` (option ``key``).
"""

from __future__ import annotations

import time

import redis

from celery_pq import Item
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.transport.messages import digest

from .common import cli, data_memory, redis_server, table

PREFIX = "sparkbench"
BATCH_ROWS = 10_000
CHUNK = 1_000


def spark_session():
    from celery_pq.spark.session import local_spark

    return local_spark("celery-pq-spark-bulk", "local[2]")


def write(spark, port, rows, queue) -> float:
    """Seconds the writer takes for ``rows`` rows."""
    df = spark.range(0, rows, numPartitions=2).selectExpr("id as n", "cast(id % 256 as int) as priority")
    start = time.perf_counter()
    (
        df.write.format("celery_pq")
        .mode("append")
        .option("broker", f"pq://127.0.0.1:{port}/0")
        .option("key_prefix", PREFIX)
        .option("task", "bench.work")
        .option("args", "n")
        .option("key", "n")
        .option("queue", queue)
        .option("batch_rows", BATCH_ROWS)
        .option("chunk", CHUNK)
        .save()
    )
    return time.perf_counter() - start


def bulk(client, rows, payload) -> float:
    """Seconds ``insert_many`` takes for ``rows`` entries like the writer's (same payload size,
    a task id and a publish id each), in the writer's batches and chunks (only the calls timed)."""
    q = open_queue(client, "bulk", QueueSettings(key_prefix=PREFIX))
    spent = 0.0
    for start in range(0, rows, BATCH_ROWS):
        items = []
        for i in range(start, min(rows, start + BATCH_ROWS)):
            tid = f"{i:036d}"
            items.append(Item(payload, i % 256, tid, publish_id=digest("celery_pq.spark", tid)))
        t0 = time.perf_counter()
        q.insert_many(items, chunk=CHUNK)
        spent += time.perf_counter() - t0
    assert q.size() == rows
    q.delete()
    return spent


def run(rows=1_000_000) -> dict:
    spark = spark_session()
    try:
        with redis_server() as port:
            client = redis.Redis(port=port)
            write(spark, port, 2_000, "warmup")  # Python workers started, scripts loaded
            open_queue(client, "warmup", QueueSettings(key_prefix=PREFIX)).delete()
            client.delete(f"{PREFIX}:queues")
            before = data_memory(client)
            seconds = write(spark, port, rows, "spark")
            after = data_memory(client)
            q = open_queue(client, "spark", QueueSettings(key_prefix=PREFIX))
            stored = q.size()
            head = q.peek(1)[0]
            payload = head.payload
            q.delete()
            bulk_seconds = bulk(client, rows, payload)
    finally:
        spark.stop()
    writer_rate = rows / seconds
    bulk_rate = rows / bulk_seconds
    return {
        "rows": rows,
        "stored": stored,
        "writer_seconds": seconds,
        "writer_rows_per_second": writer_rate,
        "insert_many_per_second": bulk_rate,
        "ratio": writer_rate / bulk_rate,
        "payload_bytes": len(payload),
        "used_memory_bytes": after - before,
        "memory_bytes_per_entry": (after - before) / max(1, stored),
        "batch_rows": BATCH_ROWS,
        "chunk": CHUNK,
    }


def markdown(d) -> list[str]:
    return [
        f"# Spark -> queue ({d['rows']:,} rows from local[2] Spark, messages of {d['payload_bytes']} bytes)",
        "",
        *table(
            ["writer rows/s", "insert_many entries/s", "ratio (target >= 0.5)", "used_memory per entry"],
            [
                [
                    f"{d['writer_rows_per_second']:.0f}",
                    f"{d['insert_many_per_second']:.0f}",
                    f"{d['ratio']:.2f}",
                    f"{d['memory_bytes_per_entry']:.0f} B",
                ]
            ],
            left=0,
        ),
        "",
        f"{d['stored']:,} entries stored; the writer took {d['writer_seconds']:.1f} s "
        f"(batches of {d['batch_rows']:,} rows, {d['chunk']:,} per insert call).",
    ]


def main(argv=None):
    return cli(argv, __doc__, "spark_bulk", run, markdown, options=[("--rows", int, 1_000_000)], smoke={"rows": 2_000})


if __name__ == "__main__":
    main()
