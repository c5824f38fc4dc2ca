"""The Celery app of the switch-over test (tests/e2e/test_switch_from_kombu.py): the same tasks
on either transport, configured from the environment.

PQ_SWITCH_BROKER   broker URL: redis://... (kombu's Redis transport) or pq://... (celery-pq)
PQ_SWITCH_RESULTS  Redis URL of the result store: each run of a task INCRs runs:<task id>
PQ_SWITCH_SLEEP    seconds each task takes (a slow old worker lets a backlog build up)
"""

import os
import time

import redis
from celery import Celery

import celery_pq  # noqa: F401  (registers pq://)
from celery_pq.testing import worker_app_settings

app = Celery("switch")
app.conf.update(worker_app_settings("PQ_SWITCH", "q", broker="redis://127.0.0.1:6379/0"))

_results = None


@app.task(name="switch.count", bind=True)
def count(self, n):
    global _results
    if _results is None:
        _results = redis.Redis.from_url(os.environ["PQ_SWITCH_RESULTS"])
    time.sleep(float(os.environ.get("PQ_SWITCH_SLEEP", "0")))
    _results.incr(f"runs:{self.request.id}")
