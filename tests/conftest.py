"""Fixtures shared by every layer: real redis-server processes the tests start themselves
(``celery_pq.testing.RedisServer``).

- ``redis_server``  one RedisServer for the whole session (never the machine's Redis on 6379)
- ``redis_url``     its URL, ``redis://127.0.0.1:PORT/0``
- ``redis_client``  a bytes-replying redis.Redis connected to it
- ``key_prefix``    a unique key prefix per test: isolation is by prefix, never FLUSHALL
- ``fresh_redis``   a brand-new RedisServer private to one test (restarts, crashes, config)
- ``make_pq``       ``make_pq(name, **settings)``: a queue opened the one way
                    (``open_queue``) on ``redis_client`` under ``key_prefix``

tests/valkey/ overrides ``redis_server`` and ``fresh_redis`` with Valkey servers and reruns
chosen modules there (its conftest.py says how).

Every test has a timeout (``timeout`` in pyproject.toml, via pytest-timeout).
"""

from __future__ import annotations

import uuid

import pytest
import redis

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import RedisServer, find_redis_server, find_valkey_server


def pytest_report_header(config):
    lines = []
    for name, find in (("redis-server", find_redis_server), ("valkey-server (tests/valkey)", find_valkey_server)):
        try:
            lines.append(f"{name}: {find()}")
        except RuntimeError as exc:
            lines.append(f"{name}: {exc}")
    return lines


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_server):
    client = redis_server.client(decode_responses=False)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def key_prefix(request) -> str:
    prefix = "pqt" + uuid.uuid4().hex[:10]
    yield prefix
    # Tidy the shared session server after tests that used it (best effort, keys of this test only).
    if "redis_server" in request.fixturenames:
        server = request.getfixturevalue("redis_server")
        if server.running:
            client = server.client()
            try:
                batch = []
                for key in client.scan_iter(match=f"{prefix}*", count=1000):
                    batch.append(key)
                    if len(batch) >= 500:
                        client.unlink(*batch)
                        batch.clear()
                if batch:
                    client.unlink(*batch)
            except redis.RedisError:
                pass
            finally:
                client.close()


@pytest.fixture
def fresh_redis():
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_pq(redis_client, key_prefix):
    """``make_pq(name, **settings)``: ``open_queue(redis_client, name, QueueSettings(...))``
    under this test's key prefix (``key_prefix=`` in the settings overrides it; ``client=``
    another client). ``declare`` is False unless given: opening writes nothing, as a producer
    opens a queue (``declare=True``: as a consumer declares it, docs/settings.md)."""

    def make(name: str = "q", *, client=None, declare: bool = False, **settings):
        settings.setdefault("key_prefix", key_prefix)
        return open_queue(redis_client if client is None else client, name, QueueSettings(**settings), declare=declare)

    return make
