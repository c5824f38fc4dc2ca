"""Celery's revoke reaching the broker (celery_pq/transport/revokes.py): a real Celery app on a
real redis-server, no worker (tests/e2e/test_revoke_e2e.py has the workers)."""

import logging
import time
import uuid

import pytest
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue

from celery_pq.queue import QueueSettings, open_queue

PIDBOX = Exchange("celery.pidbox", type="fanout", durable=False)


def make_app(url, key_prefix, redis_server=None, **options):
    """A Celery app on pq:// (queue "q" by default); ``redis_server``: its result backend too."""
    app = Celery(f"revoke-{uuid.uuid4().hex[:6]}", broker=url)
    app.conf.broker_transport_options = {"key_prefix": key_prefix, **options}
    app.conf.task_default_queue = "q"
    if redis_server is not None:
        app.conf.result_backend = f"redis://127.0.0.1:{redis_server.port}/0"
    return app


def stats(redis_client, key_prefix, name="q", **settings):
    q = open_queue(redis_client, name, QueueSettings(key_prefix=key_prefix, **settings), declare=False)
    s = q.stats()
    return s["waiting"], s["delayed"], s["leased"]


class Receiver:
    """A consumer bound to the pidbox exchange: what the workers' mailboxes would receive."""

    def __init__(self, url, key_prefix):
        self.conn = Connection(url, transport_options={"key_prefix": key_prefix})
        self.got: list = []
        queue = Queue(f"rcv-{uuid.uuid4().hex[:6]}", PIDBOX, auto_delete=True)
        self.consumer = Consumer(
            self.conn, [queue], on_message=lambda m: self.got.append(m), no_ack=True, accept=["json", "pickle"]
        )
        self.consumer.consume()
        self.drain(0.3)  # subscribed

    def drain(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.conn.drain_events(timeout=0.1)
            except TimeoutError:
                pass

    def wait(self, n=1):
        deadline = time.monotonic() + 5
        while len(self.got) < n and time.monotonic() < deadline:
            self.drain(0.1)
        return self.got

    def close(self):
        self.consumer.cancel()
        self.conn.release()


@pytest.fixture
def receiver(url, key_prefix):
    r = Receiver(url, key_prefix)
    yield r
    r.close()


def test_a_revoke_removes_the_waiting_and_delayed_tasks_and_still_reaches_the_workers(
    url, key_prefix, redis_client, receiver
):
    app = make_app(url, key_prefix)
    waiting = app.send_task("t.x", queue="q")
    delayed = app.send_task("t.x", queue="q", countdown=3600)
    other = app.send_task("t.x", queue="q")
    assert stats(redis_client, key_prefix) == (2, 1, 0)
    app.control.revoke(waiting.id)
    assert stats(redis_client, key_prefix) == (1, 1, 0)
    AsyncResultOf = app.AsyncResult
    AsyncResultOf(delayed.id).revoke()
    assert stats(redis_client, key_prefix) == (1, 0, 0)
    # the broadcasts went out unchanged: the workers' revoked sets still learn the ids
    got = receiver.wait(2)
    assert [(m.payload["method"], m.payload["arguments"]["task_id"]) for m in got] == [
        ("revoke", waiting.id),
        ("revoke", delayed.id),
    ]
    assert other.id not in {m.payload["arguments"]["task_id"] for m in got}


@pytest.mark.parametrize(
    "options, settings",
    [({}, {}), ({"fair_key": "tenant"}, {"fair": True}), ({"shards": 3}, {"shards": 3})],
    ids=["plain", "fair", "sharded"],
)
def test_a_list_of_ids_is_removed_from_every_queue_of_the_prefix(url, key_prefix, redis_client, options, settings):
    app = make_app(url, key_prefix, **options)
    ids = [str(uuid.uuid4()) for _ in range(4)]
    for i, task_id in enumerate(ids):
        for queue in ("q", "other"):
            app.send_task("t.x", queue=queue, task_id=task_id, headers={"tenant": f"t{i}"}, countdown=i % 2 * 3600)
    kept = app.send_task("t.x", queue="other", headers={"tenant": "t0"})
    assert stats(redis_client, key_prefix, "q", **settings) == (2, 2, 0)
    app.control.revoke(ids[:3])
    assert stats(redis_client, key_prefix, "q", **settings) == (0, 1, 0)
    assert stats(redis_client, key_prefix, "other", **settings) == (1, 1, 0)
    # the one left in each queue is the one not revoked
    app.control.revoke(ids[3])
    assert stats(redis_client, key_prefix, "q", **settings) == (0, 0, 0)
    assert stats(redis_client, key_prefix, "other", **settings) == (1, 0, 0)
    app.control.revoke(kept.id)
    assert stats(redis_client, key_prefix, "other", **settings) == (0, 0, 0)


def test_a_pickled_revoke_is_read(url, key_prefix, redis_client):
    app = make_app(url, key_prefix)
    app.conf.update(task_serializer="pickle", accept_content=["pickle", "json"])
    r = app.send_task("t.x", queue="q", countdown=3600)
    app.control.revoke(r.id)
    assert stats(redis_client, key_prefix) == (0, 0, 0)


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_a_compressed_revoke_is_read(url, key_prefix, redis_client, receiver, serializer):
    app = make_app(url, key_prefix)
    r = app.send_task("t.x", queue="q")
    body = {"method": "revoke", "arguments": {"task_id": [r.id]}, "destination": None}
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        Producer(conn.default_channel).publish(
            body, exchange=PIDBOX, declare=[PIDBOX], serializer=serializer, compression="zlib"
        )
    assert stats(redis_client, key_prefix) == (0, 0, 0)
    assert receiver.wait()[0].payload == body


def test_other_broadcasts_and_addressed_revokes_leave_the_queue_alone(url, key_prefix, redis_client, receiver):
    app = make_app(url, key_prefix)
    r = app.send_task("t.x", queue="q")
    app.control.broadcast("rate_limit", arguments={"task_name": "t.x", "rate_limit": "1/s", "note": r.id})
    app.control.revoke(r.id, destination=["w1@host"])  # to one worker: Celery leaves the others free to run it
    app.control.ping(timeout=0.1)
    assert stats(redis_client, key_prefix) == (1, 0, 0)
    assert [m.payload["method"] for m in receiver.wait(3)] == ["rate_limit", "revoke", "ping"]


def test_a_broadcast_that_cannot_be_read_is_sent_as_it_is_with_a_warning(
    url, key_prefix, redis_client, receiver, caplog
):
    app = make_app(url, key_prefix)
    r = app.send_task("t.x", queue="q")
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        producer = Producer(conn.default_channel)
        with caplog.at_level(logging.WARNING, logger="celery_pq"):
            producer.publish(
                b'{"method": "revoke", "arguments": {"task_id": ' + r.id.encode(),  # cut short
                exchange=PIDBOX,
                declare=[PIDBOX],
                content_type="application/json",
                content_encoding="utf-8",
            )
            producer.publish({"method": "revoke", "arguments": {"task_id": 42}}, exchange=PIDBOX, serializer="json")
    assert stats(redis_client, key_prefix) == (1, 0, 0)
    got = receiver.wait(2)
    assert len(got) == 2 and got[0].body.startswith(b'{"method": "revoke"')
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "exchange 'celery.pidbox': not read as a revoke (DecodeError" in warnings[0]
    assert "task_id is not an id or a list of ids: 42" in warnings[1]


def test_a_leased_task_is_left_to_the_workers(url, key_prefix, redis_client):
    app = make_app(url, key_prefix)
    r = app.send_task("t.x", queue="q")
    with Connection(url, transport_options={"key_prefix": key_prefix}) as conn:
        message = conn.SimpleQueue("q").get(timeout=5)  # delivered, not acked: leased
        assert message.headers["id"] == r.id
        app.control.revoke(r.id)
        assert stats(redis_client, key_prefix) == (0, 0, 1)
        message.ack()
    assert stats(redis_client, key_prefix) == (0, 0, 0)


def test_a_task_published_again_after_its_revoke_is_stored(url, key_prefix, redis_client):
    app = make_app(url, key_prefix)
    r = app.send_task("t.x", queue="q")
    app.control.revoke(r.id)
    app.send_task("t.x", queue="q", task_id=r.id)
    assert stats(redis_client, key_prefix) == (1, 0, 0)


def test_revoke_removes_false_leaves_the_tasks_to_the_workers(url, key_prefix, redis_client, receiver):
    app = make_app(url, key_prefix, revoke_removes=False)
    r = app.send_task("t.x", queue="q", countdown=3600)
    app.control.revoke(r.id)
    assert stats(redis_client, key_prefix) == (0, 1, 0)
    assert receiver.wait()[0].payload["arguments"]["task_id"] == r.id


def test_a_removed_task_is_marked_revoked_in_the_result_backend(url, key_prefix, redis_client, redis_server):
    app = make_app(url, key_prefix, redis_server)  # (the current app: the last one made)
    removed = app.send_task("t.x", queue="q", countdown=3600)
    never_sent = str(uuid.uuid4())
    assert removed.state == "PENDING"
    app.control.revoke([removed.id, never_sent])
    assert removed.state == "REVOKED"
    with pytest.raises(Exception, match="revoked"):
        removed.get(timeout=5)
    assert app.AsyncResult(never_sent).state == "PENDING"  # nothing removed: the workers' to mark


def test_a_current_app_on_another_broker_marks_nothing(url, key_prefix, redis_client, redis_server):
    app = make_app(url, key_prefix, redis_server)
    r = app.send_task("t.x", queue="q")
    other = make_app(url, key_prefix + "x", redis_server)  # now the current app: another prefix
    assert other is not app
    app.control.revoke(r.id)
    assert stats(redis_client, key_prefix) == (0, 0, 0)
    assert app.AsyncResult(r.id).state == "PENDING"


def test_an_rpc_result_backend_is_not_written_to(url, key_prefix, redis_client, caplog):
    # rpc:// replies to the queue the task's message names: a revoke cannot reach it (nor warn)
    app = make_app(url, key_prefix)
    app.conf.result_backend = "rpc://"
    r = app.send_task("t.x", queue="q")
    with caplog.at_level(logging.WARNING, logger="celery_pq"):
        app.control.revoke(r.id)
    assert stats(redis_client, key_prefix) == (0, 0, 0)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
