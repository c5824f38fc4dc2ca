"""A Celery app for the end-to-end tests, configured from the environment.

PQ_TEST_BROKER     broker URL (pq://127.0.0.1:PORT/0)
PQ_TEST_OPTIONS    JSON of broker_transport_options
PQ_TEST_RECORD     Redis URL where tasks record what they did (list keys under PQ_TEST_PREFIX)
PQ_TEST_PREFIX     key prefix of this test (also used for the records)
PQ_TEST_ACKS_LATE  "1" for task_acks_late
PQ_TEST_SSL        JSON of broker_use_ssl (pqs://), when set
PQ_TEST_CANCEL_ON_LOSS  "1" for worker_cancel_long_running_tasks_on_connection_loss
"""

import json
import os
import signal
import time

from celery import Celery

import celery_pq  # noqa: F401  (registers pq://)

from .recording import configure, log, rec

app = Celery("e2e")
configure(
    app,
    task_acks_late=os.environ.get("PQ_TEST_ACKS_LATE") == "1",
    broker_use_ssl=json.loads(os.environ.get("PQ_TEST_SSL") or "false"),
    worker_cancel_long_running_tasks_on_connection_loss=os.environ.get("PQ_TEST_CANCEL_ON_LOSS") == "1",
)


def delivery_number(request) -> int:
    """1 for a first delivery: a redelivery carries the deliveries before it in the header
    x-delivery-count (a first delivery has none)."""
    return (request.get("x-delivery-count") or 0) + 1


@app.task(name="e2e.record")
def record(n, priority=None):
    log("order", [n, priority])


@app.task(name="e2e.sleep", bind=True)
def sleeper(self, seconds, tag):
    log("start", [tag, os.getpid(), delivery_number(self.request)])
    time.sleep(seconds)
    log("done", [tag, os.getpid()])


@app.task(name="e2e.spin", bind=True)
def spin(self, seconds, tag):
    """Holds the CPU for ``seconds`` without yielding (no I/O, no sleep): under gevent or eventlet
    the hub waits, and every greenlet with it."""
    log("start", [tag, os.getpid(), delivery_number(self.request)])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    log("done", [tag, os.getpid()])


@app.task(name="e2e.crash", bind=True)
def crash(self, tag):
    log("crash", [tag, os.getpid(), delivery_number(self.request)])
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="e2e.retry_once", bind=True, max_retries=3)
def retry_once(self, tag, hold):
    log("retry", [tag, self.request.id, self.request.retries])
    if self.request.retries == 0:
        # republish this same task id while this delivery is still leased, then keep working
        self.retry(countdown=0, throw=False)
        time.sleep(hold)
    log("retry_done", [tag, self.request.retries])


@app.task(name="e2e.tenant_record")
def tenant_record(tenant, n):
    log("tenant", [tenant, n])


@app.task(name="e2e.tenant_work")
def tenant_work(tenant, seconds):
    r, prefix = rec(), os.environ["PQ_TEST_PREFIX"]
    running = r.incr(f"{prefix}:running:{tenant}")
    log("concurrency", [tenant, running])
    time.sleep(seconds)
    r.decr(f"{prefix}:running:{tenant}")


@app.task(name="e2e.tenant_busy")
def tenant_busy(tenant, seconds):
    """``seconds`` of worker time for ``tenant`` (a sleep: no CPU taken from the other processes)."""
    time.sleep(seconds)
    log("busy", [tenant, seconds, time.time()])


@app.task(name="e2e.stamp", bind=True)
def stamp(self, tag):
    log("stamp", [tag, os.getpid(), time.time()])


@app.task(name="e2e.echo", bind=True, max_retries=2)
def echo(self, *args, **kwargs):
    """Records what the worker read of its message; retries once when asked to."""
    r = self.request
    log(
        "echo",
        {
            "id": r.id,
            "args": list(args),
            "kwargs": kwargs,
            "parent_id": r.parent_id,
            "root_id": r.root_id,
            "group": r.group,
            "group_index": r.group_index,
            "retries": r.retries,
            "expires": r.expires,
            "eta": r.eta,
            "priority": (r.delivery_info or {}).get("priority"),
            "task": r.task,
        },
    )
    if kwargs.get("retry") and r.retries == 0:
        raise self.retry(countdown=0)
    return args[0] if args else None


def _redis_time_us() -> int:
    seconds, micros = rec().time()
    return seconds * 1_000_000 + micros


@app.task(name="e2e.rate_limited")
def rate_limited(n):
    """The task a test limits with task_rate: records the Redis time (us) it ran at."""
    log("limited", [n, _redis_time_us()])


@app.task(name="e2e.rate_free")
def rate_free(n):
    """A task beside it on the same queue, not limited."""
    log("free", [n, _redis_time_us()])
