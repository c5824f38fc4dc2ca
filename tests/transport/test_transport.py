"""kombu-level tests of the transport against a real redis-server (no Celery worker)."""

import os
import threading
import time

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

import celery_pq
import celery_pq.transport.channel
from celery_pq import ConfigError, QueueFull
from celery_pq.storage import constants as C
from tests.support.tenants import tenant_counts

try:
    from support.consume import drain, make_queue, publish_numbers
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue, publish_numbers


@pytest.fixture
def opts(key_prefix):
    return {"key_prefix": key_prefix}


def test_pq_scheme_is_registered_on_import():
    from kombu.transport import TRANSPORT_ALIASES

    assert TRANSPORT_ALIASES["pq"] == "celery_pq.transport:Transport"
    assert TRANSPORT_ALIASES["pqs"] == "celery_pq.transport:TLSTransport"
    assert celery_pq.__version__


def test_redis_url_with_transport_class(redis_server, opts):
    conn = Connection(
        f"redis://127.0.0.1:{redis_server.port}/0", transport="celery_pq.transport:Transport", transport_options=opts
    )
    with conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        [(body, _)] = drain(conn, q, 1)
        assert body == {"n": 1}
        assert type(conn.transport).__module__ == "celery_pq.transport.channel"


@pytest.mark.parametrize(
    "order,expected", [("higher_first", [255, 200, 7, 7, 0]), ("lower_first", [0, 7, 7, 200, 255])]
)
def test_priority_order(url, opts, order, expected):
    opts["priority_order"] = order
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        for i, pr in enumerate([7, 0, 255, 7, 200]):
            p.publish({"p": pr, "i": i}, exchange=q.exchange, routing_key="kq", declare=[q], priority=pr)
        got = [b for b, _ in drain(conn, q, 5)]
        assert [b["p"] for b in got] == expected
        sevens = [b["i"] for b in got if b["p"] == 7]
        assert sevens == [0, 3]  # FIFO within a priority


def test_default_priority_applies_only_without_priority(url, opts, make_pq):
    opts["default_priority"] = 100
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        # kombu's Producer.publish (and Celery) pass priority=0 when none was given
        p.publish({"i": 0}, exchange=q.exchange, routing_key="kq", declare=[q])
        p.publish({"i": 1}, exchange=q.exchange, routing_key="kq", priority=None)
        p.publish({"i": 2}, exchange=q.exchange, routing_key="kq", priority=1)
        entries = make_pq("kq").peek(5)
        assert [e.priority for e in entries] == [100, 100, 1]


def test_celery_task_without_priority_gets_default_priority(url, opts, make_pq):
    from celery import Celery

    opts["default_priority"] = 42
    app = Celery("t", broker=url)
    app.conf.broker_transport_options = opts
    app.conf.task_default_queue = "dp"

    @app.task(name="some.task", shared=False)
    def task():
        pass

    task.apply_async()
    task.apply_async(priority=7)
    entries = make_pq("dp").peek(5)
    assert [e.priority for e in entries] == [42, 7]


@pytest.mark.parametrize("bad", [256, -1, 2.5, "high", 0.0, True])
def test_bad_priority_raises_value_error_and_writes_nothing(url, opts, make_pq, bad):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        q(conn.default_channel).declare()
        with pytest.raises(ValueError) as err:
            p.publish({"x": 1}, exchange=q.exchange, routing_key="kq", priority=bad)
        assert repr(bad) in str(err.value) or str(bad) in str(err.value)
        assert make_pq("kq").size() == 0


@pytest.mark.parametrize(
    "options,match",
    [
        ({"priority_order": "sideways"}, "priority_order"),
        ({"default_priority": 300}, "default_priority"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"visibility_timeout": "long"}, "lease_seconds"),
        ({"max_deliveries": -1}, "max_deliveries"),
        ({"max_length": 0}, "max_length"),
        ({"technique": "X"}, "technique"),
        ({"fair_key": "nosuchmodule:fn"}, "fair_key"),
        ({"fair_weights": {"a": 2}}, "fair_key"),
        ({"fair_key": "t", "tenant_concurrency": 0}, "tenant_concurrency"),
        ({"fair_key": "t", "fair_scope": "sideways"}, "fair_scope"),
        ({"spin_wait_us": -1}, "spin_wait_us"),
        ({"spin_wait_us": 100_001}, "spin_wait_us"),
        ({"spin_wait_us": "fast"}, "spin_wait_us"),
    ],
)
def test_bad_options_are_named(url, opts, options, match):
    opts.update(options)
    with Connection(url, transport_options=opts) as conn:
        with pytest.raises(ConfigError, match=match):
            conn.default_channel


@pytest.mark.parametrize("given,ns", [(None, C.SPIN_WAIT_US * 1000), (0, 0), (250, 250_000)])
def test_spin_wait_us_is_how_long_the_connections_calls_poll_for_their_reply(url, opts, given, ns):
    from celery_pq.scripts import wire

    if given is not None:
        opts["spin_wait_us"] = given
    with Connection(url, transport_options=opts) as conn:
        pool = conn.default_channel.client.connection_pool
        assert wire._spin[pool] == ns


def test_visibility_timeout_is_an_alias(url, opts):
    opts["visibility_timeout"] = 12
    with Connection(url, transport_options=opts) as conn:
        assert conn.default_channel.options.lease_seconds == 12.0


def test_max_length_raises_queue_full(url, opts):
    opts["max_length"] = 2
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        for i in range(2):
            p.publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q])
        with pytest.raises(QueueFull) as err:
            p.publish({"i": 2}, exchange=q.exchange, routing_key="kq")
        assert err.value.queue == "kq" and err.value.size == 2


def test_headers_come_back_as_published_and_a_redelivery_adds_only_x_delivery_count(url, opts):
    # Given a message published with headers of every kind, Celery's eta among them
    published = {"eta": "2020-01-01T00:00:00+00:00", "tenant": "acme", "n": 7, "nested": {"a": [1, None, True]}}
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish(
            {"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q], headers=dict(published)
        )
        # When it is delivered, given back (requeued), and delivered again
        [(_, first)] = drain(conn, q, 1, ack=False)
        first_headers, first_info = dict(first.headers), dict(first.delivery_info)
        first.reject(requeue=True)
        [(_, second)] = drain(conn, q, 1, ack=False)
        second.ack()
    # Then the first delivery's headers are exactly the published ones; the count is in delivery_info
    assert first_headers == published
    assert (first_info["delivery_count"], first_info["redelivered"]) == (1, False)
    # and the redelivery adds x-delivery-count (the deliveries before it), as RabbitMQ's quorum queues do
    assert second.headers == {**published, "x-delivery-count": 1}
    assert (second.delivery_info["delivery_count"], second.delivery_info["redelivered"]) == (2, True)


def test_reject_requeue_and_dead_letter(url, opts, make_pq):
    opts["max_deliveries"] = 3
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        counts = []
        for _ in range(3):
            [(body, msg)] = drain(conn, q, 1, ack=False)
            counts.append(msg.delivery_info["delivery_count"])
            msg.reject(requeue=True)
        assert counts == [1, 2, 3]
        # the third reject used up max_deliveries: the message is in kq.dead, not lost
        pq = make_pq("kq")
        assert pq.size() == 0
        [dead] = pq.dead.peek()
        assert dead.dead_reason == "max_deliveries"
        # the dead-letter queue is an ordinary queue that can be consumed
        dq = Queue("kq.dead", Exchange("kq.dead"), routing_key="kq.dead")
        [(body, _)] = drain(conn, dq, 1)
        assert body == {"n": 1}


def test_reject_without_requeue_goes_to_dead_letter(url, opts, make_pq):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        [(_, msg)] = drain(conn, q, 1, ack=False)
        msg.reject(requeue=False)
        [dead] = make_pq("kq").dead.peek()
        assert dead.dead_reason == "rejected"


def test_malformed_entry_goes_to_dead_letter_and_others_flow(url, opts, make_pq):
    pq = make_pq("kq")
    pq.insert(b"this is not json", 200, id="garbage")
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"ok": True}, exchange=q.exchange, routing_key="kq", declare=[q])
        [(body, _)] = drain(conn, q, 1)
        assert body == {"ok": True}
    [dead] = pq.dead.peek()
    assert dead.id == "garbage" and dead.dead_reason == "malformed" and dead.payload == b"this is not json"


def test_unacked_messages_are_given_back_on_close_without_counting(url, opts, make_pq):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        drain(conn, q, 1, ack=False)
        assert make_pq("kq").stats()["leased"] == 1
    pq = make_pq("kq")
    assert pq.size() == 1 and pq.stats()["leased"] == 0
    assert pq.pop()[0].deliveries == 1


def test_leases_are_renewed_while_the_consumer_lives(url, opts, make_pq):
    opts.update(lease_seconds=0.75, sweep_interval=0.1)
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        [(_, msg)] = drain(conn, q, 1, ack=False)
        time.sleep(2.5)  # more than three lease lengths without an ack
        pq = make_pq("kq")
        assert pq.stats()["leased"] == 1 and pq.size() == 0
        msg.ack()
        assert pq.stats()["leased"] == 0


def test_expired_lease_of_a_vanished_consumer_comes_back(url, opts, make_pq):
    # Given a message leased by a consumer that disappears without acking (no renewals)
    opts.update(sweep_interval=0.1)
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
    pq = make_pq("kq")
    pq.pop(lease_seconds=0.3)
    # When another consumer is running
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        start = time.monotonic()
        conn.default_channel.basic_consume("kq", no_ack=False, callback=lambda m: None, consumer_tag="c")
        got = []
        conn.default_channel.connection._callbacks["kq"] = lambda raw: got.append(raw)
        while not got and time.monotonic() - start < 5:
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
        # Then the sweeper returned it and it was delivered again, counted as a redelivery
        assert got and got[0]["properties"]["delivery_info"]["delivery_count"] == 2


def test_idle_consumer_wakes_promptly(url, opts):
    latencies = []
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        q(conn.default_channel).declare()

        def producer():
            with Connection(url, transport_options=opts) as c2:
                p = Producer(c2.default_channel)
                for _ in range(20):
                    time.sleep(0.02)
                    p.publish({"t": time.perf_counter()}, exchange=q.exchange, routing_key="kq", declare=[q])

        t = threading.Thread(target=producer)
        t.start()
        for body, _ in drain(conn, q, 20, timeout=10):
            latencies.append(time.perf_counter() - body["t"])
        t.join()
    # every message arrived (no message waits for a poll interval; timing is the benchmark's job)
    assert len(latencies) == 20


def test_fanout_reaches_every_bound_consumer(url, opts):
    ex = Exchange("bcast", type="fanout")
    with Connection(url, transport_options=opts) as c1, Connection(url, transport_options=opts) as c2:
        q1, q2 = Queue("fan1", ex), Queue("fan2", ex)
        got1, got2 = [], []
        cons1 = Consumer(c1, [q1], callbacks=[lambda b, m: (got1.append(b), m.ack())], no_ack=True)
        cons2 = Consumer(c2, [q2], callbacks=[lambda b, m: (got2.append(b), m.ack())], no_ack=True)
        with cons1, cons2:
            for c in (c1, c2):  # subscribe
                try:
                    c.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
            with Connection(url, transport_options=opts) as c3:
                Producer(c3.default_channel).publish({"hello": 1}, exchange=ex, declare=[ex])
            for c, got in ((c1, got1), (c2, got2)):
                deadline = time.monotonic() + 3
                while not got and time.monotonic() < deadline:
                    try:
                        c.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
        assert got1 == [{"hello": 1}] and got2 == [{"hello": 1}]


def test_topic_routing_through_shared_bindings(url, opts):
    ex = Exchange("topics", type="topic")
    with Connection(url, transport_options=opts) as consumer_conn:
        qa = Queue("ta", ex, routing_key="a.*")
        qa(consumer_conn.default_channel).declare()
        # a publisher in another connection (another process in real life) sees the binding
        with Connection(url, transport_options=opts) as pub:
            p = Producer(pub.default_channel)
            p.publish({"k": "a.x"}, exchange=ex, routing_key="a.x", declare=[ex])
            p.publish({"k": "b.x"}, exchange=ex, routing_key="b.x")
        got = drain(consumer_conn, qa, 1)
        assert [b for b, _ in got] == [{"k": "a.x"}]


def test_queue_purge_and_size(url, opts):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue()
        bound = q(conn.default_channel)
        bound.declare()
        p = Producer(conn.default_channel)
        for i in range(5):
            p.publish({"i": i}, exchange=q.exchange, routing_key="kq")
        assert bound.queue_declare(passive=True).message_count == 5
        assert bound.purge() == 5
        assert bound.queue_declare(passive=True).message_count == 0


def test_celery_remove_by_task_id(url, opts, make_pq):
    from celery import Celery

    app = Celery("t", broker=url)
    app.conf.broker_transport_options = opts
    app.conf.task_default_queue = "rm"
    app.conf.task_default_priority = None
    sig = app.signature("some.task", args=(1,))
    r1 = sig.apply_async(priority=3)
    sig.apply_async(priority=3)
    app.send_task("some.task", task_id=r1.id)  # a second message with the same task id
    assert celery_pq.remove(app, "rm", r1.id) == 2
    left = make_pq("rm").peek(10)
    assert len(left) == 1 and left[0].id != r1.id
    assert celery_pq.remove(app, "rm", "no-such-id") == 0


def test_password_and_db_number_from_the_url(key_prefix):
    from celery_pq.testing import RedisServer

    with RedisServer(config={"requirepass": "s3cret"}) as server:
        url = f"pq://:s3cret@127.0.0.1:{server.port}/3"
        with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
            q = make_queue()
            Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
            assert [b for b, _ in drain(conn, q, 1)] == [{"n": 1}]
        db3 = server.client(password="s3cret", db=3)
        db0 = server.client(password="s3cret", db=0)
        assert db3.exists(f"{key_prefix}:queues") and not db0.exists(f"{key_prefix}:queues")
        with pytest.raises(Exception) as err:
            # (kombu retries a refused AUTH as a lost connection: one retry, no wait, is enough here)
            retry_once = {"max_retries": 1, "interval_start": 0, "interval_step": 0}
            with Connection(f"pq://:wrong@127.0.0.1:{server.port}/0", transport_options=retry_once) as conn:
                conn.default_channel
        assert "AUTH" in str(err.value).upper() or "password" in str(err.value).lower()


def test_tls_scheme_selects_tls_connections(redis_server):
    from celery_pq.transport.channel import TLSTransport

    conn = Connection(f"pqs://127.0.0.1:{redis_server.port}/0", ssl={"ssl_cert_reqs": "none"})
    assert isinstance(conn.transport, TLSTransport)
    import redis as redis_py

    from celery_pq.storage.connections import make_pool
    from celery_pq.transport.options import Options

    pool = make_pool(conn, Options(), conn.transport.tls)
    assert pool.connection_class is redis_py.SSLConnection and pool.connection_kwargs["ssl_cert_reqs"] == "none"


def test_bad_database_in_url_is_named(redis_server):
    with Connection(f"pq://127.0.0.1:{redis_server.port}/notanumber") as conn:
        with pytest.raises(ConfigError, match="database"):
            conn.default_channel


def test_queue_delete_drops_keys_bindings_and_registration(url, opts, redis_client, key_prefix):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("gone")
        bound = q(conn.default_channel)
        bound.declare()
        Producer(conn.default_channel).publish({"i": 1}, exchange=q.exchange, routing_key="gone")
        assert redis_client.sismember(f"{key_prefix}:queues", "gone")
        bound.delete()
        assert not redis_client.sismember(f"{key_prefix}:queues", "gone")
        assert redis_client.smembers(f"{key_prefix}:bind:gone") == set()
        assert redis_client.keys(f"{key_prefix}:{{gone}}:*") == []


def fair_opts(opts, **kw):
    return {**opts, **kw}


def test_tenant_from_a_header(url, opts, redis_client, key_prefix):
    with Connection(url, transport_options=fair_opts(opts, fair_key="tenant")) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        for t in ["A", "A", "A", "B", None]:
            p.publish({"t": t}, exchange=q.exchange, routing_key="kq", declare=[q], headers={"tenant": t} if t else {})
        got = [b["t"] for b, _ in drain(conn, q, 5)]
    # no tenant is the shared default tenant "", one more tenant in the round (ties go by name)
    assert got == [None, "A", "B", "A", "A"]


def test_tenant_from_a_function(url, opts):
    options = fair_opts(opts, fair_key="tests.support.tenants:by_body")
    with Connection(url, transport_options=options) as conn:
        q = make_queue()
        p = Producer(conn.default_channel)
        for t in ["A", "A", "B"]:
            p.publish({"tenant": t}, exchange=q.exchange, routing_key="kq", declare=[q])
        assert [b["tenant"] for b, _ in drain(conn, q, 3)] == ["A", "B", "A"]


@pytest.mark.parametrize("fn,match", [("explode", "raised RuntimeError"), ("not_a_string", "not a string")])
def test_tenant_function_errors_are_named_and_nothing_is_written(url, opts, redis_client, make_pq, fn, match):
    options = fair_opts(opts, fair_key=f"tests.support.tenants:{fn}")
    with Connection(url, transport_options=options) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        with pytest.raises(ValueError, match=match):
            Producer(conn.default_channel).publish({"x": 1}, exchange=q.exchange, routing_key="kq")
    pq = make_pq("kq")
    assert pq.size() == 0 and redis_client.exists(pq.keys.entries, pq.keys.tenant_entries) == 0


def test_celery_headers_choose_the_tenant(url, opts, make_pq):
    from celery import Celery

    app = Celery("t", broker=url)
    app.conf.broker_transport_options = fair_opts(opts, fair_key="tenant")
    app.conf.task_default_queue = "ct"
    app.send_task("x.y", headers={"tenant": "acme"})
    app.send_task("x.y")
    pq = make_pq("ct", fair=True)
    assert tenant_counts(pq) == {"acme": {"waiting": 1, "leased": 0}, "": {"waiting": 1, "leased": 0}}


def test_urgent_view_is_not_woken_by_low_priority_inserts(url, opts):
    # Acceptance 9 at the transport level: count the Redis calls the view's consumer makes
    options = fair_opts(opts, block_seconds=60)
    got = []
    with Connection(url, transport_options=options) as urgent, Connection(url, transport_options=options) as pub:
        q = Queue("default", Exchange("default"), routing_key="default")
        q(pub.default_channel).declare()
        view = Queue("default[>=200]", Exchange("default"), routing_key="default")
        consumer = Consumer(urgent, [view], callbacks=[lambda b, m: (got.append(b), m.ack())], prefetch_count=1)
        consumer.consume()
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                try:
                    urgent.drain_events(timeout=0.5)
                except TimeoutError:
                    pass

        t = threading.Thread(target=loop)
        t.start()
        time.sleep(0.5)  # the urgent consumer found nothing and blocks
        channel = urgent.default_channel
        before = dict(channel.waits.counters)
        p = Producer(pub.default_channel)
        for i in range(5000):
            p.publish({"i": i}, exchange=q.exchange, routing_key="default", priority=5)
        time.sleep(0.5)
        after_flood = dict(channel.waits.counters)
        p.publish({"urgent": True}, exchange=q.exchange, routing_key="default", priority=220)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        t.join()
        consumer.cancel()
    assert after_flood == before  # 5,000 low-priority inserts: not one wake-up, not one pop
    assert got == [{"urgent": True}]
    assert channel.waits.counters["wakeups"] == before["wakeups"] + 1


def test_a_view_is_not_a_routing_destination_and_cannot_delete_its_queue(url, opts, redis_client, make_pq, key_prefix):
    with Connection(url, transport_options=opts) as conn:
        base = Queue("default", Exchange("default"), routing_key="default")
        view = Queue("default[>=200]", Exchange("default"), routing_key="default")
        base(conn.default_channel).declare()
        view(conn.default_channel).declare()  # same exchange and routing key as the queue it views
        Producer(conn.default_channel).publish({"n": 1}, exchange=base.exchange, routing_key="default", priority=250)
        pq = make_pq("default")
        assert pq.size() == 1  # stored once
        view(conn.default_channel).delete()
        assert pq.size() == 1
        with pytest.raises(ValueError, match="view"):
            view(conn.default_channel).purge()
        assert not redis_client.sismember(f"{key_prefix}:queues", "default[>=200]")


def test_a_published_message_is_stored_without_a_delivery_tag_and_delivered_with_its_lease(url, opts):
    from celery_pq.storage.codec import decode

    with Connection(url, transport_options=opts) as conn:
        q = make_queue("notag")
        q(conn.default_channel).declare()
        Producer(conn.default_channel).publish(
            b"\x00\xffraw",
            exchange=q.exchange,
            routing_key=q.routing_key,
            content_type="application/data",
            content_encoding="binary",
        )
        pq = conn.default_channel.queue("notag")
        [entry] = pq.peek(1)
        stored = decode(entry.payload)
        assert "delivery_tag" not in stored["properties"] and stored["body"] == "AP9yYXc="  # base64 as before
        [(body, message)] = drain(conn, q, 1)
        assert body == b"\x00\xffraw" and type(message.body) is bytes
        assert message.delivery_tag and message.properties["delivery_tag"] == message.delivery_tag


def _hub_backlog(conn, name, n, hub, *, prefetch=1, held=None) -> list:
    """A queue of the numbers 0..n-1 and a consumer of it in a kombu Hub whose acks are deferred
    with call_soon, as Celery's worker defers an early ack (or, given ``held``, whose messages
    are kept there unacked, as a prefork pool holds them): the numbers it gets."""
    q = make_queue(name)
    publish_numbers(conn, q, range(n))
    got = []

    def cb(body, message):
        got.append(body["i"])
        if held is None:
            hub.call_soon(message.ack)
        else:
            held.append(message)

    Consumer(conn, [q], callbacks=[cb], prefetch_count=prefetch).consume()
    conn.transport.register_with_event_loop(conn.connection, hub)
    return got


def _tick(hub):
    for callback in list(hub.on_tick):
        callback()


@pytest.fixture
def wide_tick_budget(monkeypatch):
    """The tick's time budget is its own test (below); a test of what one tick serves widens it,
    so that a loaded machine's slow round trips do not end the tick early."""
    from celery_pq.storage import constants

    monkeypatch.setattr(constants, "TICK_DRAIN_SECONDS", 60.0)


def test_one_event_loop_tick_serves_a_backlog_and_applies_its_acks(url, opts, wide_tick_budget):
    from kombu.asynchronous import Hub

    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        got = _hub_backlog(conn, "tick", 20, hub)
        _tick(hub)  # one pass of the loop: no poll, no self-wake between the messages
        assert got == list(range(20))
        stats = conn.default_channel.queue("tick").stats()
        assert stats["waiting"] == 0 and stats["leased"] == 0  # every deferred ack went with the next pop
    hub.close()


def test_a_tick_that_fills_the_prefetch_window_still_wakes_the_loop(url, opts, wide_tick_budget):
    # Given a prefetch-2 consumer whose messages stay unacked (a prefork pool holding them),
    # when one tick delivers two and its next pass finds the window full, then the loop is
    # woken all the same: the hub's other tick callbacks (the pool schedules its writes to the
    # children in one) may have run before the deliveries, and must run again at once, not
    # after the next timer.
    from kombu.asynchronous import Hub

    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        held = []
        _hub_backlog(conn, "tickfull", 5, hub, prefetch=2, held=held)
        _tick(hub)
        assert [m.payload["i"] for m in held] == [0, 1]
        assert os.read(conn.transport.poller._wake_pipe[0], 16) == b"x"
        for m in held:
            m.ack()
    hub.close()


def test_the_tick_stops_at_its_time_budget_and_wakes_the_loop(url, opts, monkeypatch):
    from kombu.asynchronous import Hub

    from celery_pq.storage import constants

    monkeypatch.setattr(constants, "TICK_DRAIN_SECONDS", 0.0)
    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        got = _hub_backlog(conn, "tick0", 3, hub)
        _tick(hub)
        assert got == [0]  # one delivery, then the loop's turn
        assert os.read(conn.transport.poller._wake_pipe[0], 16) == b"x"  # woken to come back at once
        for item in hub._pop_ready():
            item()
        _tick(hub)
        assert got == [0, 1]
    hub.close()
