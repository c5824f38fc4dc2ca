"""Celery app of the benchmarks: configured by BENCH_BROKER, BENCH_OPTIONS (JSON), BENCH_RECORD."""

import os
import time

import redis
from celery import Celery
from kombu import Queue

import celery_pq  # noqa: F401
from celery_pq.testing import worker_app_settings

app = Celery("bench")
app.conf.update(worker_app_settings("BENCH", "bench"))
if app.conf.broker_url.startswith("amqp"):  # RabbitMQ: a priority queue, as its users declare it
    app.conf.task_queues = [Queue("bench", queue_arguments={"x-max-priority": 255})]
_rec = None


@app.task(name="bench.stamp")
def stamp(t_ns):
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["BENCH_RECORD"])
    _rec.rpush("bench:latency", time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t_ns)


@app.task(name="bench.noop")
def noop():
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["BENCH_RECORD"])
    _rec.incr("bench:done")


def _ran():
    """Record this execution's Redis time (us) in the list ``bench:ran``."""
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["BENCH_RECORD"])
    seconds, micros = _rec.time()
    _rec.rpush("bench:ran", seconds * 1_000_000 + micros)


@app.task(name="bench.limited")
def limited():
    """Limited by the broker (the task_rate option of the run that sends it)."""
    _ran()


@app.task(name="bench.worker_limited", rate_limit=os.environ.get("BENCH_RATE_LIMIT") or None)
def worker_limited():
    """Limited by Celery's own rate_limit (BENCH_RATE_LIMIT, e.g. "20/s"): in each worker."""
    _ran()


@app.task(name="bench.late")
def late(eta):
    """Record how late (ms) it started after ``eta`` (Unix seconds, this host's clock)."""
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["BENCH_RECORD"])
    _rec.rpush("bench:late", (time.time() - eta) * 1000)
