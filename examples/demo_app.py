"""The Celery app of the demo (configured by the demo through environment variables)."""

import json
import os
import time

import redis
from celery import Celery

import celery_pq  # noqa: F401  registers pq://

app = Celery("demo")
app.conf.update(
    broker_url=os.environ.get("PQ_DEMO_BROKER", "pq://127.0.0.1:6379/0"),
    broker_transport_options=json.loads(os.environ.get("PQ_DEMO_OPTIONS", "{}")),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue="demo",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

_rec = None


def record(kind, value):
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["PQ_DEMO_RECORD"])
    _rec.rpush(f"{os.environ['PQ_DEMO_PREFIX']}:demo:{kind}", json.dumps(value))


@app.task(name="demo.job")
def job(label, priority):
    record("order", [label, priority])


@app.task(name="demo.tenant_job")
def tenant_job(tenant, n):
    record("tenant", [tenant, n])


@app.task(name="demo.slow", bind=True)
def slow(self, seconds, tag):
    record("start", [tag, os.getpid(), self.request.get("x-delivery-count"), time.time()])
    time.sleep(seconds)
    record("done", [tag, os.getpid(), time.time()])
