"""What Celery's own integration suite needs of us to run against ``pq://``, loaded with
``-p tests.peers.celery_plugin`` by ``python -m tests.peers.run celery``: the ``pq://`` scheme
registered with kombu before Celery reads ``TEST_BROKER``. Nothing of Celery's is edited: its
``t/integration/conftest.py`` takes the broker and result backend from ``TEST_BROKER`` and
``TEST_BACKEND``, and its tasks reach Redis at ``REDIS_HOST``/``REDIS_PORT`` (the runner points
all of them at a redis-server it starts)."""

import celery_pq  # noqa: F401 - registers pq:// with kombu
