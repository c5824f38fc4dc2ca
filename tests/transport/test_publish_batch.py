"""kombu's ``Producer.batch()`` on celery-pq (celery_pq/transport/batches.py), against a real redis-server:
no round trip per message (sub-chunks of C.BATCH_SEND written as the batch fills, every reply
read at the flush), the same preparation and errors as a single publish, and a flush sent again
that stores each message once."""

import os
import time

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

import celery_pq  # noqa: F401  (registers pq://)
from celery_pq import MessageTooLarge, QueueFull
from celery_pq.ops.render import describe
from celery_pq.queue import inserts
from celery_pq.scripts.wire import CallStream
from celery_pq.storage import constants as C
from celery_pq.transport import batches
from tests.support import needs_producer_batch

pytestmark = needs_producer_batch

try:
    from support.consume import drain
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain


@pytest.fixture
def round_trips(monkeypatch):
    """The insert round trips of this process: one list of script calls per round trip."""
    seen: list[int] = []
    real = inserts.run_waiting

    def spy(client, calls, queues):
        seen.append(len(calls))
        return real(client, calls, queues)

    monkeypatch.setattr(inserts, "run_waiting", spy)
    return seen


class Wire:
    """What the inserts of this process put on the wire: ``round_trips`` (one list of script
    calls each, the round-trip path), ``sends`` (insert calls written to a batch's stream,
    their replies not read) and ``reads`` (replies read from it); ``log`` in order."""

    def __init__(self):
        self.round_trips: list[int] = []
        self.log: list[str] = []

    @property
    def sends(self):
        return self.log.count("send")

    @property
    def reads(self):
        return self.log.count("read")


@pytest.fixture
def wire(monkeypatch, round_trips):
    seen = Wire()
    seen.round_trips = round_trips
    send, read = CallStream.send, CallStream.read

    def spy_send(self, *call):
        seen.log.append("send")
        return send(self, *call)

    def spy_read(self):
        seen.log.append("read")
        return read(self)

    monkeypatch.setattr(CallStream, "send", spy_send)
    monkeypatch.setattr(CallStream, "read", spy_read)
    return seen


def _lose_stream_replies(monkeypatch, after: int):
    """Every reply read from a batch's stream after the first ``after`` is lost: read (the call
    ran in Redis) and then a connection error, as when the connection is cut after the script
    ran."""
    read = CallStream.read
    n = [0]

    def lost(self):
        reply = read(self)
        n[0] += 1
        if n[0] > after:
            self.broken = True
            raise redis.ConnectionError("connection lost before the reply")
        return reply

    monkeypatch.setattr(CallStream, "read", lost)


def _declare(conn, *names):
    queues = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in names]
    for q in queues:
        q(conn.default_channel).declare()
    return queues


def _bodies(conn, name, key_prefix, n):
    """The ``i`` of ``n`` messages consumed from ``name`` on a connection of their own."""
    with Connection(conn.as_uri(include_password=True), transport_options={"key_prefix": key_prefix}) as c:
        return [body["i"] for body, _ in drain(c, Queue(name, Exchange(name, type="direct"), routing_key=name), n)]


def _lose_replies(monkeypatch, times=1):
    """The next ``times`` insert round trips run in Redis and then lose their replies (a
    connection cut after the script ran)."""
    real = inserts.run_waiting
    left = [times]

    def lost(client, calls, queues):
        replies = real(client, calls, queues)
        if left[0] > 0:
            left[0] -= 1
            raise redis.ConnectionError("connection lost before the reply")
        return replies

    monkeypatch.setattr(inserts, "run_waiting", lost)


def test_a_batch_of_1000_sends_no_call_per_message_reads_the_replies_at_the_flush_and_keeps_the_order(
    url, key_prefix, redis_client, wire
):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "bq")
        producer = Producer(conn.default_channel)
        assert producer.supports_batch_publish
        with producer.batch():  # max_size 1000: the 1000th publish flushes
            for i in range(1000):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="bq", priority=i % 3)
                if i == 998:  # sub-chunks sent as the batch fills; no reply read before the flush
                    assert (wire.sends, wire.reads) == (999 // C.BATCH_SEND, 0)
        # one insert call per C.BATCH_SEND messages, every reply read at the flush, no round trip
        assert wire.sends == wire.reads == 1000 // C.BATCH_SEND
        assert wire.log == ["send"] * wire.sends + ["read"] * wire.reads
        assert wire.round_trips == []
        got = _bodies(conn, "bq", key_prefix, 1000)
    # priority 2 first (higher_first), FIFO within each priority
    assert got == [i for p in (2, 1, 0) for i in range(1000) if i % 3 == p]


def test_each_queue_gets_one_call_per_flush_and_max_size_flushes_on_its_own(url, key_prefix, make_pq, wire):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        a, b = _declare(conn, "ba", "bb")
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=300):
            for i in range(500):
                producer.publish({"i": i}, exchange=a.exchange, routing_key="ba")
                producer.publish({"i": i}, exchange=b.exchange, routing_key="bb")
        # flushed at 300 items (150 per queue, under C.BATCH_SEND: sent at the flush), three
        # times, and the rest (100 per queue) at the end: one call per queue per flush
        assert wire.log == ["send", "send", "read", "read"] * 4
        assert wire.round_trips == []
        for name in ("ba", "bb"):
            assert make_pq(name).size() == 500
            assert sorted(_bodies(conn, name, key_prefix, 500)) == list(range(500))


def test_a_message_routed_to_two_queues_is_stored_once_in_each(url, key_prefix, make_pq):
    ex = Exchange("both", type="topic")
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        for name in ("t1", "t2"):
            Queue(name, ex, routing_key="job.#")(conn.default_channel).declare()
        producer = Producer(conn.default_channel)
        with producer.batch():
            for i in range(10):
                producer.publish({"i": i}, exchange=ex, routing_key="job.x")
        for name in ("t1", "t2"):
            assert make_pq(name).size() == 10


def test_a_batch_routes_each_key_as_a_single_publish_and_sees_a_new_binding_after_a_flush(url, key_prefix, make_pq):
    # a batch keeps an exchange's routing of a key until its next flush (batches.py, _routes)
    ex = Exchange("rt", type="topic")
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        Queue("rt-a", ex, routing_key="a.*")(conn.default_channel).declare()
        Queue("rt-b", ex, routing_key="b.*")(conn.default_channel).declare()
        producer = Producer(conn.default_channel)
        with producer.batch() as batch:
            for i in range(6):  # two keys of one pattern, one of another, each routed as itself
                producer.publish({"i": i}, exchange=ex, routing_key=("a.x", "a.y", "b.z")[i % 3])
            batch.flush()
            # bound after the flush: the batch's next publishes of the same key reach it too
            Queue("rt-c", ex, routing_key="a.x")(conn.default_channel).declare()
            for i in range(6, 8):
                producer.publish({"i": i}, exchange=ex, routing_key="a.x")
        sizes = {n: make_pq(n).size() for n in ("rt-a", "rt-b", "rt-c")}
        assert sizes == {"rt-a": 6, "rt-b": 2, "rt-c": 2}


def test_errors_of_a_single_publish_raise_at_the_call_and_buffer_nothing(url, key_prefix, redis_client):
    with Connection(url, transport_options={"key_prefix": key_prefix, "max_message_bytes": 2000}) as conn:
        (q,) = _declare(conn, "be")
        producer = Producer(conn.default_channel)
        with producer.batch() as batch:
            producer.publish({"i": 0}, exchange=q.exchange, routing_key="be")
            with pytest.raises(ValueError, match="300"):
                producer.publish({"i": 1}, exchange=q.exchange, routing_key="be", priority=300)
            with pytest.raises(MessageTooLarge):
                producer.publish({"i": 2, "pad": os.urandom(3000).hex()}, exchange=q.exchange, routing_key="be")
            assert len(batch.state.session) == 1
        assert _bodies(conn, "be", key_prefix, 1) == [0]


def test_a_block_that_raises_stores_nothing(url, key_prefix, make_pq):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "bx")
        producer = Producer(conn.default_channel)
        with pytest.raises(KeyError):
            with producer.batch():
                producer.publish({"i": 0}, exchange=q.exchange, routing_key="bx")
                raise KeyError("stop")
        assert make_pq("bx").size() == 0


def test_a_flush_whose_replies_were_lost_keeps_them_and_a_resend_stores_nothing_twice(
    url, key_prefix, make_pq, monkeypatch
):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        a, b = _declare(conn, "la", "lb")
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=5000) as batch:
            # Given 600 messages per queue, sent as six calls (la, lb, la, lb, la, lb) while the
            # batch fills, all run in Redis, and the replies of the last three lost at the flush
            _lose_stream_replies(monkeypatch, after=3)
            for i in range(600):
                producer.publish({"i": i}, exchange=a.exchange, routing_key="la")
                producer.publish({"i": i}, exchange=b.exchange, routing_key="lb")
            with pytest.raises(redis.ConnectionError) as info:
                batch.flush()
            # Then it raises, claims only what it read as stored, and keeps the rest
            assert "600 message(s) not known to be stored" in "".join(info.value.__notes__)
            session = batch.state.session
            assert len(session) == 600 and session.stored == 600
            stored = sum(make_pq(n).size() for n in ("la", "lb"))
            assert stored == 1200  # every call ran: only replies were lost
            # When the rest is sent again
            monkeypatch.undo()
            batch.flush()
            assert len(session) == 0 and session.repeated == 600 and session.stored == 600
        # Then every message is stored exactly once
        for name in ("la", "lb"):
            assert make_pq(name).size() == 600
            assert sorted(_bodies(conn, name, key_prefix, 600)) == list(range(600))


def test_a_connection_cut_with_replies_outstanding_loses_nothing_and_stores_nothing_twice(
    url, key_prefix, redis_client, make_pq
):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "lc")
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=5000) as batch:
            for i in range(1000):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="lc")
            # Given five calls sent, their replies outstanding, when the server cuts the
            # connection they went on
            session = batch.state.session
            sock = session._stream.conn._sock
            host, port = sock.getsockname()[:2]
            assert redis_client.client_kill(f"{host}:{port}")
            # and the batch goes on: the next sends fail or not (the kernel may take them)
            for i in range(1000, 1500):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="lc")
            try:
                batch.flush()
            except redis.ConnectionError as exc:  # a flush that met the cut raises, keeping what it did not read
                assert "not known to be stored" in "".join(exc.__notes__)
                assert len(session) > 0
                batch.flush()  # sent again: each stored once by its publish id
            assert len(session) == 0
            assert session.stored + session.repeated == 1500  # each message counted once
        # Then each message is stored exactly once
        assert make_pq("lc").size() == 1500
        assert sorted(_bodies(conn, "lc", key_prefix, 1500)) == list(range(1500))


def test_a_flush_refused_half_way_raises_and_keeps_only_what_was_not_stored(url, key_prefix, make_pq):
    with Connection(url, transport_options={"key_prefix": key_prefix, "max_length": 1500}) as conn:
        (q,) = _declare(conn, "bf")
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=5000) as batch:
            for i in range(2500):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="bf")
            # Given a queue that holds 1500 at most: chunks of 1000, 1000, 500
            with pytest.raises(QueueFull) as info:
                batch.flush()
            stored = [eid for eid in info.value.stored if eid is not None]
            session = batch.state.session
            size = make_pq("bf").size()
            # Then what it says is stored is what the queue holds, and the batch keeps the rest
            assert size == len(stored) == session.stored and 0 < size < 2500
            assert len(session) == 2500 - size
            # When room is made and the batch is flushed again
            got = _bodies(conn, "bf", key_prefix, size)
            batch.flush()
        rest = _bodies(conn, "bf", key_prefix, 2500 - size)
        # Then each message is stored exactly once
        assert sorted(got + rest) == list(range(2500))
        assert make_pq("bf").size() == 0


def test_a_sub_chunk_refused_while_later_ones_were_sent_says_what_the_queue_holds(url, key_prefix, make_pq, wire):
    with Connection(url, transport_options={"key_prefix": key_prefix, "max_length": 1500}) as conn:
        (q,) = _declare(conn, "br")
        producer = Producer(conn.default_channel)
        pq = make_pq("br")
        with producer.batch(max_size=5000) as batch:
            # Given 2,500 messages, sent in calls of 200 as the batch fills (the 8th to the
            # 12th refused: 1,400 + 200 > 1,500) and the last 100 at the flush (they fit)
            for i in range(2500):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="br")
            assert (wire.sends, wire.reads) == (12, 0)
            with pytest.raises(QueueFull) as info:
                batch.flush()
            assert wire.sends == wire.reads == 13  # every reply read before it raised
            # Then the entries it says are stored are exactly those the queue holds
            stored = {eid for eid in info.value.stored if eid is not None}
            assert stored == {e.id for e in pq.peek(2000)} and len(stored) == 1500
            session = batch.state.session
            assert session.stored == 1500 and len(session) == 1000 == len(info.value.items)
            got = _bodies(conn, "br", key_prefix, 1500)
            assert sorted(got) == [*range(1400), *range(2400, 2500)]
            # When room is made and the batch is flushed again, the rest is stored once
            batch.flush()
            assert (session.stored, session.repeated, len(session)) == (2500, 0, 0)
        rest = _bodies(conn, "br", key_prefix, 1000)
        assert sorted(rest) == list(range(1400, 2400))
        assert pq.size() == 0


def test_a_discarded_batch_reads_its_outstanding_replies_and_leaves_a_clean_connection(url, key_prefix, make_pq, wire):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "bd")
        producer = Producer(conn.default_channel)
        pq = make_pq("bd")
        # Given a block that raises after two sub-chunks were sent (their replies outstanding)
        with pytest.raises(KeyError):
            with producer.batch(max_size=5000) as batch:
                for i in range(500):
                    producer.publish({"i": i}, exchange=q.exchange, routing_key="bd")
                session = batch.state.session
                stream_conn = session._stream.conn
                assert (wire.sends, wire.reads) == (2, 0)
                raise KeyError("stop")
        # Then the discard read both replies and handed the connection back with nothing unread
        assert (wire.sends, wire.reads) == (2, 2)
        assert session._stream is None and session._sent == [] and len(session) == 0
        assert session.stored == 400  # the sub-chunks sent are stored; the 100 not sent are dropped
        assert pq.size() == 400
        pool = conn.default_channel.client.connection_pool
        assert stream_conn in pool._available_connections and not stream_conn.can_read()
        # and the next batch, on the same pool, stores its own messages, once each
        with producer.batch():
            for i in range(500, 900):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="bd")
        assert sorted(_bodies(conn, "bd", key_prefix, 800)) == [*range(400), *range(500, 900)]


def test_batch_send_0_sends_nothing_before_the_flush_and_a_block_that_raises_stores_nothing(
    url, key_prefix, make_pq, wire
):
    with Connection(url, transport_options={"key_prefix": key_prefix, "batch_send": 0}) as conn:
        (q,) = _declare(conn, "b0")
        producer = Producer(conn.default_channel)
        pq = make_pq("b0")
        with pytest.raises(KeyError):
            with producer.batch(max_size=5000):
                for i in range(500):
                    producer.publish({"i": i}, exchange=q.exchange, routing_key="b0")
                raise KeyError("stop")
        assert wire.log == [] and pq.size() == 0
        with producer.batch(max_size=5000):
            for i in range(500):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="b0")
            assert wire.log == [] and pq.size() == 0
        # the flush sends them in calls of C.BATCH_SEND and reads every reply: one round trip
        n = -(-500 // C.BATCH_SEND)
        assert wire.log == ["send"] * n + ["read"] * n and wire.round_trips == []
        assert sorted(_bodies(conn, "b0", key_prefix, 500)) == list(range(500))


def test_a_sub_chunk_the_queue_will_not_lay_out_leaves_the_rest_to_the_flush(
    url, key_prefix, redis_client, wire, monkeypatch
):
    real = batches.batch_call
    calls = [0]

    def second_refused(queue, items):
        calls[0] += 1
        if calls[0] == 2:
            raise ValueError("an item this queue refuses")
        return real(queue, items)

    monkeypatch.setattr(batches, "batch_call", second_refused)
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "bv")
        producer = Producer(conn.default_channel)
        # Given a second sub-chunk whose call cannot be made: nothing raises at the publish
        with producer.batch(max_size=5000) as batch:
            for i in range(700):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="bv")
            assert wire.sends == 1
        # Then the flush reads the first call's reply and stores the rest on the round-trip path
        assert wire.log == ["send", "read"] and wire.round_trips == [1]
        assert batch.state.session.stored == 700
        assert _bodies(conn, "bv", key_prefix, 700) == list(range(700))


def test_a_flushed_batch_has_its_publish_ids_forgotten(url, key_prefix, redis_client, make_pq):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        (q,) = _declare(conn, "bm")
        producer = Producer(conn.default_channel)
        for _ in range(5):
            with producer.batch():
                for i in range(1000):
                    producer.publish({"i": i}, exchange=q.exchange, routing_key="bm")
        pq = make_pq("bm")
        assert pq.size() == 5000
        # each flush forgets the ids of the one before: the window holds the last batch's only
        remembered = redis_client.hlen(pq.keys.publish_ids) + redis_client.hlen(pq.keys.publish_ids_before)
        assert remembered <= 1000


def test_fanout_in_a_batch_is_broadcast_at_once(url, key_prefix):
    fan = Exchange("bfan", type="fanout")
    opts = {"key_prefix": key_prefix}
    with Connection(url, transport_options=opts) as c1, Connection(url, transport_options=opts) as c2:
        got = []
        with c1.Consumer(Queue("bfan-1", fan), callbacks=[lambda body, m: got.append(body)], no_ack=True):
            try:
                c1.drain_events(timeout=0.2)  # subscribe
            except TimeoutError:
                pass
            producer = Producer(c2.default_channel)
            with producer.batch():
                producer.publish({"i": 1}, exchange=fan, declare=[fan])
                deadline = time.monotonic() + 3
                while not got and time.monotonic() < deadline:  # received before the block ends
                    try:
                        c1.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
                assert got == [{"i": 1}]


def test_a_batch_on_a_sharded_queue_stores_each_message_once_after_a_lost_reply(
    url, key_prefix, redis_client, monkeypatch
):
    opts = {"key_prefix": key_prefix, "shards": 4}
    with Connection(url, transport_options=opts) as conn:
        (q,) = _declare(conn, "bs")
        producer = Producer(conn.default_channel)
        sharded = conn.default_channel.queue("bs")
        with producer.batch(max_size=5000) as batch:
            for i in range(2000):
                producer.publish({"i": i}, exchange=q.exchange, routing_key="bs", priority=i % 5)
            _lose_replies(monkeypatch)  # the first shard's insert ran, its reply was lost
            with pytest.raises(redis.ConnectionError):
                batch.flush()
            half = sharded.size()
            assert 0 < half < 2000
            batch.flush()
            assert (batch.state.session.repeated, batch.state.session.stored) == (half, 2000 - half)
        assert sharded.size() == 2000
        assert all(s.size() > 0 for s in sharded.shards)  # spread over the shards
        with Connection(url, transport_options=opts) as c2:
            got = [b["i"] for b, _ in drain(c2, q, 2000, prefetch=50)]
        assert sorted(got) == list(range(2000))


def test_a_celery_group_of_1000_inside_one_producer_batch_sends_no_call_per_task(url, key_prefix, make_pq, wire):
    from celery import Celery, group

    app = Celery("batched", broker=url, set_as_current=False)
    app.conf.broker_transport_options = {"key_prefix": key_prefix}
    app.conf.task_default_queue = "cg"

    @app.task(name="batched.add")
    def add(x, y):
        return x + y

    # The canvas fast path (docs/publishing.md): one producer, one batch around the group
    with app.producer_or_acquire() as producer:
        with producer.batch(max_size=1000):
            result = group(add.s(i, i) for i in range(1000)).apply_async(producer=producer)
    assert wire.sends == wire.reads == 1000 // C.BATCH_SEND and wire.round_trips == []
    entries = make_pq("cg").peek(1000)
    assert [e.id for e in entries] == [r.id for r in result.results]  # stored in the group's order
    assert {describe(e.payload)["task"] for e in entries} == {"batched.add"}


@pytest.mark.e2e
def test_a_group_published_in_one_batch_runs_every_task_once_on_a_real_worker(redis_server, key_prefix, tmp_path):
    import json
    from pathlib import Path

    from celery import Celery, group

    from celery_pq.testing import celery_env, start_worker, stop_workers, wait_for

    root = Path(__file__).resolve().parents[2]
    url = f"pq://127.0.0.1:{redis_server.port}/0"
    options = {"key_prefix": key_prefix}
    app = Celery("batch-client", broker=url, set_as_current=False)
    app.conf.broker_transport_options = options
    app.conf.task_default_queue = "q"
    record = app.signature("e2e.record")
    # Given a group of 1,000 tasks published inside one producer batch
    with app.producer_or_acquire() as producer:
        with producer.batch():
            group(record.clone(args=(n,)) for n in range(1000)).apply_async(producer=producer)
    env = celery_env(
        root,
        PQ_TEST_BROKER=url,
        PQ_TEST_OPTIONS=json.dumps(options),
        PQ_TEST_RECORD=f"redis://127.0.0.1:{redis_server.port}/0",
        PQ_TEST_PREFIX=key_prefix,
    )
    client = redis.Redis(port=redis_server.port)
    worker = start_worker(
        "tests.e2e.app", cwd=root, env=env, name="bw", queues="q", pool="solo", log=tmp_path / "bw.log"
    )
    try:
        worker.wait_ready(30)
        # When a real worker consumes the queue, then every task runs, each exactly once
        wait_for(lambda: client.llen(f"{key_prefix}:rec:order") >= 1000, timeout=60)
        time.sleep(0.5)  # a task run twice would show up now
        ran = [json.loads(x)[0] for x in client.lrange(f"{key_prefix}:rec:order", 0, -1)]
        assert sorted(ran) == list(range(1000))
    finally:
        stop_workers([worker])
        client.close()
