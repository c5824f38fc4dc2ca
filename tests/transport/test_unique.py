"""Unique tasks by key through kombu (no Celery worker), against a real redis-server: the headers
``pq_unique``, ``pq_unique_mode``, ``pq_unique_seconds`` and the options ``unique_key``,
``unique_mode``, ``unique_seconds``; ``celery_pq.publish_outcome``; bad values refused with
nothing written; a message without a key published as ever."""

import json

import pytest
from celery import Celery
from kombu import Connection, Producer

import celery_pq
from celery_pq import ConfigError, PublishOutcome, publish_outcome
from celery_pq.queue.scripts import Scripts
from celery_pq.transport.options import Options
from tests.support import needs_producer_batch

try:
    from support.consume import drain, make_queue
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue


def unique_of_message(message):
    """A ``unique_key`` function: the key from the body (the serialized payload, as for fair_key)."""
    return json.loads(message["body"]).get("user")


@pytest.fixture
def opts(key_prefix):
    return {"key_prefix": key_prefix}


def publish(conn, q, tid, body=None, priority=0, **headers):
    Producer(conn.default_channel).publish(
        body or {"t": tid},
        exchange=q.exchange,
        routing_key=q.routing_key,
        declare=[q],
        headers={"id": tid, **headers},
        priority=priority,
    )


def stored(make_pq, name="uk"):
    return make_pq(name)


def test_a_merged_publish_is_told_which_task_stands(url, opts, make_pq):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        publish(conn, q, "t1", pq_unique="report:7")
        publish(conn, q, "t2", pq_unique="report:7")
        assert publish_outcome("t1") == PublishOutcome("stored", "t1", "t1", "report:7")
        out = celery_pq.publish_outcome(type("AsyncResult", (), {"id": "t2"})())
        assert (out.kind, out.task_id, out.requested, out.key) == ("merged", "t1", "t2", "report:7")
        assert [e.id for e in stored(make_pq).peek(5)] == ["t1"]
        [(body, message)] = drain(conn, q, 1)
        assert body == {"t": "t1"} and message.headers["pq_unique"] == "report:7"
        # acked: the key is free again
        publish(conn, q, "t3", pq_unique="report:7")
        assert publish_outcome("t3").kind == "stored"
    assert publish_outcome("never-published") is None


def test_modes_and_seconds_from_headers_and_options(url, opts, redis_client, make_pq):
    opts.update(unique_mode={"uk": "replace", "*": "while_waiting"}, unique_seconds=30)
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        publish(conn, q, "r1", pq_unique="k")
        publish(conn, q, "r2", {"v": 2}, pq_unique="k")  # the queue's default mode: replace
        assert publish_outcome("r2").kind == "replaced"
        publish(conn, q, "d1", pq_unique="d", pq_unique_mode="debounce", pq_unique_seconds=5)
        publish(conn, q, "d2", pq_unique="d", pq_unique_mode="debounce")  # 30 s: the option's
        assert publish_outcome("d2").kind == "debounced"
        q2 = stored(make_pq)
        due = redis_client.zscore(q2.keys.delayed, "d2")
        sec, usec = redis_client.time()
        assert 25_000 < due - (sec * 1000 + usec // 1000) <= 30_000
        publish(conn, q, "x1", pq_unique="x", pq_unique_mode="throttle", pq_unique_seconds=60)
        publish(conn, q, "x2", pq_unique="x", pq_unique_mode="throttle", pq_unique_seconds=60)
        assert publish_outcome("x2") == PublishOutcome("throttled", "x1", "x2", "x")
        assert sorted(e.id for e in q2.peek(10)) == ["r2", "x1"]
        assert q2.counters()["unique_throttled"] == 1


def test_a_key_function_option(url, opts, make_pq):
    opts["unique_key"] = f"{__name__}:unique_of_message"
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        publish(conn, q, "f1", {"user": "ann"})
        publish(conn, q, "f2", {"user": "ann"})
        publish(conn, q, "f3", {"other": 1})  # None: no key
        assert publish_outcome("f2").task_id == "f1" and publish_outcome("f3") is None
        assert stored(make_pq).size() == 2


@pytest.mark.parametrize(
    "headers,named",
    [
        ({"pq_unique": 7}, "pq_unique"),
        ({"pq_unique": ""}, "pq_unique"),
        ({"pq_unique": "k", "pq_unique_mode": "sometimes"}, "pq_unique_mode"),
        ({"pq_unique": "k", "pq_unique_mode": "throttle", "pq_unique_seconds": 0}, "pq_unique_seconds"),
        ({"pq_unique": "k", "pq_unique_seconds": "soon"}, "pq_unique_seconds"),
        ({"pq_unique_mode": "replace"}, "pq_unique_mode"),
    ],
)
def test_bad_header_values_are_refused_with_nothing_written(url, opts, redis_client, make_pq, headers, named):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        with pytest.raises(ValueError, match=named) as err:
            publish(conn, q, "bad", **headers)
        assert "not published" in str(err.value)
        assert redis_client.hlen(stored(make_pq).keys.entries) == 0


def test_bad_options_are_refused_once():
    for options, named in (
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": "no.such.module:fn"}, "unique_key"),
        ({"unique_mode": "often"}, "unique_mode"),
        ({"unique_mode": {"q": "replace", "*": 3}}, "unique_mode"),
        ({"unique_seconds": -1}, "unique_seconds"),
        ({"unique_seconds": {"q": True}}, "unique_seconds"),
    ):
        with pytest.raises(ConfigError, match=named):
            Options.from_transport_options(options)


def test_a_message_without_a_key_is_published_as_ever(url, opts, redis_client, make_pq, monkeypatch):
    seen = []
    real = Scripts.insert_call

    def spy(self, items, forget=(), made="0", unique=None):
        seen.append(unique)
        return real(self, items, forget, made, unique)

    monkeypatch.setattr(Scripts, "insert_call", spy)
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        publish(conn, q, "n1")
        publish(conn, q, "n1")  # the same task id twice: two messages, as ever
    assert seen == [None, None]
    assert redis_client.exists(stored(make_pq).keys.unique_keys) == 0
    assert stored(make_pq).size() == 2 and publish_outcome("n1") is None


@needs_producer_batch
def test_a_keyed_message_in_a_batch_is_stored_at_once(url, opts, make_pq):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        producer = Producer(conn.default_channel)
        q(conn.default_channel).declare()
        with producer.batch():
            for tid in ("b1", "b2"):
                producer.publish({}, exchange=q.exchange, routing_key="uk", headers={"id": tid, "pq_unique": "k"})
            producer.publish({}, exchange=q.exchange, routing_key="uk", headers={"id": "plain"})
            assert publish_outcome("b2").kind == "merged"
        assert sorted(e.id for e in stored(make_pq).peek(5)) == ["b1", "plain"]


def test_a_sharded_queue_finds_a_key_on_its_shard(url, opts, redis_client, key_prefix):
    opts["shards"] = 4
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        for i in range(12):
            publish(conn, q, f"s{i}", pq_unique=f"key-{i % 3}")
        assert [publish_outcome(f"s{i}").kind for i in range(12)].count("stored") == 3
        assert len(drain(conn, q, 3)) == 3


def test_a_task_id_of_the_callers_choosing_is_throttled_and_a_retry_is_not(url, opts, make_pq):
    """``apply_async(task_id=f"report-{n}")`` twice within the period: the second is throttled
    (its id is the standing one's, but it is no retry); Celery's retry of it (the same id, its
    header ``retries`` one up, as ``Task.retry`` sends it) is stored."""
    app = Celery("uk", broker=url, set_as_current=False)
    app.conf.broker_transport_options = opts
    report = app.signature("proj.report", args=(7,), queue="uk")
    headers = {"pq_unique": "report:7", "pq_unique_mode": "throttle", "pq_unique_seconds": 60}
    try:
        first = report.apply_async(task_id="report-7", headers=headers)
        assert publish_outcome(first) == PublishOutcome("stored", "report-7", "report-7", "report:7")
        again = report.apply_async(task_id="report-7", headers=headers)
        assert (publish_outcome(again).kind, publish_outcome(again).task_id) == ("throttled", "report-7")
        retry = report.apply_async(task_id="report-7", headers=headers, retries=1)
        out = publish_outcome(retry)
        assert out.kind == "stored" and out.task_id.startswith("report-7~")
        assert stored(make_pq).size() == 2
    finally:
        app.close()


def test_a_bad_retries_header_of_a_keyed_message_is_refused(url, opts, make_pq):
    with Connection(url, transport_options=opts) as conn:
        q = make_queue("uk")
        with pytest.raises(ValueError, match="'retries'.*not published"):
            publish(conn, q, "bad", pq_unique="k", retries="two")
        publish(conn, q, "plain", retries="two")  # without a key the header is not read
        assert [e.id for e in stored(make_pq).peek(5)] == ["plain"]
