"""wait_replicas / wait_timeout: a publish and an ack end with Redis WAIT on the same connection.

A master and one replica (no sentinels needed): with ``wait_replicas=1`` a publish returns when
the replica has it; asking for more replicas than there are makes a publish raise
``NotReplicated`` (the master still stored it, and a retry stores it once) and an ack log.
"""

from __future__ import annotations

import logging
import time

import pytest
from celery import Celery
from kombu import Connection
from kombu.exceptions import OperationalError

import celery_pq  # noqa: F401  registers pq://
from celery_pq import Item, NotReplicated, PriorityQueue
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import RedisServer, wait_for
from tests.support.consume import drain, make_queue, publish_numbers


@pytest.fixture
def pair():
    master = RedisServer("--repl-diskless-sync-delay", "0")  # the replica syncs at once
    replica = RedisServer("--replicaof", "127.0.0.1", str(master.port))
    try:
        wait_for(
            lambda: replica.client(decode_responses=True).info("replication").get("master_link_status") == "up",
            30,
            "the replica to sync",
        )
        # and acknowledging writes (its first acknowledgement can come a moment after the link
        # is up; a WAIT within the tests' short timeouts would count it as missing)
        with master.client() as c:
            c.set("pq-test-sync", 1)
            assert c.execute_command("WAIT", 1, 10_000) == 1, "replica never acknowledged a write"
            c.delete("pq-test-sync")
        yield master, replica
    finally:
        replica.close()
        master.close()


def url(server) -> str:
    return f"pq://127.0.0.1:{server.port}/0"


def test_with_one_replica_a_publish_returns_when_the_replica_has_it(pair, key_prefix):
    master, replica = pair
    queue = make_queue("wq")
    with Connection(url(master), transport_options={"key_prefix": key_prefix, "wait_replicas": 1}) as conn:
        publish_numbers(conn, queue, range(50))
        # the replica has all 50 the moment the publishes returned (no wait here)
        assert open_queue(replica.client(), "wq", QueueSettings(key_prefix=key_prefix), declare=False).size() == 50
        got = drain(conn, queue, 50)
    assert sorted(body["i"] for body, _ in got) == list(range(50))
    time.sleep(0.2)
    assert open_queue(replica.client(), "wq", QueueSettings(key_prefix=key_prefix), declare=False).size() == 0


def test_too_few_replicas_a_publish_raises_not_replicated_and_is_stored_once(pair, key_prefix):
    master, _ = pair
    app = Celery("wait", broker=url(master))
    app.conf.broker_transport_options = {"key_prefix": key_prefix, "wait_replicas": 2, "wait_timeout": 0.2}
    with app.connection_for_write() as conn:
        producer = app.amqp.Producer(conn)
        started = time.monotonic()
        # kombu treats it as a connection error (so that a publish retry sends it again) and
        # Celery reports those as kombu's OperationalError, NotReplicated as its cause
        with pytest.raises(OperationalError) as err:
            app.send_task("t.x", args=[1], queue="nr", task_id="task-nr-1", retry=False, producer=producer)
        waited = time.monotonic() - started
        assert 0.15 < waited < 5
        message = str(err.value)
        assert "only 1 of 2 replicas" in message and "may still be stored" in message and "'nr'" in message
        cause = err.value.__cause__
        assert isinstance(cause, NotReplicated) and (cause.acknowledged, cause.wanted) == (1, 2)
        q = open_queue(master.client(), "nr", QueueSettings(key_prefix=key_prefix), declare=False)
        assert q.size() == 1  # the master has it
        # one publish call retried by kombu's and Celery's publish retry (each attempt raises
        # NotReplicated after the master stored it): the call is stored once
        attempts = []
        with pytest.raises(OperationalError):
            app.send_task(
                "t.x",
                args=[2],
                queue="nr",
                task_id="task-nr-2",
                producer=producer,
                retry=True,
                retry_policy={
                    "max_retries": 3,
                    "interval_start": 0,
                    "interval_step": 0.05,
                    "errback": lambda exc, interval: attempts.append(exc),
                },
            )
        assert attempts, "kombu did not retry the publish"
        assert sorted(e.id for e in q.peek(10)) == ["task-nr-1", "task-nr-2"]
    app.close()


def test_not_replicated_is_retried_by_kombu_as_a_connection_error():
    from celery_pq.transport.channel import Transport

    assert NotReplicated in Transport.connection_errors


def test_too_few_replicas_an_ack_logs_and_still_acks(pair, key_prefix, caplog):
    master, _ = pair
    queue = make_queue("na")
    opts = {"key_prefix": key_prefix, "wait_replicas": 2, "wait_timeout": 0.1}
    with Connection(url(master), transport_options={"key_prefix": key_prefix}) as conn:
        publish_numbers(conn, queue, range(3))
    with caplog.at_level(logging.WARNING, logger="celery_pq.queue"):
        with Connection(url(master), transport_options=opts) as conn:
            got = drain(conn, queue, 3)
    assert len(got) == 3
    assert any(
        "only 1 of 2 replicas acknowledged" in r.getMessage() and "'na'" in r.getMessage() for r in caplog.records
    )
    assert open_queue(master.client(), "na", QueueSettings(key_prefix=key_prefix), declare=False).size() == 0
    assert not master.client().hlen(f"{key_prefix}:{{na}}:lt")  # acked, not just logged


def test_without_replicas_the_queue_api_says_what_it_did(key_prefix):
    with RedisServer() as server:
        q = open_queue(
            server.client(), "solo", QueueSettings(key_prefix=key_prefix, wait_replicas=1, wait_timeout=0.05)
        )
        with pytest.raises(NotReplicated, match="only 0 of 1 replicas"):
            q.insert(b"x", 5, id="a")
        with pytest.raises(NotReplicated) as err:
            q.insert_many([Item(b"y", 5, "b"), Item(b"z", 5, "c")])
        assert err.value.stored == ["b", "c"] and len(err.value.items) == 2
        assert q.size() == 3
        [lease] = q.pop()
        assert q.ack(lease)  # an ack that no replica acknowledged is still an ack (logged)
        with pytest.raises(ValueError, match="wait_replicas"):
            PriorityQueue(server.client(), "solo", key_prefix=key_prefix, wait_replicas=-1)
        with pytest.raises(ValueError, match="wait_timeout"):
            PriorityQueue(server.client(), "solo", key_prefix=key_prefix, wait_timeout=0)
