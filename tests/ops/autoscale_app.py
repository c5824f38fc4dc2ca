"""The end-to-end tests' Celery app (tests/e2e/app.py) with the backlog autoscaler, for a worker
started with ``--autoscale``; short intervals so that the test stays short."""

from tests.e2e.app import app

app.conf.worker_autoscaler = "celery_pq.autoscale:BacklogAutoscaler"
app.conf.pq_autoscale_interval = 0.5
app.conf.pq_autoscale_idle_seconds = 2.0
