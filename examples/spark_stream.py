"""Files arriving in a folder, streamed into a queue as Celery tasks; the event log streamed back.

1. A real Celery worker (``examples.spark_app``) starts on queue ``pipeline``.
2. JSON files of rows (``row_id``, ``size``) arrive in ``<out>/incoming``, one every half second.
3. A streaming query reads the folder and writes every row as a task into the queue:
   ``df.writeStream.format("celery_pq")`` with a checkpoint, a small ``max_length`` (the sink waits
   for room when the worker falls behind) and a ``rows_per_second`` cap. Halfway through, the
   query is stopped and started again from its checkpoint.
4. A second streaming query reads the queue's event log back into Spark
   (``spark.readStream.format("celery_pq_events")``) into a memory table, and Spark counts the
   events per task: each row was enqueued once and acked once, across the restart.

Run from the repository root::

    python -m examples.spark_stream [--files 12] [--rows 50] [--out spark-stream-demo]

It starts its own redis-server and stops it at the end. Exits 0 only if every row ran once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path

from celery_pq.testing import RedisServer, WaitTimeout, celery_env, start_worker, stop_workers, wait_for

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "pipeline"
TASK = "pipeline.process"


def say(text=""):
    print(text, flush=True)


def drop_files(folder: Path, files: int, rows: int, every: float) -> None:
    """``files`` JSON-lines files of ``rows`` rows each, one every ``every`` seconds, each
    renamed into place whole (a file source must never see half a file)."""
    for f in range(files):
        text = "".join(json.dumps({"row_id": f * rows + i, "size": (f * rows + i) % 97}) + "\n" for i in range(rows))
        tmp = folder.parent / f".part-{f:04d}.json"
        tmp.write_text(text)
        tmp.rename(folder / f"part-{f:04d}.json")
        time.sleep(every)


def run(
    files: int = 12,
    rows: int = 50,
    out: Path | str = "spark-stream-demo",
    timeout: float = 300.0,
    stop_spark: bool = True,
) -> dict:
    from celery_pq import PriorityQueue
    from celery_pq.spark import register
    from celery_pq.spark.session import local_spark

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    incoming, checkpoint = out / "incoming", out / "checkpoint"
    incoming.mkdir(parents=True)
    total = files * rows
    prefix = "pqstream"
    # the worker and the sink agree on the queue's settings: the same transport options
    options = {"key_prefix": prefix, "event_log": 100_000, "max_length": 100}
    with RedisServer() as server:
        broker = f"pq://127.0.0.1:{server.port}/0"
        q = PriorityQueue(server.client(), QUEUE, key_prefix=prefix, event_log=options["event_log"])
        q.set_event_log(options["event_log"])  # on before the first insert: every event is logged
        spark = local_spark("celery-pq-stream-demo", "local[2]")
        register(spark)
        events = (
            spark.readStream.format("celery_pq_events")
            .option("broker", broker)
            .option("queue", QUEUE)
            .option("key_prefix", prefix)
            .load()
            .writeStream.format("memory")
            .queryName("events")
            .trigger(processingTime="1 second")
            .start()
        )

        def sink():
            df = spark.readStream.schema("row_id long, size long").option("maxFilesPerTrigger", 2).json(str(incoming))
            w = (
                df.writeStream.format("celery_pq")
                .option("broker", broker)
                .option("task", TASK)
                .option("args", "row_id,size")
                .option("queue", QUEUE)
                .option("rows_per_second", 200)
                .option("checkpointLocation", str(checkpoint))
            )
            for k, v in options.items():
                w = w.option(k, str(v))
            return w.trigger(processingTime="1 second").start()

        ready_key = f"{prefix}:demo:ready"
        env = celery_env(
            ROOT,
            PQ_SPARK_BROKER=broker,
            PQ_SPARK_OPTIONS=json.dumps(options),
            PQ_SPARK_WORK_MS="20",
            PQ_SPARK_READY=f"{server.url}#{ready_key}",
        )
        log = open(out / "worker.log", "wb")
        worker = start_worker(
            "examples.spark_app",
            cwd=ROOT,
            env=env,
            name="stream0",
            queues=QUEUE,
            pool="threads",
            concurrency=2,
            prefetch_multiplier=None,
            heartbeat=False,
            loglevel="WARNING",
            log=log,
        )
        query = events
        try:
            wait_for(lambda: q.client.llen(ready_key) >= 1 or worker.poll() is not None, 120, "the worker to start")
            say(f"1. a Celery worker runs queue {QUEUE!r} (max_length={options['max_length']})")
            dropper = threading.Thread(target=drop_files, args=(incoming, files, rows, 0.5), daemon=True)
            dropper.start()
            say(f"2. {files} files of {rows} rows arrive in {incoming}, one every 0.5 s")
            query = sink()
            wait_for(lambda: q.counters()["enqueued"] >= total // 3, timeout, "a third of the rows")
            query.stop()
            say(f"3. the sink query stopped after {q.counters()['enqueued']} rows; started again from its checkpoint")
            query = sink()
            dropper.join()
            query.processAllAvailable()
            wait_for(lambda: q.counters()["acked"] >= total or worker.poll() is not None, timeout, "every task")
            query.stop()
            events.processAllAvailable()
            counts = {
                r["event"]: r["n"] for r in spark.sql("select event, count(*) n from events group by event").collect()
            }
            per_task = spark.sql(
                "select id, sum(if(event = 'enqueue', 1, 0)) enq, sum(if(event = 'ack', 1, 0)) acks "
                "from events group by id"
            )
            once = per_task.where("enq = 1 and acks = 1").count()
            say(f"4. events read back by spark.readStream.format('celery_pq_events'): {counts}")
            say(
                f"   tasks enqueued once and acked once: {once} of {total}; refused while full: {q.counters()['refused_full']}"
            )
        finally:
            stop_workers([worker])
            log.close()
            for running in (events, query):
                if running.isActive:
                    running.stop()
        if stop_spark:
            spark.stop()
    ok = once == total and counts.get("enqueue") == total and counts.get("ack") == total
    return {"ok": ok, "rows": total, "once": once, "events": counts}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--out", default="spark-stream-demo")
    args = parser.parse_args(argv)
    try:
        result = run(args.files, args.rows, args.out)
    except WaitTimeout as exc:
        raise SystemExit(str(exc)) from None
    say("PASS" if result["ok"] else "FAIL")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
