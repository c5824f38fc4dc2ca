"""The demo's Celery app (``run.py`` starts its workers), configured from the environment:
PQ_DEMO_BROKER, PQ_DEMO_OPTIONS (JSON transport options), PQ_DEMO_RECORD (Redis URL where the tasks
record what they did) and PQ_DEMO_PREFIX (the records' key prefix, deleted afterwards)."""

import json
import os
import time

import redis
from celery import Celery
from celery.signals import worker_ready

from celery_pq.testing import worker_app_settings  # importing celery_pq registers pq:// with kombu

app = Celery("demo")
# task_acks_late: the lease lasts until the task ends, so a killed worker's task comes back
app.conf.update(worker_app_settings("PQ_DEMO", "demo", task_acks_late=True))

_rec = None


def record(kind, value):
    """Append ``value`` (JSON) to the Redis list ``<PQ_DEMO_PREFIX>:demo:<kind>``."""
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["PQ_DEMO_RECORD"])
    _rec.rpush(f"{os.environ['PQ_DEMO_PREFIX']}:demo:{kind}", json.dumps(value))


@worker_ready.connect
def _ready(**_):
    record("ready", os.getpid())


@app.task(name="demo.job")
def job(label, priority):
    record("order", [label, priority])


@app.task(name="demo.tenant_job")
def tenant_job(tenant, n):
    record("tenant", [tenant, n])


@app.task(name="demo.slow", bind=True)
def slow(self, seconds, tag):
    # A redelivery carries the deliveries before it as the header "x-delivery-count" (a first one
    # has none): Celery's request keeps no delivery_count of delivery_info.
    record(
        "start",
        {
            "tag": tag,
            "pid": os.getpid(),
            "delivery_count": (self.request.get("x-delivery-count") or 0) + 1,
            "redelivered": (self.request.delivery_info or {}).get("redelivered"),
            "time": time.time(),
        },
    )
    time.sleep(seconds)
    record("done", {"tag": tag, "pid": os.getpid(), "time": time.time()})
