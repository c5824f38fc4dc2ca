"""Broker-side expiry through kombu, against a real redis-server: ``expiration=`` (per message)
and ``Queue(message_ttl=...)`` (``x-message-ttl``) are honoured: an expired message is never
delivered; it waits in ``<queue>.dead`` with reason ``expired`` (or is dropped)."""

import time

import pytest
from kombu import Connection, Exchange, Producer, Queue

from celery_pq.transport.messages import expiration_ms
from tests.support import needs_producer_batch

try:
    from support.consume import drain
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain


@pytest.fixture
def opts(key_prefix):
    return {"key_prefix": key_prefix, "event_log": 1000}


def bodies(got):
    return [body for body, _ in got]


def test_expiration_per_message(url, opts):
    q = Queue("xp", Exchange("xp", type="direct"), routing_key="xp")
    with Connection(url, transport_options=opts) as conn:
        p = Producer(conn.default_channel)
        # Given one message that expires in 0.2 s and two that do not expire
        p.publish({"n": 1}, exchange=q.exchange, routing_key="xp", declare=[q], expiration=0.2)
        p.publish({"n": 2}, exchange=q.exchange, routing_key="xp", declare=[q])
        p.publish({"n": 3}, exchange=q.exchange, routing_key="xp", declare=[q], expiration=60)
        time.sleep(0.4)
        # When a consumer comes, only the live ones are delivered
        got = drain(conn, q, 3, timeout=2)
        assert bodies(got) == [{"n": 2}, {"n": 3}]
        # and the delivered message keeps its expiration property, as published
        assert got[1][1].properties.get("expiration") == "60000"
        # Then the expired one is in xp.dead, reason "expired", counted
        pq = conn.default_channel.queue("xp")
        [dead] = pq.dead.peek(5)
        assert dead.dead_reason == "expired"
        assert pq.counters()["expired"] == 1
        assert pq.counters()["delivered"] == 2


def test_queue_message_ttl(url, opts):
    q = Queue("ttlq", Exchange("ttlq", type="direct"), routing_key="ttlq", message_ttl=0.2)
    with Connection(url, transport_options=opts) as conn:
        q(conn.default_channel).declare()
    # a publisher on another connection, which never declares the queue, is subject to its TTL
    plain = Queue("ttlq", Exchange("ttlq", type="direct"), routing_key="ttlq")
    with Connection(url, transport_options=opts) as conn:
        p = Producer(conn.default_channel)
        p.publish({"n": 1}, exchange=plain.exchange, routing_key="ttlq")
        # a message's own, shorter expiration wins over the queue's TTL; a longer one does not
        p.publish({"n": 2}, exchange=plain.exchange, routing_key="ttlq", expiration=60)
        time.sleep(0.4)
        p.publish({"n": 3}, exchange=plain.exchange, routing_key="ttlq")
        assert bodies(drain(conn, plain, 3, timeout=2)) == [{"n": 3}]
        pq = conn.default_channel.queue("ttlq")
        assert pq.counters()["expired"] == 2
        assert sorted(e.dead_reason for e in pq.dead.peek(5)) == ["expired", "expired"]


def test_queue_message_ttl_is_forgotten_with_the_queue(url, opts):
    q = Queue("gone", Exchange("gone", type="direct"), routing_key="gone", message_ttl=0.1)
    with Connection(url, transport_options=opts) as conn:
        ch = conn.default_channel
        q(ch).declare()
        assert ch.routing.message_ttl("gone") == 100
        q(ch).delete()
        assert ch.routing.message_ttl("gone") is None


def test_expired_drop_option(url, opts):
    opts["expired"] = "drop"
    q = Queue("xd", Exchange("xd", type="direct"), routing_key="xd")
    with Connection(url, transport_options=opts) as conn:
        p = Producer(conn.default_channel)
        p.publish({"n": 1}, exchange=q.exchange, routing_key="xd", declare=[q], expiration=0.1)
        p.publish({"n": 2}, exchange=q.exchange, routing_key="xd", declare=[q])
        time.sleep(0.3)
        assert bodies(drain(conn, q, 2, timeout=1.5)) == [{"n": 2}]
        pq = conn.default_channel.queue("xd")
        assert pq.dead.peek(5) == []
        assert pq.counters()["expired"] == 1
        assert [e["r"] for e in pq.events() if e["e"] == "remove"] == ["expired"]


@needs_producer_batch
def test_expiry_in_a_publish_batch(url, opts):
    # a batch (kombu's Producer.batch(), one insert call per queue at the flush) keeps each
    # message's expiration and its queue's message_ttl, and Celery's expires header
    q = Queue("xb", Exchange("xb", type="direct"), routing_key="xb", message_ttl=60)
    with Connection(url, transport_options=opts) as conn:
        q(conn.default_channel).declare()
        p = Producer(conn.default_channel)
        past = "2000-01-01T00:00:00+00:00"
        with p.batch():
            p.publish({"n": 1}, exchange=q.exchange, routing_key="xb", expiration=0.1)
            p.publish({"n": 2}, exchange=q.exchange, routing_key="xb")
            p.publish({"n": 3}, exchange=q.exchange, routing_key="xb", headers={"expires": past})
        pq = conn.default_channel.queue("xb")
        deadlines = [e.expires_ms for e in pq.peek(3)]
        assert len(deadlines) == 3 and None not in deadlines  # message_ttl gave each one
        time.sleep(0.3)
        assert bodies(drain(conn, q, 3, timeout=1.5)) == [{"n": 2}]
        assert pq.counters()["expired"] == 2


def test_an_infinite_expiration_never_expires_and_an_infinite_queue_ttl_is_refused_by_name(url, opts):
    # An "inf" expiration property (kombu's publish cannot make one; another client can) is no
    # deadline, as any other unreadable one: the worker still checks
    assert expiration_ms("inf") is None and expiration_ms("1.5") == 1
    with Connection(url, transport_options=opts) as conn:
        p = Producer(conn.default_channel)
        # A queue declared with an infinite x-message-ttl is refused, naming the argument
        bad = Queue(
            "xinf", Exchange("xinf", type="direct"), routing_key="xinf", queue_arguments={"x-message-ttl": float("inf")}
        )
        with pytest.raises(ValueError, match="x-message-ttl must be a number of milliseconds"):
            p.publish({"n": 2}, exchange=bad.exchange, routing_key="xinf", declare=[bad])
