"""Memory limits: a Redis that may evict any key (maxmemory-policy allkeys-*) is warned about
loudly when the transport starts; noeviction (a full Redis refuses a publish whole:
tests/transport/test_transport_edges.py) and the volatile-* policies (they evict only keys
with a time to live: of ours, the sweep guard) are not."""

import logging

import pytest
from kombu import Connection

from celery_pq.testing import RedisServer

LOGGER = "celery_pq.storage.connections"


def _warnings(caplog, policy):
    with RedisServer(config={"maxmemory": "100mb", "maxmemory-policy": policy}) as server:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            with Connection(f"pq://127.0.0.1:{server.port}/0") as conn:
                conn.default_channel  # the first channel checks
                conn.channel().close()  # a second one does not warn again
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_an_evicting_redis_is_warned_about_once_at_start(caplog, policy):
    [message] = _warnings(caplog, policy)
    assert f"maxmemory-policy {policy}" in message and "noeviction" in message and "losing messages" in message


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru"])
def test_a_redis_that_evicts_none_of_our_keys_is_not_warned_about(caplog, policy):
    assert _warnings(caplog, policy) == []


def test_a_user_not_allowed_info_starts_without_the_check(caplog):
    with RedisServer(config={"maxmemory-policy": "allkeys-lru"}) as server:
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info")
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            with Connection(f"pq://noinfo:pw@127.0.0.1:{server.port}/0") as conn:
                conn.default_channel
    assert [r for r in caplog.records if r.name == LOGGER] == []
