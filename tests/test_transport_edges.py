"""The transport at its edges: lost replies, lost connections, refused writes, bad data and bad
options, each on a real redis-server (no Celery worker; see test_celery_e2e.py for those)."""

import logging
import socket
import threading
import time

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from celery_pq import PriorityQueue


def make_queue(name="kq"):
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def url_of(server, user=""):
    return f"pq://{user}127.0.0.1:{server.port}/0"


def normal_clients(server) -> int:
    """Connections of type normal on the server, the asking one excluded."""
    with server.client() as admin:
        return len(admin.client_list(_type="normal")) - 1


# -- a thread's own connection ------------------------------------------------------------------
def test_short_lived_threads_do_not_keep_a_connection_each(fresh_redis):
    # Given a producer limited to 50 connections
    with Connection(url_of(fresh_redis), transport_options={"max_connections": 50}) as conn:
        q = make_queue()
        producer = Producer(conn.default_channel)
        q(conn.default_channel).declare()
        errors = []

        def publish(i):
            try:
                producer.publish({"i": i}, exchange=q.exchange, routing_key="kq")
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        # When 300 short-lived threads publish once each, ten at a time
        for wave in range(30):
            threads = [threading.Thread(target=publish, args=(wave * 10 + j,)) for j in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        # Then every publish worked and the finished threads' connections were given back
        assert errors == []
        assert PriorityQueue(conn.default_channel.client, "kq", key_prefix="pq").size() == 300
        assert normal_clients(fresh_redis) <= 12


def test_a_dropped_connection_frees_its_pool_slot(fresh_redis):
    client = redis.Redis(connection_pool=redis.ConnectionPool(port=fresh_redis.port, max_connections=3))
    q = PriorityQueue(client, "slots")
    try:
        for _ in range(5):  # each round the thread's own connection is killed under it
            q.insert(b"x", 1)
            with fresh_redis.client() as admin:
                admin.client_kill_filter(_type="normal", skipme=True)
        q.insert(b"x", 1)  # before: "Too many connections" once the dropped ones used the pool up
        assert q.size() == 6
    finally:
        client.connection_pool.disconnect()
