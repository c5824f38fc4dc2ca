"""``make spark-demo``: DataFrame rows in as Celery tasks, the broker's event log out as a report.

1. Real Celery workers (``examples.spark_app``) start.
2. A DataFrame of ROWS rows from four tenants (``acme`` has half of them; each tenant has its own
   mix of priorities) is enqueued from Spark with the ``celery_pq`` writer, fairness on
   (``fair_key="tenant"``) and the event log on (``event_log``); the workers drain the queue.
3. Meanwhile a streaming query (``spark.readStream.format("celery_pq_events")``) carries the event
   log back into Spark, into Parquet files.
4. ``celery_pq.spark.analyze`` and the HTML report show each tenant's share of the deliveries
   and its waits, Jain's fairness index over time, the rank error of each delivery, throughput.

Run from the repository root::

    python -m examples.spark_pipeline [--rows 100000] [--workers 2] [--out spark-demo]

It starts its own redis-server (``celery_pq.testing.RedisServer``) and stops it at the end; the
report is ``<out>/report.html``. Exits 0 only if every task ran and every event came back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from celery_pq.testing import RedisServer, WaitTimeout, WorkerProcess, celery_env, start_worker, stop_workers, wait_for

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "pipeline"
#: (tenant, share of the rows, priorities its rows take in turn)
TENANTS = (("acme", 0.5, (0, 0, 0, 5)), ("globex", 0.25, (0, 5)), ("initech", 0.15, (0, 9)), ("umbrella", 0.10, (0,)))


def say(text=""):
    print(text, flush=True)


def spark_session():
    from celery_pq.spark.session import local_spark

    return local_spark("celery-pq-spark-demo", "local[2]")


def rows_frame(spark, rows: int):
    """``row_id, size, tenant, priority``: tenants by their share of the rows (in runs of 1,000),
    each tenant's rows taking its priorities in turn."""
    from pyspark.sql import functions as F

    place = (F.col("id") % 1000) / 1000.0
    tenant = priority = None
    bound = 0.0
    for name, share, prios in TENANTS:
        bound += share
        turn = F.element_at(F.array(*[F.lit(p) for p in prios]), (F.col("id") % len(prios) + 1).cast("int"))
        tenant = F.when(place < bound, F.lit(name)) if tenant is None else tenant.when(place < bound, F.lit(name))
        priority = F.when(place < bound, turn) if priority is None else priority.when(place < bound, turn)
    return spark.range(rows).select(
        F.col("id").alias("row_id"),
        (F.col("id") % 97).alias("size"),
        tenant.otherwise(F.lit(TENANTS[-1][0])).alias("tenant"),
        priority.otherwise(F.lit(0)).cast("int").alias("priority"),
    )


def run(
    rows: int = 100_000,
    workers: int = 2,
    concurrency: int = 8,
    out: Path | str = "spark-demo",
    work_ms: float = 1.0,
    timeout: float = 900.0,
    stop_spark: bool = True,
) -> dict:
    from celery import Celery

    from celery_pq import PriorityQueue
    from celery_pq.spark import enqueue
    from celery_pq.spark.events.report import write_report

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prefix = "pqspark"
    options = {"key_prefix": prefix, "fair_key": "tenant", "event_log": rows * 8 + 10_000}
    procs: list[WorkerProcess] = []
    with RedisServer() as server:
        broker = f"pq://127.0.0.1:{server.port}/0"
        app = Celery("spark_pipeline", broker=broker)
        app.conf.broker_transport_options = options
        spark = spark_session()
        q = PriorityQueue(server.client(), QUEUE, key_prefix=prefix, fair=True, event_log=options["event_log"])
        q.set_event_log(options["event_log"])  # on before the first insert: every event is logged

        # the event log streams back into Spark while everything runs
        events_dir, checkpoint = out / "events.parquet", out / "checkpoint"
        stream = (
            spark.readStream.format("celery_pq_events")
            .option("broker", broker)
            .option("queue", QUEUE)
            .option("key_prefix", prefix)
            .load()
            .writeStream.format("parquet")
            .option("path", str(events_dir))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="2 seconds")
            .start()
        )

        try:
            # real Celery workers, started first: they drain the queue while Spark fills it
            say(f"1. {workers} Celery worker(s), {concurrency} threads each (their log: {out / 'workers.log'})")
            ready_key = f"{prefix}:demo:ready"
            env = celery_env(
                ROOT,
                PQ_SPARK_BROKER=broker,
                PQ_SPARK_OPTIONS=json.dumps(options),
                PQ_SPARK_WORK_MS=str(work_ms),
                PQ_SPARK_READY=f"{server.url}#{ready_key}",
            )
            log = open(out / "workers.log", "wb")
            try:
                for i in range(workers):
                    procs.append(
                        start_worker(
                            "examples.spark_app",
                            cwd=ROOT,
                            env=env,
                            name=f"spark{i}",
                            queues=QUEUE,
                            pool="threads",
                            concurrency=concurrency,
                            prefetch_multiplier=None,
                            heartbeat=False,
                            loglevel="WARNING",
                            log=log,
                        )
                    )
                wait_for(
                    lambda: q.client.llen(ready_key) >= workers or any(p.poll() is not None for p in procs),
                    120,
                    "the workers to start",
                    interval=0.25,
                )

                # rows in as tasks
                say(f"2. enqueueing {rows:,} rows from Spark ({', '.join(f'{t} {s:.0%}' for t, s, _ in TENANTS)})")
                t1 = time.monotonic()
                result = enqueue(
                    rows_frame(spark, rows),
                    app,
                    "pipeline.process",
                    args=["row_id", "size"],
                    queue=QUEUE,
                    key=["row_id"],
                )
                queued = result.sent + result.already_stored  # (already: stored by a retried Spark task)
                say(f"   sent {queued:,} tasks, rejected {result.rejected} in {time.monotonic() - t1:.1f}s")
                wait_for(
                    lambda: q.counters()["acked"] >= queued or any(p.poll() is not None for p in procs),
                    timeout,
                    "the workers to run every task",
                    interval=0.25,
                )
                if any(p.poll() is not None for p in procs):
                    raise SystemExit("a worker exited early")
                drained = time.monotonic() - t1
                say(
                    f"   the workers acked all {queued:,} tasks {drained:.1f}s after the enqueue began "
                    f"({queued / drained:,.0f}/s)"
                )
            finally:
                stop_workers(procs)
                log.close()

            # the stream catches up with the end of the log, then stops
            stream.processAllAvailable()
            stream.stop()
            logged = q.client.xlen(q.keys.events)
            events = spark.read.parquet(str(events_dir))
            streamed = events.count()
            say(f"3. the event log streamed back into Spark: {streamed:,} events (the stream holds {logged:,})")

            # 4. the analysis and the report
            report = write_report(events, out / "report.html", png_path=out / "report.png")
            say(f"4. report: {out / 'report.html'} (plots also in {out / 'report.png'})")
            say("   tenant      share   wait p50   wait p99")
            for tenant, _, _ in TENANTS:
                f = report.figures
                say(
                    f"   {tenant:<10} {f[f'{QUEUE}|{tenant}|share']:>6}  {f[f'{QUEUE}|{tenant}|wait_p50_ms']:>7} ms "
                    f"{f[f'{QUEUE}|{tenant}|wait_p99_ms']:>8} ms"
                )
            f = report.figures
            say(
                f"   Jain's index: mean {f[f'{QUEUE}||jain_mean']} (within a priority "
                f"{f[f'{QUEUE}||jain_within_rank_mean']}); rank error: mean {f[f'{QUEUE}||rank_error_mean']}"
            )
            ok = (
                result.sent + result.already_stored == rows
                and streamed == logged
                and int(report.figures[f"{QUEUE}||acked"]) == rows
            )
        finally:
            if stream.isActive:  # a failed run leaves no query running in the session
                stream.stop()
        if stop_spark:
            spark.stop()
    return {
        "ok": ok,
        "rows": rows,
        "sent": result.sent + result.already_stored,
        "events": streamed,
        "logged": logged,
        "figures": report.figures,
        "html": out / "report.html",
        "png": out / "report.png",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--out", default="spark-demo")
    args = parser.parse_args(argv)
    try:
        result = run(args.rows, args.workers, args.concurrency, args.out, args.work_ms)
    except WaitTimeout as exc:
        raise SystemExit(str(exc)) from None
    say("PASS" if result["ok"] else "FAIL")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
