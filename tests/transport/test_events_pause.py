"""The event log and pause/resume through kombu, against a real redis-server."""

import threading
import time

from kombu import Connection, Consumer, Exchange, Producer, Queue

from celery_pq.testing import wait_for
from tests.support.tenants import tenant_deliveries

try:
    from support.consume import drain, make_queue
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue


def url_of(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


def test_a_kombu_round_trip_is_logged_with_the_task_name(redis_server, make_pq, key_prefix):
    opts = {"key_prefix": key_prefix, "event_log": 1000}
    with Connection(url_of(redis_server), transport_options=opts) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        Producer(conn.default_channel).publish(
            {"n": 1},
            exchange=q.exchange,
            routing_key="kq",
            priority=9,
            headers={"id": "task-1", "task": "proj.tasks.add"},
        )
        [(body, _)] = drain(conn, q, 1)
        assert body == {"n": 1}
    events = make_pq("kq").events()
    assert [(r["e"], r["id"], r["p"]) for r in events] == [
        ("enqueue", "task-1", 9),
        ("deliver", "task-1", 9),
        ("ack", "task-1", 9),
    ]
    assert events[0]["task"] == "proj.tasks.add"
    assert events[1]["c"] and events[1]["c"] == events[2]["c"]  # the consumer id of this connection
    counters = make_pq("kq").counters()
    assert (counters["enqueued"], counters["delivered"], counters["acked"]) == (1, 1, 1)


def test_without_the_option_the_transport_writes_no_log(redis_server, redis_client, key_prefix):
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        Producer(conn.default_channel).publish(
            {"n": 1}, exchange=q.exchange, routing_key="kq", headers={"id": "t", "task": "proj.tasks.add"}
        )
        assert len(drain(conn, q, 1)) == 1
    assert not redis_client.keys(f"{key_prefix}*:ev")


def test_a_blocked_consumer_of_a_paused_queue_stays_blocked_and_wakes_on_resume(redis_server, make_pq, key_prefix):
    # Given a consumer blocked on an empty queue (a long server-side wait: no timeouts in the test)
    opts = {"key_prefix": key_prefix, "block_seconds": 60}
    url = url_of(redis_server)
    got = []
    with Connection(url, transport_options=opts) as worker, Connection(url, transport_options=opts) as pub:
        q = Queue("pz", Exchange("pz"), routing_key="pz")
        q(pub.default_channel).declare()
        consumer = Consumer(
            worker, [q], callbacks=[lambda b, m: (got.append((time.monotonic(), b)), m.ack())], prefetch_count=10
        )
        consumer.consume()
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                try:
                    worker.drain_events(timeout=0.5)
                except TimeoutError:
                    pass

        t = threading.Thread(target=loop)
        t.start()
        try:
            time.sleep(0.5)
            admin = make_pq("pz")
            # When the queue is paused and 200 messages are published
            assert admin.pause()
            channel = worker.default_channel
            before = dict(channel.waits.counters)
            p = Producer(pub.default_channel)
            for i in range(200):
                p.publish({"i": i}, exchange=q.exchange, routing_key="pz")
            time.sleep(1.0)
            # Then the consumer was not woken and did not pop (no busy loop), and got nothing
            assert dict(channel.waits.counters) == before
            assert got == []
            assert admin.size() == 200
            # When the queue is resumed, the blocked consumer wakes at once and drains it
            resumed = time.monotonic()
            assert admin.resume()
            wait_for(lambda: len(got) >= 200, 10, "the 200 after the resume", interval=0.01)
        finally:
            stop.set()
            t.join()
            consumer.cancel()
    assert [b["i"] for _, b in got] == list(range(200))
    assert got[0][0] - resumed < 2.0  # woken by the resume, not by the 60 s wait running out
    assert channel.waits.counters["wakeups"] >= before["wakeups"] + 1


def test_paused_tenant_through_kombu(redis_server, make_pq, key_prefix):
    opts = {"key_prefix": key_prefix, "fair_key": "tenant"}
    with Connection(url_of(redis_server), transport_options=opts) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        admin = make_pq("kq", fair=True)
        admin.pause(tenant="A")
        p = Producer(conn.default_channel)
        for t in ["A", "B", "A", "B"]:
            p.publish({"t": t}, exchange=q.exchange, routing_key="kq", headers={"tenant": t})
        got = [b["t"] for b, _ in drain(conn, q, 4, timeout=1.5)]
        assert got == ["B", "B"]
        admin.resume(tenant="A")
        got = [b["t"] for b, _ in drain(conn, q, 2, timeout=5)]
        assert got == ["A", "A"]
    assert tenant_deliveries(make_pq("kq", fair=True)) == {"A": 2, "B": 2}
