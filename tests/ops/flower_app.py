"""The end-to-end tests' Celery app (tests/e2e/app.py) for a Flower process: with
PQ_TEST_TRANSPORT set, that is its ``broker_transport`` (a ``redis://`` URL in PQ_TEST_BROKER
with celery-pq's transport, the second way to name the broker)."""

import os

from tests.e2e.app import app

if os.environ.get("PQ_TEST_TRANSPORT"):
    app.conf.broker_transport = os.environ["PQ_TEST_TRANSPORT"]
