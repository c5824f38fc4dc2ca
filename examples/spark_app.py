"""The Celery app of ``make spark-demo`` (``python -m examples.spark_pipeline``), configured from
the environment, so that its workers are plain ``celery worker`` processes.

PQ_SPARK_BROKER   broker URL, e.g. ``pq://127.0.0.1:PORT/0``
PQ_SPARK_OPTIONS  JSON of ``broker_transport_options`` (fair_key, event_log, key_prefix, ...)
PQ_SPARK_WORK_MS  how long one task works, in milliseconds (default 1)
PQ_SPARK_READY    Redis URL and list key "URL#KEY": a worker pushes its name there when ready

    celery -A examples.spark_app worker -Q pipeline -P threads -c 8
"""

import json
import os
import time

import redis
from celery import Celery
from celery.signals import worker_ready

import celery_pq  # noqa: F401  registers the pq:// scheme with kombu

QUEUE = "pipeline"
TASK = "pipeline.process"

app = Celery("spark_pipeline")
app.conf.update(
    broker_url=os.environ.get("PQ_SPARK_BROKER", "pq://127.0.0.1:6379/0"),
    broker_transport_options=json.loads(os.environ.get("PQ_SPARK_OPTIONS", "{}")),
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,  # a worker holds little beyond what it runs: fairness shows in the log
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

WORK_S = float(os.environ.get("PQ_SPARK_WORK_MS", "1")) / 1000


@app.task(name=TASK, ignore_result=True)
def process(row_id, size):
    """Stands for real work on one row."""
    time.sleep(WORK_S)
    return row_id


@worker_ready.connect
def _ready(sender=None, **_):
    url, _, key = os.environ.get("PQ_SPARK_READY", "").partition("#")
    if url and key:
        with redis.Redis.from_url(url) as client:
            client.rpush(key, sender.hostname if sender is not None else "?")
