"""A master demoted under its clients (REPLICAOF: a failover behind a virtual IP or a DNS name,
where the clients' address stays the same): it answers READONLY. A script call's connection is
then closed and the call fails as a connection error, so the next call connects again; kombu
producers and consumers carry on once the address leads to a master again, and lose nothing."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from kombu import Connection

import celery_pq  # noqa: F401  registers pq://
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import RedisServer, wait_for
from tests.deploy.test_sentinel import Collector, Publisher
from tests.support.consume import make_queue


@pytest.fixture
def pair():
    """A master and a second server, which follows it (a replica, synced)."""
    a = RedisServer("--repl-diskless-sync-delay", "0")
    b = RedisServer("--repl-diskless-sync-delay", "0")
    try:
        b.client().execute_command("REPLICAOF", "127.0.0.1", a.port)
        _wait_synced(b)
        yield a, b
    finally:
        b.close()
        a.close()


def _wait_synced(replica):
    def synced():
        role = replica.client(decode_responses=True).execute_command("ROLE")
        return role[0] == "slave" and role[3] == "connected"

    wait_for(synced, 30, "the replica to sync")


def _demote(a, b):
    """b takes over, with every write a had (a planned switch-over); a becomes its replica
    (answers READONLY to writes)."""
    assert a.client().execute_command("WAIT", 1, 5000) == 1
    b.client().execute_command("REPLICAOF", "NO", "ONE")
    a.client().execute_command("REPLICAOF", "127.0.0.1", b.port)
    _wait_synced(a)


def _restore(a, b):
    """a is the master again (with what b had), b its replica."""
    a.client().execute_command("REPLICAOF", "NO", "ONE")
    b.client().execute_command("REPLICAOF", "127.0.0.1", a.port)
    _wait_synced(b)


def _connection_ids(server, name):
    with server.client(decode_responses=True) as c:
        return {line.split()[0] for line in c.execute_command("CLIENT", "LIST").splitlines() if f"name={name} " in line}


def test_a_readonly_reply_closes_the_scripts_connection_and_is_a_connection_error(pair, key_prefix):
    a, b = pair
    client = redis.Redis(port=a.port, client_name="pq-ro-test")
    q = open_queue(client, "ro", QueueSettings(key_prefix=key_prefix), declare=False)
    q.insert(b"before", 1, id="before")
    held = _connection_ids(a, "pq-ro-test")
    assert held
    # When the server is demoted under the queue's connection
    _demote(a, b)
    # Then a call fails as a connection error (not READONLY), and its connection is closed
    with pytest.raises(redis.ConnectionError, match="read-only replica"):
        q.insert(b"during", 1, id="during")
    assert not held & _connection_ids(a, "pq-ro-test")
    # And once the address leads to a master again, the next call connects and runs
    _restore(a, b)
    q.insert(b"after", 1, id="after")
    assert [x.id for x in q.pop(5)] == ["before", "after"]
    client.close()


def test_kombu_producer_and_consumer_carry_on_through_a_demoted_master(pair, key_prefix):
    a, b = pair
    url = f"pq://127.0.0.1:{a.port}/0"
    options = {"key_prefix": key_prefix}
    queue = make_queue("ro")
    publisher = Publisher(url, options, queue, 0, pause=0.005)
    collector = Collector(Connection(url, transport_options=options), queue)
    consumer = threading.Thread(target=collector.run, daemon=True)
    publisher.start()
    consumer.start()
    try:
        # Given publishing and consuming under way
        wait_for(lambda: len(collector.got) > 100, 30, "consumption under way")
        # When the server is demoted (a replica of the other) for a while, then is the master again
        _demote(a, b)
        time.sleep(1.5)
        _restore(a, b)
        # Then the same producer and consumer go on
        count_then = len(collector.got)
        wait_for(lambda: len(collector.got) > count_then + 100, 30, "consumption after the demotion")
    finally:
        publisher.stop()
    returned = {n for n, _ in publisher.returned}
    wait_for(lambda: returned <= set(collector.got), 30, "every returned publish to be consumed")
    collector.should_stop = True
    consumer.join(timeout=30)
    # (A publish made while the server is a replica raises once kombu's reconnection, to the same
    # address, met READONLY again: the producer is told, nothing is lost; a sentinel's pool
    # reconnects to the new master instead.)
    print(
        f"\ndemoted master: {len(returned)} publishes returned, {len(publisher.raised)} raised, "
        f"{len(collector.got)} consumed"
    )
    assert consumer.is_alive() is False
    with redis.Redis(port=a.port) as c:
        assert open_queue(c, "ro", QueueSettings(key_prefix=key_prefix), declare=False).stats()["waiting"] == 0


@pytest.mark.e2e
def test_a_celery_worker_carries_on_through_a_demoted_master(pair, redis_server, key_prefix, tmp_path):
    from tests.e2e.test_celery_e2e import Harness

    a, b = pair
    # the broker on the pair's master; the tasks' records on the session's server (not demoted)
    h = Harness(redis_server, key_prefix, tmp_path, {}, acks_late=False)
    h.url = f"pq://127.0.0.1:{a.port}/0"
    h.env["PQ_TEST_BROKER"] = h.url
    h.app.conf.broker_url = h.url
    h.app.conf.task_publish_retry_policy = {
        "max_retries": 40,
        "interval_start": 0.1,
        "interval_step": 0.2,
        "interval_max": 0.5,
    }
    try:
        worker = h.worker("w1")
        # Given a worker consuming
        for n in range(20):
            h.send("e2e.record", n, 0)
        wait_for(lambda: len(h.records("order")) == 20, 30, "the first 20 tasks")
        # When its broker is demoted for a while (blocked and pinned connections meet UNBLOCKED and
        # READONLY), then is the master again
        _demote(a, b)
        time.sleep(1.5)
        _restore(a, b)
        for n in range(20, 40):
            h.send("e2e.record", n, 0)
        # Then the same worker runs the rest: it never exited
        wait_for(lambda: {n for n, _ in h.records("order")} >= set(range(40)), 60, "the 20 after")
        log = worker.log_path.read_text(errors="replace")
        assert worker.poll() is None
        assert "Unrecoverable error" not in log
    finally:
        h.close()
