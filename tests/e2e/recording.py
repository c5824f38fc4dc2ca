"""What the end-to-end test apps share (``tests.e2e.app``, ``tests.e2e.unique_app``): their
Celery settings from the environment, and the record their tasks keep in the test's own Redis
(``PQ_TEST_RECORD``, keys under ``PQ_TEST_PREFIX``)."""

import json
import os

import redis

from celery_pq.testing import worker_app_settings


def configure(app, **settings) -> None:
    """The settings every test app takes (its broker from ``PQ_TEST_BROKER`` and
    ``PQ_TEST_OPTIONS``: ``worker_app_settings``), then ``settings``."""
    app.conf.update(
        worker_app_settings(
            "PQ_TEST", "q", **{"worker_cancel_long_running_tasks_on_connection_loss": False, **settings}
        )
    )


_rec = None


def rec():
    """The test's own Redis, where tasks keep their record (one client per process)."""
    global _rec
    if _rec is None:
        _rec = redis.Redis.from_url(os.environ["PQ_TEST_RECORD"])
    return _rec


def log(kind, value):
    rec().rpush(f"{os.environ['PQ_TEST_PREFIX']}:rec:{kind}", json.dumps(value))
