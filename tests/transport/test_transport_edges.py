"""The transport at its edges: lost replies, lost connections, refused writes, bad data and bad
options, each on a real redis-server (no Celery worker; see test_celery_e2e.py for those)."""

import logging
import random
import socket
import threading
import time

import pytest
import redis
from kombu import Connection, Consumer, Producer

from celery_pq.ops.render import describe
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.codec import encode
from celery_pq.testing import wait_for

try:
    from support.bombs import BOMB_BYTES, fields_bomb, zstd_bomb
    from support.consume import drain, make_queue, publish_numbers
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.bombs import BOMB_BYTES, fields_bomb, zstd_bomb
    from tests.support.consume import drain, make_queue, publish_numbers


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
            except Exception as exc:
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
        assert open_queue(conn.default_channel.client, "kq", QueueSettings(key_prefix="pq")).size() == 300
        assert normal_clients(fresh_redis) <= 12


def test_a_finished_threads_connection_goes_back_to_its_pool_outside_the_pool_lock(fresh_redis):
    """A finished thread's lines are handed back by a finalizer, which a garbage collection may run
    inside redis-py's pool lock (get_connection making a connection): it must not take that lock
    (before: the test run of the oldest redis-py corner hung there)."""
    from celery_pq.scripts import wire

    pool = redis.ConnectionPool(port=fresh_redis.port)
    client = redis.Redis(connection_pool=pool)
    line = wire.Line(pool)
    with pool._lock:  # (held as get_connection holds it)
        finalizer = threading.Thread(target=wire._give_back_all, args=({pool: line},), daemon=True)
        finalizer.start()
        finalizer.join(5)
        assert not finalizer.is_alive(), "the finalizer waited for the pool's lock"
    mine = wire.own_line(client)  # the next call for a line hands it back first: this one reuses it
    assert mine.conn is line.conn and mine.call("PING")
    pool.disconnect()


def test_a_dropped_connection_frees_its_pool_slot(fresh_redis):
    client = redis.Redis(connection_pool=redis.ConnectionPool(port=fresh_redis.port, max_connections=3))
    q = open_queue(client, "slots")
    try:
        for _ in range(5):  # each round the thread's own connection is killed under it
            q.insert(b"x", 1)
            with fresh_redis.client() as admin:
                admin.client_kill_filter(_type="normal", skipme=True)
        q.insert(b"x", 1)  # before: "Too many connections" once the dropped ones used the pool up
        assert q.size() == 6
    finally:
        client.connection_pool.disconnect()


# -- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,name,shown",
    [
        ({"sweep_interval": "1"}, "sweep_interval", "'1'"),
        ({"sweep_interval": 0}, "sweep_interval", "0"),
        ({"renew_interval": 60}, "renew_interval", "60"),
        ({"lease_seconds": 5, "renew_interval": 9}, "renew_interval", "9"),
        ({"block_seconds": 0}, "block_seconds", "0"),
        ({"block_seconds": None}, "block_seconds", "None"),
        ({"binding_cache_seconds": -1}, "binding_cache_seconds", "-1"),
        ({"lease_seconds": float("inf")}, "lease_seconds", "inf"),
        ({"socket_timeout": "5"}, "socket_timeout", "'5'"),
        ({"socket_connect_timeout": 0}, "socket_connect_timeout", "0"),
        ({"health_check_interval": -1}, "health_check_interval", "-1"),
        ({"socket_keepalive": "yes"}, "socket_keepalive", "'yes'"),
        ({"max_connections": 0}, "max_connections", "0"),
        ({"max_connections": "50"}, "max_connections", "'50'"),
        ({"client_name": "my worker"}, "client_name", "'my worker'"),
        ({"max_deliveries": True}, "max_deliveries", "True"),
        ({"max_length_per_tenant": 0, "fair_key": "t"}, "max_length_per_tenant", "0"),
        ({"queue_techniques": ["S"]}, "queue_techniques", "['S']"),
        ({"fair_key": "t", "fair_weights": {"a": "heavy"}}, "fair_weights", "'heavy'"),
        ({"fair_key": "t", "tenant_rate": {1: 5}}, "tenant_rate", "1"),
        ({"max_message_bytes": 0}, "max_message_bytes", "0"),
        ({"max_message_bytes": 1.5}, "max_message_bytes", "1.5"),
        ({"dedupe_seconds": -1}, "dedupe_seconds", "-1"),
        ({"dedupe_seconds": "300"}, "dedupe_seconds", "'300'"),
        ({"max_dead_length": 0}, "max_dead_length", "0"),
    ],
)
def test_each_bad_option_is_named_with_its_value_at_channel_creation(redis_server, key_prefix, options, name, shown):
    from celery_pq import ConfigError

    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix, **options}) as conn:
        with pytest.raises(ConfigError) as err:
            conn.default_channel
    assert name in str(err.value) and shown in str(err.value), str(err.value)


def test_good_options_are_accepted(redis_server, key_prefix):
    options = {
        "key_prefix": key_prefix,
        "lease_seconds": 2,
        "renew_interval": 1.5,
        "sweep_interval": 0.5,
        "block_seconds": 0.5,
        "binding_cache_seconds": 0,
        "socket_timeout": 0.5,
        "health_check_interval": 0,
        "socket_keepalive": True,
        "max_connections": 20,
        "client_name": "pq-worker",
        "max_message_bytes": 10_000,
        "dedupe_seconds": 0,
        "max_dead_length": 100,
    }
    with Connection(url_of(redis_server), transport_options=options) as conn:
        channel = conn.default_channel
        assert (channel.options.renew_interval, channel.options.block_seconds) == (1.5, 0.5)


def test_the_default_renew_interval_and_socket_timeout_fit_a_short_lease(redis_server, key_prefix):
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix, "lease_seconds": 1.5}) as conn:
        options = conn.default_channel.options
        assert (options.renew_interval, options.socket_timeout) == (0.5, 1.0)


@pytest.mark.parametrize(
    "options, shown",
    [
        ({"lease_seconds": 0.1}, "lease_seconds must be at least 0.75 s, got 0.1"),
        (
            {"lease_seconds": 2, "renew_interval": 1.8},
            "lease_seconds (2) must be at least renew_interval + 0.5 s (2.3)",
        ),
        (
            {"lease_seconds": 10, "socket_timeout": 30},
            "socket_timeout must be at most lease_seconds - renew_interval (10 - 3.33333 = 6.66667 s), got 30",
        ),
        (
            {"socket_timeout": None},
            "socket_timeout must be at most lease_seconds - renew_interval (60 - 20 = 40 s), got None (wait forever)",
        ),
    ],
)
def test_a_lease_its_renewals_cannot_hold_is_refused_with_the_least_it_takes(redis_server, key_prefix, options, shown):
    from celery_pq import ConfigError

    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix, **options}) as conn:
        with pytest.raises(ConfigError) as err:
            conn.default_channel
    assert shown in str(err.value), str(err.value)


def test_an_empty_queue_name_is_refused_at_declare_and_publish(redis_server, key_prefix, redis_client):
    from celery_pq import ConfigError

    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        channel = conn.default_channel
        with pytest.raises(ConfigError, match="queue name .*''"):
            channel._new_queue("")
        with pytest.raises(ConfigError, match="queue name .*''"):
            Producer(channel).publish({"x": 1}, routing_key="")
    assert redis_client.keys(f"{key_prefix}*") == []


def test_a_redis_user_without_the_client_command_can_consume(fresh_redis):
    # Given a Redis user that may not run CLIENT (ID, UNBLOCK)
    with fresh_redis.client() as admin:
        admin.acl_setuser(
            "worker", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-client"]
        )
    url = url_of(fresh_redis, user="worker:pw@")
    got = []
    with Connection(url) as conn, Connection(url) as pub:
        q = make_queue()
        q(pub.default_channel).declare()
        # When it consumes (blocking while the queue is empty) and a message arrives
        with Consumer(conn, [q], callbacks=[lambda b, m: (got.append(b), m.ack())]):
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=0.3)
            Producer(pub.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq")
            conn.drain_events(timeout=5)
    # Then it is delivered: the blocking read works without CLIENT ID
    assert got == [{"n": 1}]


# -- max_message_bytes -------------------------------------------------------------------------
def test_a_message_over_max_message_bytes_is_refused_and_nothing_is_written(
    redis_server, key_prefix, redis_client, make_pq
):
    from celery_pq.storage.errors import MessageTooLarge

    options = {"key_prefix": key_prefix, "max_message_bytes": 1000}
    with Connection(url_of(redis_server), transport_options=options) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        producer = Producer(conn.default_channel)
        noise = random.Random(7).randbytes(2000).hex()  # stored compressed when it pays: this does not compress
        with pytest.raises(MessageTooLarge) as err:
            producer.publish({"blob": noise}, exchange=q.exchange, routing_key="kq")
        assert err.value.limit == 1000 and err.value.size > 2000 and err.value.queue == "kq"
        assert "max_message_bytes=1000" in str(err.value)
        pq = make_pq("kq")
        assert pq.size() == 0 and not redis_client.exists(pq.keys.entries)
        producer.publish({"blob": "x" * 100}, exchange=q.exchange, routing_key="kq")
        assert pq.size() == 1


# -- publish ids -------------------------------------------------------------------------------
def test_one_publish_call_keeps_one_publish_id_across_its_attempts():
    from celery_pq.transport.messages import STAMP, PublishStamp, prepare_message
    from celery_pq.transport.options import Options

    options = Options.from_transport_options({})
    # Given one publish call: kombu hands the same properties dict to each of its attempts
    properties = {"delivery_mode": 2}
    first = prepare_message(options, "body", headers={"id": "t1", "task": "x.y"}, properties=properties)
    assert PublishStamp.take(first, "q")[1] is True  # the first attempt is a first send
    pid = properties[STAMP].publish_id
    # When the attempt fails and kombu prepares the message again from the same dict
    again = prepare_message(options, "body", headers={"id": "t1", "task": "x.y"}, properties=properties)
    # Then the retry carries the same publish id, and is not a first send (it is looked up)
    assert PublishStamp.take(again, "q") == (pid, False)
    # A second call with the same task id, headers and body is another publish
    other = prepare_message(options, "body", headers={"id": "t1", "task": "x.y"}, properties={"delivery_mode": 2})
    assert PublishStamp.take(other, "q")[0] not in (None, pid)
    # A message put again without being prepared again (a caller's second basic_publish) is
    # another publish too: the queue makes it an id of its own
    assert PublishStamp.take(again, "q") == (None, True)


def test_one_publish_call_routed_to_several_queues_keeps_one_publish_id_per_queue():
    from celery_pq.transport.messages import PublishStamp, prepare_message
    from celery_pq.transport.options import Options

    options = Options.from_transport_options({})
    properties: dict = {}
    # Given one publish call put in three queues (an exchange binding its key to each)
    first = prepare_message(options, "body", properties=properties)
    ids = {q: PublishStamp.take(first, q) for q in ("a", "b", "c")}
    # Then each queue has an id of its own, each a first send
    assert len({pid for pid, _ in ids.values()}) == 3 and all(first for _, first in ids.values())
    # When kombu retries the call, putting the queues in another order
    again = prepare_message(options, "body", properties=properties)
    # Then each queue gets its own id again, looked up
    assert {q: PublishStamp.take(again, q) for q in ("c", "a", "b")} == {q: (pid, False) for q, (pid, _) in ids.items()}
    # A queue this call had not reached before is a first send
    pid, first_send = PublishStamp.take(again, "d")
    assert first_send and pid not in {pid for pid, _ in ids.values()}


def test_the_publish_stamp_is_never_stored():
    from celery_pq.storage.codec import decode
    from celery_pq.transport.messages import STAMP, prepare_message, stored_item
    from celery_pq.transport.options import Options

    options = Options.from_transport_options({})
    message = prepare_message(options, "e30=", headers={}, properties={})
    assert STAMP in message["properties"]
    item = stored_item("q", message, options, lambda body, enc=None: body)
    assert STAMP not in decode(item.payload)["properties"]
    assert STAMP in message["properties"]  # (still the caller's, for a retry of the call)


def test_the_same_task_id_sent_twice_on_purpose_is_stored_twice(redis_server, key_prefix, make_pq):
    from celery import Celery

    # Given a Celery app on the transport
    app = Celery("resend", broker=url_of(redis_server))
    app.conf.broker_transport_options = {"key_prefix": key_prefix}
    app.conf.task_default_queue = "rs"
    with app.connection_for_write() as conn:
        # When the same task, same id, same arguments is sent three times on purpose
        for _ in range(3):
            app.send_task("proj.report", args=[42], task_id="report-42", connection=conn)
    # Then three messages wait: a re-send is a publish of its own, never taken for a retry
    ids = sorted(e.id for e in make_pq("rs").peek(10))
    assert len(ids) == 3 and ids[0] == "report-42" and all(i.startswith("report-42~") for i in ids[1:]), ids
    app.close()


@pytest.fixture
def debug_redis():
    """A private redis-server that allows DEBUG SLEEP (a Redis busy for a while)."""
    from celery_pq.testing import RedisServer

    with RedisServer(config={"enable-debug-command": "yes"}) as server:
        yield server


def test_a_celery_publish_retried_after_a_lost_reply_is_stored_once(debug_redis):
    from celery import Celery

    fresh_redis = debug_redis
    # Given a producer whose socket times out after 0.5 s, and a Redis busy for 1.5 s
    app = Celery("dedupe", broker=url_of(fresh_redis))
    app.conf.broker_transport_options = {"socket_timeout": 0.5, "binding_cache_seconds": 60}
    app.conf.task_default_queue = "dd"
    with app.connection_for_write() as conn:
        app.send_task("x.y", task_id="t0", connection=conn)  # declared, bindings cached: a publish is one insert
        with fresh_redis.client() as admin:
            busy = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "1.5"))
            busy.start()
            time.sleep(0.1)
            # When a task is published: its insert times out, and the publish is retried
            app.send_task(
                "x.y",
                task_id="t1",
                connection=conn,
                retry_policy={"max_retries": 10, "interval_start": 0.2, "interval_step": 0.2},
            )
            busy.join()
    # Then the queue holds the task once
    with fresh_redis.client() as r:
        assert sorted(e.id for e in open_queue(r, "dd").peek(10)) == ["t0", "t1"]
    app.close()


class ReplyLosingProxy:
    """A TCP proxy to Redis on loopback that forwards both ways until ``lose_replies(n, k)``:
    then the ``n``-th request after it and the ``k - 1`` requests that follow it reach Redis
    (the commands run) and the connections they came on hear nothing more (the client's socket
    timeout ends its wait: a lost reply)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._countdown = 0
        self._losing = 0
        self._socks: list[socket.socket] = []
        #: Replies lost so far.
        self.lost = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_replies(self, n: int, k: int = 1) -> None:
        with self._lock:
            self._countdown, self._losing = n, k

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._socks += [client, upstream]
            deaf = threading.Event()
            threading.Thread(target=self._pump, args=(client, upstream, deaf, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, deaf, False), daemon=True).start()

    def _pump(self, src, dst, deaf, requests):
        try:
            while data := src.recv(65536):
                if requests:
                    with self._lock:
                        if self._countdown > 1:
                            self._countdown -= 1
                        elif self._losing:
                            self._losing -= 1
                            self.lost += 1
                            deaf.set()
                elif deaf.is_set():
                    continue  # the reply is dropped
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        for sock in (self._listener, *self._socks):
            sock.close()


@pytest.mark.parametrize(
    "kind,bindings,key",
    [
        ("direct", ["k", "k", "k"], "k"),  # one routing key bound to three queues
        ("topic", ["k.#", "*.x", "k.x"], "k.x"),  # three patterns that match one key
    ],
)
def test_a_publish_to_several_queues_retried_after_a_lost_reply_is_stored_once_in_each(
    redis_server, key_prefix, make_pq, kind, bindings, key
):
    from kombu import Exchange, Queue

    # Given an exchange that routes one key to three queues, reached through a proxy
    proxy = ReplyLosingProxy(redis_server.port)
    exchange = Exchange(f"multi-{kind}", type=kind)
    queues = [Queue(f"m{i}", exchange, routing_key=b) for i, b in enumerate(bindings)]
    options = {"key_prefix": key_prefix, "socket_timeout": 0.5, "binding_cache_seconds": 60}
    try:
        with Connection(f"pq://127.0.0.1:{proxy.port}/0", transport_options=options) as conn:
            # (the producer's exchange: kombu declares it again on the connection a retry makes)
            producer = Producer(conn.default_channel, exchange=exchange)
            for q in queues:
                q(conn.default_channel).declare()
            producer.publish({"n": 0}, routing_key=key)  # bindings cached: a publish is its inserts
            # When the second queue's insert runs, its reply and its resend's are lost, and kombu retries
            proxy.lose_replies(2, 2)
            producer.publish(
                {"n": 1},
                routing_key=key,
                retry=True,
                retry_policy={"max_retries": 5, "interval_start": 0.1, "interval_step": 0.1},
            )
    finally:
        proxy.close()
    # Then two replies were lost, and each queue holds the message once
    assert proxy.lost == 2
    for q in queues:
        entries = make_pq(q.name).peek(10)
        assert sorted(describe(e.payload)["args"] for e in entries) == ['{"n": 0}', '{"n": 1}'], q.name


def test_a_broadcast_retried_after_a_lost_reply_reaches_each_receiver_once(redis_server, key_prefix):
    from kombu import Exchange, Queue

    # Given a receiver of a fanout exchange, and a producer that reaches Redis through a proxy
    exchange = Exchange("bcast", type="fanout")
    proxy = ReplyLosingProxy(redis_server.port)
    got = []
    try:
        with (
            Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as rconn,
            Connection(
                f"pq://127.0.0.1:{proxy.port}/0", transport_options={"key_prefix": key_prefix, "socket_timeout": 0.5}
            ) as pconn,
        ):
            queue = Queue("bcast-receiver", exchange, exclusive=True, auto_delete=True)
            with Consumer(rconn, [queue], callbacks=[lambda body, m: got.append(body["n"])], no_ack=True):
                drain_for(rconn, 0.3)  # (subscribed: pub/sub keeps nothing for a late receiver)
                producer = Producer(pconn.default_channel, exchange=exchange)
                producer.publish({"n": 0})
                # When the next broadcast's reply is lost and kombu sends it again
                proxy.lose_replies(1, 1)
                producer.publish(
                    {"n": 1}, retry=True, retry_policy={"max_retries": 5, "interval_start": 0.1, "interval_step": 0.1}
                )
                producer.publish({"n": 2})
                drain_for(rconn, 1.5)
    finally:
        proxy.close()
    # Then one reply was lost, and the receiver got each broadcast once
    assert proxy.lost == 1
    assert got == [0, 1, 2]


def drain_for(conn, seconds: float) -> None:
    """Deliver what comes to ``conn`` for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn.drain_events(timeout=0.1)
        except TimeoutError:
            pass


# -- a popped batch ----------------------------------------------------------------------------
def consume_batch(conn, q, n, on_message=None):
    """Consume with a prefetch window of 10 (one pop leases the whole batch), acking each."""
    return [body for body, _ in drain(conn, q, n, prefetch=10, on_message=on_message)]


@pytest.mark.parametrize(
    "garbage",
    [
        {"properties": 7},  # stored, but its properties are not a mapping
        {"body": "not base64!", "properties": {"body_encoding": "base64"}, "headers": {}},  # kombu cannot decode it
        {"properties": {"delivery_info": []}, "headers": {}},
    ],
)
def test_a_batch_with_an_unreadable_message_in_the_middle_strands_nothing(redis_server, key_prefix, make_pq, garbage):
    # Given five messages at one priority, the third of them not a kombu message
    pq = make_pq("kq")
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        publish_numbers(conn, q, range(2))
        pq.insert(encode(garbage), 0, id="garbage")
        publish_numbers(conn, q, range(2, 4))
        # When one pop takes all five
        got = consume_batch(conn, q, 4)
        # Then the four good ones are delivered, the bad one is dead-lettered, none stays leased
        assert [b["i"] for b in got] == [0, 1, 2, 3]
        conn.default_channel.leases.flush()  # the acks that wait for the next round trip
        assert conn.default_channel.leases.held() == {}
        assert pq.stats()["leased"] == 0 and pq.size() == 0
    [dead] = pq.dead.peek()
    assert (dead.id, dead.dead_reason, dead.payload) == ("garbage", "malformed", encode(garbage))


def test_a_decompression_bomb_is_dead_lettered_with_its_reason_and_bounded_memory(
    redis_server, key_prefix, make_pq, caplog
):
    import tracemalloc

    # Given a 9.6 KB entry whose zstd frame declares 300 MB, and one of 70,000 fields, among good ones
    pq = make_pq("kq")
    bomb, fields = zstd_bomb(), fields_bomb(70_000)
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        publish_numbers(conn, q, range(1))
        pq.insert(bomb, 0, id="bomb")
        pq.insert(fields, 0, id="fields")
        publish_numbers(conn, q, range(1, 2))
        # When one pop takes all four (the Python allocations of the consumer traced meanwhile)
        tracemalloc.start()
        try:
            with caplog.at_level(logging.ERROR, logger="celery_pq"):
                got = consume_batch(conn, q, 2)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        conn.default_channel.leases.flush()
    # Then the good ones are delivered, both bad ones are dead-lettered as malformed, unchanged,
    # with the reason in the log; reading them allocated a few MB, not 300
    assert [b["i"] for b in got] == [0, 1]
    assert sorted((d.id, d.dead_reason, d.payload) for d in pq.dead.peek(5)) == [
        ("bomb", "malformed", bomb),
        ("fields", "malformed", fields),
    ]
    assert pq.stats()["leased"] == 0 and pq.size() == 0
    assert peak < 8 << 20, peak
    assert f"declares {BOMB_BYTES} bytes" in caplog.text and "more than 65536 fields" in caplog.text


def test_a_callback_that_raises_gives_back_the_rest_of_its_batch(redis_server, key_prefix, make_pq):
    pq = make_pq("kq")
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        publish_numbers(conn, q, range(5))

        def explode(body):
            if body["i"] == 1:
                raise RuntimeError("callback failed")

        with pytest.raises(RuntimeError):
            consume_batch(conn, q, 5, on_message=explode)
        # the failed one stays with the consumer (unacked); the three behind it wait again, uncounted
        wait_for(lambda: pq.stats()["leased"] <= 1, 3, "the first one's ack")
        assert pq.stats()["leased"] == 1 and pq.size() == 3
        assert [e.deliveries for e in pq.peek(3)] == [0, 0, 0]


# -- deferred acks -----------------------------------------------------------------------------
def redis_server_class():
    from celery_pq.testing import RedisServer

    return RedisServer


#: Options that keep the lease keeper quiet for the few seconds of a test (it looks every 5 s).
QUIET_KEEPER = {"lease_seconds": 60, "sweep_interval": 20}


def test_a_deferred_ack_whose_round_trip_fails_is_sent_again(key_prefix):
    # Given a Redis that keeps its data across a restart, and a consumer whose ack of the first
    # message waits for its next pop
    with redis_server_class()(config={"appendonly": "yes", "appendfsync": "always"}) as server:
        got = []
        with Connection(url_of(server), transport_options=QUIET_KEEPER) as conn:
            q = make_queue()
            producer = Producer(conn.default_channel)
            q(conn.default_channel).declare()
            for i in range(2):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="kq")
            with Consumer(conn, [q], callbacks=[lambda b, m: (got.append(b), m.ack())], prefetch_count=1):
                conn.drain_events(timeout=5)
                # When Redis goes away under the pop that carries the ack
                server.stop()
                with pytest.raises(conn.connection_errors):
                    conn.drain_events(timeout=1)
                server.start()
                # Then the ack goes with the next pop, once Redis is back
                conn.drain_events(timeout=5)
                conn.default_channel.leases.flush()
            with server.client() as r:
                pq = open_queue(r, "kq")
                assert got == [{"i": 0}, {"i": 1}]
                assert pq.stats()["leased"] == 0 and pq.size() == 0


def test_an_ack_sent_again_after_a_lost_reply_is_not_reported_as_late(debug_redis, caplog):
    # Given a consumer whose socket times out after 0.5 s, with an ack waiting to be sent
    options = {**QUIET_KEEPER, "socket_timeout": 0.5}
    with Connection(url_of(debug_redis), transport_options=options) as conn:
        q = make_queue()
        for i in range(2):
            Producer(conn.default_channel).publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q])
        channel = conn.default_channel
        with Consumer(conn, [q], callbacks=[lambda b, m: m.ack()], prefetch_count=1):
            conn.drain_events(timeout=5)
            channel.leases.flush()  # (Redis has the ack script from now on)
            conn.drain_events(timeout=5)
            assert channel.leases.held()  # the ack waits
            # When the round trip that carries it times out while Redis is busy (it runs later)
            with debug_redis.client() as admin:
                busy = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "1.5"))
                busy.start()
                time.sleep(0.1)
                with pytest.raises(conn.connection_errors):
                    channel.leases.flush()
                busy.join()
            assert channel.leases.held()  # kept, not dropped
            # Then sending it again finds it done, and says so only at debug level
            with caplog.at_level(logging.DEBUG, logger="celery_pq.transport.leasebook"):
                channel.leases.flush()
        assert channel.leases.held() == {}
        with debug_redis.client() as r:
            assert open_queue(r, "kq").stats()["leased"] == 0
    late = [r for r in caplog.records if r.name == "celery_pq.transport.leasebook" and r.levelno >= logging.WARNING]
    assert late == []
    assert any("already done" in r.getMessage() for r in caplog.records)


# -- renewals when Redis refuses writes --------------------------------------------------------
def _refuse_writes(admin, how):
    if how == "OOM":
        admin.config_set("maxmemory", 1)  # over it at once; the default policy is noeviction
    else:
        from celery_pq.testing import free_port

        admin.replicaof("127.0.0.1", free_port())  # a replica of nobody: read-only, data kept


def _accept_writes(admin, how):
    if how == "OOM":
        admin.config_set("maxmemory", 0)
    else:
        admin.replicaof("NO", "ONE")


@pytest.mark.parametrize("how", ["READONLY"])
def test_a_redis_that_refuses_writes_is_reported_and_renewals_retry_promptly(fresh_redis, caplog, how):
    # Given a consumer holding a lease, renewed every 3 s
    options = {"lease_seconds": 6, "renew_interval": 3, "sweep_interval": 20}
    with Connection(url_of(fresh_redis), transport_options=options) as conn, fresh_redis.client() as admin:
        q = make_queue()
        Producer(conn.default_channel).publish({"n": 1}, exchange=q.exchange, routing_key="kq", declare=[q])
        with Consumer(conn, [q], callbacks=[lambda b, m: None], prefetch_count=1):
            conn.drain_events(timeout=5)
            keeper = conn.transport._keeper
            # When Redis refuses writes at the next renewal
            with caplog.at_level(logging.WARNING):
                _refuse_writes(admin, how)
                deadline = time.monotonic() + 5
                while not [r for r in caplog.records if r.levelno >= logging.ERROR] and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.35)  # the renewal is tried again, and fails again
                renewals = keeper.renewals
                _accept_writes(admin, how)
                # Then one error names the cause (not one per failed try)
                errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                assert len(errors) == 1 and how in errors[0] and "refuses writes" in errors[0], errors
                # and, once Redis takes writes again, the lease is renewed within a second
                wait_for(lambda: keeper.renewals > renewals, 1.0, "a renewal once Redis takes writes", interval=0.01)
            assert open_queue(admin, "kq").leases(id="1")[0]["seconds_left"] > 5


def test_a_full_redis_refuses_a_publish_whole_and_keeps_renewing_acking_and_delivering(fresh_redis, caplog):
    # Given a consumer holding a lease renewed every second, and a second message waiting
    options = {"lease_seconds": 3, "renew_interval": 1, "sweep_interval": 20}
    with Connection(url_of(fresh_redis), transport_options=options) as conn, fresh_redis.client() as admin:
        q = make_queue()
        producer = Producer(conn.default_channel)
        for n in (1, 2):
            producer.publish({"n": n}, exchange=q.exchange, routing_key="kq", declare=[q])
        got = []
        with Consumer(conn, [q], callbacks=[lambda b, m: got.append(m)], prefetch_count=1):
            conn.drain_events(timeout=5)
            keeper = conn.transport._keeper
            pq = open_queue(admin, "kq")
            # When Redis is full (maxmemory reached, noeviction)
            with caplog.at_level(logging.WARNING):
                admin.config_set("maxmemory", 1)
                try:
                    # Then a publish is refused whole, with Redis's OOM error, and stores nothing
                    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
                        producer.publish({"n": 3}, exchange=q.exchange, routing_key="kq")
                    assert pq.stats()["waiting"] == 1
                    # and the lease is still renewed, past its first deadline
                    renewals = keeper.renewals
                    time.sleep(3.5)
                    assert keeper.renewals > renewals
                    sec, usec = admin.time()
                    assert admin.zscore(pq.keys.lease_deadlines, "1") > sec * 1000 + usec // 1000  # deadline ahead
                    # and the ack is applied and the next message delivered (that frees memory)
                    got[0].ack()
                    conn.drain_events(timeout=5)
                    assert [m.payload for m in got] == [{"n": 1}, {"n": 2}]
                    got[1].ack()
                    conn.default_channel.leases.flush()
                    assert pq.stats()["leased"] == 0 and pq.size() == 0
                finally:
                    admin.config_set("maxmemory", 0)
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_misconf_and_other_refusals_are_recognised():
    from redis import exceptions as rex

    from celery_pq.transport.leases import write_refusal

    assert "MISCONF" in write_refusal(rex.ResponseError("MISCONF Redis is configured to save RDB snapshots"))
    assert "NOREPLICAS" in write_refusal(rex.ResponseError("NOREPLICAS Not enough good replicas to write."))
    assert write_refusal(rex.ResponseError("ERR wrong number of arguments")) is None
    assert write_refusal(rex.ConnectionError("gone")) is None


def test_no_ack_deliveries_hold_no_lease(redis_server, key_prefix, make_pq):
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        producer = Producer(conn.default_channel)
        for i in range(2):
            producer.publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q])
        got = []
        with Consumer(conn, [q], callbacks=[lambda b, m: got.append(b)], no_ack=True):
            while len(got) < 2:
                conn.drain_events(timeout=5)
        producer.publish({"i": 2}, exchange=q.exchange, routing_key="kq")
        assert conn.default_channel.basic_get("kq", no_ack=True) is not None
        conn.default_channel.leases.flush()
        assert got == [{"i": 0}, {"i": 1}] and conn.default_channel.leases.held() == {}
        pq = make_pq("kq")
        assert pq.stats()["leased"] == 0 and pq.size() == 0


# -- values without a stored form ------------------------------------------------------------
class _Unwritable:
    """An object neither the codec nor kombu's JSON writes (as Celery's Signal)."""


def test_a_property_without_a_stored_form_is_left_out_with_a_warning(redis_server, key_prefix, redis_client, caplog):
    # Given a producer that passes an object as a message property (a before_task_publish handler
    # re-publishing with **kwargs hands over the signal itself)
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        with caplog.at_level("WARNING", logger="celery_pq.transport.messages"):
            Producer(conn.default_channel).publish(
                {"n": 1}, exchange=q.exchange, routing_key="kq", signal=_Unwritable(), keep="me"
            )
        # Then the message is stored without that property (as an AMQP broker keeps only the
        # properties it knows), the warning names it, and the others are kept
        assert "'signal'" in caplog.text and "_Unwritable" in caplog.text
        [got] = list(drain(conn, q, 1))
        body, message = got
        assert body == {"n": 1} and "signal" not in message.properties and message.properties["keep"] == "me"


def test_a_header_without_a_stored_form_is_refused_by_name(redis_server, key_prefix, make_pq):
    with Connection(url_of(redis_server), transport_options={"key_prefix": key_prefix}) as conn:
        q = make_queue()
        q(conn.default_channel).declare()
        with pytest.raises(ValueError, match="header 'bad' holds a _Unwritable"):
            Producer(conn.default_channel).publish(
                {"n": 1}, exchange=q.exchange, routing_key="kq", headers={"bad": _Unwritable()}
            )
        assert make_pq("kq").size() == 0
