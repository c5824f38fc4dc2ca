"""One process that fills the queue and then runs a Celery worker on it, for benchmarks/celery_e2e.py.

kombu's ``memory://`` transport keeps its queues in the process, so its producer and its worker
must be one process; every column of the benchmark runs this way, so that each is measured alike:
this process sends ``BENCH_TASKS`` no-op tasks (``bench.noop``, one Redis INCR each) through the
app's own connection, then starts the worker in its main thread (``app.Worker(...).start()``) on
the queue ``bench``; the parent watches the counter in Redis and ends this process (SIGTERM).

Configured by the environment: ``BENCH_BROKER``, ``BENCH_OPTIONS`` and ``BENCH_RECORD`` (as
benchmarks/celery_app.py), ``BENCH_TASKS``, ``BENCH_POOL`` (Celery's -P), ``BENCH_CONCURRENCY``,
``BENCH_PREFETCH`` (the prefetch multiplier) and ``BENCH_ACKS_LATE`` ("1": task_acks_late).

    python -m benchmarks.celery_inproc
"""

from __future__ import annotations

import os

from .celery_app import app


def fill(n: int) -> None:
    """Send ``n`` no-op tasks to the queue ``bench`` (an empty queue: RabbitMQ's outlives a run)."""
    with app.connection_for_write() as conn:  # its own connection, closed here (not the shared pools)
        if app.conf.task_queues:  # RabbitMQ: declared with its priorities, then emptied
            app.conf.task_queues[0](conn.default_channel).declare()
            app.conf.task_queues[0](conn.default_channel).purge()
        producer = conn.Producer()
        for _ in range(n):
            app.send_task("bench.noop", queue="bench", producer=producer)


def main() -> None:
    app.conf.task_acks_late = os.environ.get("BENCH_ACKS_LATE") == "1"
    app.conf.worker_prefetch_multiplier = int(os.environ["BENCH_PREFETCH"])
    fill(int(os.environ["BENCH_TASKS"]))
    worker = app.Worker(
        hostname="bench@%h",
        queues=["bench"],
        pool_cls=os.environ["BENCH_POOL"],
        concurrency=int(os.environ["BENCH_CONCURRENCY"]),
        prefetch_multiplier=app.conf.worker_prefetch_multiplier,
        loglevel="WARNING",
        without_mingle=True,
        without_gossip=True,
        quiet=True,
    )
    worker.start()


if __name__ == "__main__":
    main()
