"""The transport with ``shards``: kombu producers and consumers, wake-ups across shards, rejects
and give-backs to the right shard, and the operator's stats summing the shards."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kombu import Connection, Consumer, Producer

from celery_pq.queue import open_queue
from celery_pq.queue.sharded import ShardedQueue
from celery_pq.transport.broker import Broker, queue_and_view
from celery_pq.transport.options import Options

try:
    from support.consume import drain, make_queue
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


def sharded(client, prefix, n=4, name="kq"):
    return open_queue(client, name, Options(key_prefix=prefix, shards=n).queue_settings(name))


def publish(conn, count, priority=lambda i: 0):
    """Publish ``{"i": i}`` for i < count to the queue ``kq`` at ``priority(i)``; the queue."""
    q = make_queue()
    p = Producer(conn.default_channel)
    for i in range(count):
        p.publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q], priority=priority(i))
    return q


@pytest.mark.parametrize("n", [1, 4])
def test_every_message_is_delivered_once_and_acked_in_its_shard(url, key_prefix, redis_client, n):
    opts = {"key_prefix": key_prefix, "shards": n, "peek": 2}
    with Connection(url, transport_options=opts) as conn:
        q = publish(conn, 120, lambda i: i % 7)
        got = drain(conn, q, 120, timeout=20, prefetch=10)
    assert sorted(b["i"] for b, _ in got) == list(range(120))
    queue = sharded(redis_client, key_prefix, n)
    s = queue.stats()
    assert (s["waiting"], s["leased"]) == (0, 0)
    assert queue.counters()["acked"] == 120
    if n > 1:
        assert all(shard.counters()["acked"] for shard in queue.shards)  # every shard served


def test_a_blocked_consumer_is_woken_by_a_publish_to_any_shard(url, key_prefix, redis_client):
    opts = {"key_prefix": key_prefix, "shards": 4, "peek": 1, "block_seconds": 30}
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        got = []

        def publish_later():
            time.sleep(0.3)
            with Connection(url, transport_options=opts) as other:
                prod = Producer(other.default_channel)
                for i in range(8):
                    prod.publish({"i": i}, exchange=q.exchange, routing_key="kq")

        t = threading.Thread(target=publish_later)
        t.start()
        with Consumer(conn, [q], callbacks=[lambda body, m: (got.append(body), m.ack())], prefetch_count=1):
            deadline = time.monotonic() + 20  # well under block_seconds: a wake-up, not a timeout
            while len(got) < 8 and time.monotonic() < deadline:
                conn.drain_events(timeout=5)
        t.join()
    assert sorted(b["i"] for b in got) == list(range(8))
    assert len({s.name for s in sharded(redis_client, key_prefix).shards if s.counters()["delivered"]}) > 1


def test_a_priority_view_consumes_only_its_priorities_from_every_shard(url, key_prefix, redis_client):
    opts = {"key_prefix": key_prefix, "shards": 4}
    with Connection(url, transport_options=opts) as conn:
        publish(conn, 40, lambda i: 220 if i % 4 else 5)
        got = drain(conn, make_queue("kq[>=200]"), 30, timeout=20, prefetch=5)
    assert sorted(b["i"] for b, _ in got) == [i for i in range(40) if i % 4]
    queue = sharded(redis_client, key_prefix)
    assert queue.size() == 10 and queue.peek(1)[0].priority == 5


def test_reject_with_requeue_and_dead_letter_go_to_the_shard(url, key_prefix, redis_client):
    opts = {"key_prefix": key_prefix, "shards": 4}
    with Connection(url, transport_options=opts) as conn:
        q = publish(conn, 6)
        seen = []

        def on_message(body, message):
            seen.append(body["i"])
            if body["i"] % 2 and seen.count(body["i"]) == 1:
                message.reject(requeue=True)
            elif body["i"] == 4:
                message.reject(requeue=False)
            else:
                message.ack()

        with Consumer(conn, [q], callbacks=[on_message], prefetch_count=1):
            deadline = time.monotonic() + 20
            while len(seen) < 9 and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass
    assert sorted(seen) == [0, 1, 1, 2, 3, 3, 4, 5, 5]
    s = sharded(redis_client, key_prefix).stats()
    assert (s["waiting"], s["leased"], s["dead"]) == (0, 0, 1)


def test_operator_stats_sum_the_shards(redis_server, url, key_prefix, redis_client):
    opts = {"key_prefix": key_prefix, "shards": 4}
    with Connection(url, transport_options=opts) as conn:
        publish(conn, 20, lambda i: 200 if i < 5 else 1)
    with Broker.of(url, opts).channel() as channel:
        queue, _ = queue_and_view(channel, "kq")
        assert isinstance(queue, ShardedQueue)
        assert queue.stats()["waiting"] == 20
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_pq",
            "--broker",
            url,
            "--transport-options",
            json.dumps(opts),
            "stats",
            "--json",
            "kq",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["waiting"] == 20 and row["per_priority"] == {"200": 5, "1": 15}
    assert len(row["shards"]) == 4 and sum(r["waiting"] for r in row["shards"]) == 20
    from celery_pq.ops.metrics import PQCollector

    fams = {f.name: f for f in PQCollector(url, ["kq"], transport_options=opts).collect()}
    assert [s.value for s in fams["celery_pq_waiting_messages"].samples] == [20]
    assert {s.labels["queue"] for s in fams["celery_pq_waiting_messages"].samples} == {"kq"}
