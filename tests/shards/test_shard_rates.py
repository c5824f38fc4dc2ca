"""Rate limits on a queue of shards (docs/rate-limits.md, "Rate limits with shards"): a task's
``task_rate``, a named tenant's rate and the default tenant's rate are each the rate over the
whole queue, with one shard or several: never more in any window (on Redis's clock, from every
shard's event log), and all of it (not rate / shards)."""

import time

import pytest
from kombu import Connection, Producer

from celery_pq import Item
from celery_pq.queue import open_queue
from celery_pq.transport.options import Options

try:
    from support.consume import make_queue
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import make_queue

SLOW = "proj.tasks.send_email"


@pytest.fixture
def url(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


def opened(client, options, name="kq"):
    return open_queue(client, name, Options(**options).queue_settings(name))


def pop_for(q, seconds):
    """Pop (100 a call, so a pop takes every token there is) and ack for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = q.pop(100)
        if got:
            q.ack(got)
        time.sleep(0.005)


def deliveries(q, tenant):
    """Redis times (ms) of the deliveries of ``tenant`` ("" the default), from every shard."""
    return sorted(e["ms"] for s in q.shards for e in s.events() if e["e"] == "deliver" and e["t"] == tenant)


def assert_whole_rate(times, rate):
    """At most max(rate, 1) + rate * w deliveries in any window of w seconds, and all of them:
    a pop takes every token its bucket has, so by the last delivery the bucket (full at the
    first) has given all it earned, less a fraction of a token."""
    cap = max(rate, 1)
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= cap + rate * (times[j] - times[i] + 1) / 1000, (i, j, times)
    assert len(times) >= rate + rate * (times[-1] - times[0]) / 1000 - 1, times


@pytest.mark.parametrize("shards", [1, 4])
def test_a_task_rate_is_the_rate_over_the_whole_queue(url, key_prefix, redis_client, shards):
    # Given a limited task's backlog published through kombu to a queue of `shards`
    options = {"key_prefix": key_prefix, "task_rate": {SLOW: 20}, "shards": shards, "event_log": 10_000}
    with Connection(url, transport_options=options) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        for i in range(80):
            p.publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q], headers={"task": SLOW})
    queue = opened(redis_client, options)
    # When consumers pop for a second
    pop_for(queue, 1.0)
    # Then the task went at 20/s over the whole queue: never more, and not 20 / shards
    times = deliveries(queue, "task:" + SLOW)
    assert_whole_rate(times, 20)
    assert queue.size() == 80 - len(times)


@pytest.mark.parametrize("shards", [1, 4])
def test_a_tenant_rate_is_the_rate_over_the_whole_queue_for_named_and_default_tenants(redis_client, key_prefix, shards):
    # Given a named tenant with a rate of its own and the default tenant (no tenant) under "*"
    options = {
        "key_prefix": key_prefix,
        "fair_key": "tenant",
        "tenant_rate": {"acme": 10, "*": 20},
        "shards": shards,
        "event_log": 10_000,
    }
    queue = opened(redis_client, options)
    queue.insert_many([Item(b"x", 5, None, tenant="acme") for _ in range(60)] + [Item(b"y", 5) for _ in range(80)])
    # When consumers pop for a second
    pop_for(queue, 1.0)
    # Then each went at its rate over the whole queue, whichever shards took its entries
    assert_whole_rate(deliveries(queue, "acme"), 10)
    assert_whole_rate(deliveries(queue, ""), 20)
