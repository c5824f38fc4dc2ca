"""Celery end to end: no-op tasks per second through a real worker, celery-pq vs kombu-redis.
Where RabbitMQ answers on localhost:5672, Celery on RabbitMQ with a priority queue
(x-max-priority 255) is a third column.

The queue is filled with N tasks before the worker starts; the clock starts when the first task
is done (so worker start-up is excluded) and stops when the last is done. Solo pool and prefork
with 2 processes, prefetch multiplier 1 (acks early, Celery's default). The no-op task
increments a counter in Redis (one INCR per task in both columns).

    python -m benchmarks.celery_e2e [--tasks 3000] [--repeat 3] [--smoke] [--out DIR]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis
from celery import Celery
from kombu import Queue

import celery_pq  # noqa: F401  (pq://)
from celery_pq.testing import celery_env, start_worker

from .common import cli, median, rabbitmq_url, redis_server, transports, versus_table

ROOT = Path(__file__).resolve().parent.parent
#: pool name -> (celery's -P, -c)
POOLS = {"solo": ("solo", 1), "prefork-2": ("prefork", 2)}


def tasks_per_second(port, url, kwargs, pool, n) -> float:
    options = kwargs.get("transport_options", {})
    rec = redis.Redis(port=port)
    rec.delete("bench:done")
    app = Celery("bench-fill", broker=url)
    app.conf.broker_transport_options = options
    if url.startswith("amqp"):
        app.conf.task_queues = [Queue("bench", queue_arguments={"x-max-priority": 255})]
        with app.connection_for_write() as conn:  # start empty: the queue outlives a run
            app.conf.task_queues[0](conn.default_channel).declare()
            app.conf.task_queues[0](conn.default_channel).purge()
    with app.connection_for_write() as conn:  # its own connection, closed here (not the shared pools)
        producer = conn.Producer()
        for _ in range(n):
            app.send_task("bench.noop", queue="bench", producer=producer)
    env = celery_env(
        ROOT, BENCH_BROKER=url, BENCH_OPTIONS=json.dumps(options), BENCH_RECORD=f"redis://127.0.0.1:{port}/0"
    )
    worker = start_worker(
        "benchmarks.celery_app",
        cwd=ROOT,
        env=env,
        queues="bench",
        pool=POOLS[pool][0],
        concurrency=POOLS[pool][1],
        loglevel="warning",
    )
    try:
        deadline = time.monotonic() + 120
        while int(rec.get("bench:done") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        start, first = time.perf_counter(), int(rec.get("bench:done") or 0)
        while int(rec.get("bench:done") or 0) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        done = int(rec.get("bench:done") or 0)
        return (done - first) / (time.perf_counter() - start)
    finally:
        worker.stop()
        app.close()
        rec.close()


def run(tasks=3000, repeat=3) -> dict:
    runs: dict = {pool: {} for pool in POOLS}
    rabbit = rabbitmq_url()
    with redis_server() as port:
        columns = transports(port)
        if rabbit:
            columns["rabbitmq"] = (rabbit, {})
        for _ in range(repeat):
            for pool in POOLS:
                for name, (url, kwargs) in columns.items():
                    runs[pool].setdefault(name, []).append(tasks_per_second(port, url, kwargs, pool, tasks))
    results = {}
    for pool, rows in runs.items():
        med = {name: median(v) for name, v in rows.items()}
        results[pool] = {"tasks_per_second": med, "ratio": med["celery-pq"] / med["kombu-redis"], "runs": rows}
    return {"tasks": tasks, "repeat": repeat, "rabbitmq": bool(rabbit), "results": results}


def markdown(data) -> list[str]:
    return [
        f"# Celery end to end, no-op tasks ({data['tasks']} per run, median of {data['repeat']} runs)",
        "",
        *versus_table("pool", "tasks/s", data["results"], "tasks_per_second", lambda pool: 1.2),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "celery_e2e",
        run,
        markdown,
        options=[("--tasks", int, 3000), ("--repeat", int, 3)],
        smoke={"tasks": 30, "repeat": 1},
    )


if __name__ == "__main__":
    main()
