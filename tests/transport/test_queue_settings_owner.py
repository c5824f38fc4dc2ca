"""Settings that are the queue's have one owner (docs/settings.md): a producer with fewer options
never lifts a limit or turns a fair queue plain under its consumers; a consumer declares the
tenants' tables; a process whose options disagree is told at open, naming both values; a rolling
deploy (old and new workers side by side, the limit changed) ends with the new limit for all."""

import logging
import time

import pytest
from kombu import Connection

from celery_pq.queue import QueueSettings, open_queue
from tests.support.tenants import held_tenants

try:
    from support.consume import drain, make_queue
    from test_task_rate import SLOW, publish
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue
    from tests.transport.test_task_rate import SLOW, publish

OTHER = "proj.tasks.other"


def _rates(redis_client, key_prefix):
    q = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
    return {k: float(v) for k, v in redis_client.hgetall(q.keys.tenant_settings).items() if k.startswith(b"r:")}


def test_a_producer_without_task_rate_lifts_no_limit_and_its_messages_go_under_it(url, key_prefix, redis_client):
    # Given a worker that limits SLOW to 0.01/s (one token in 100 s: none is given in this test)
    worker_options = {"key_prefix": key_prefix, "task_rate": {SLOW: 0.01}}
    with Connection(url, transport_options=worker_options) as worker:
        drain(worker, make_queue(), 1, timeout=0.3)  # it consumes: the limit is declared
        # When a producer whose options have no task_rate publishes SLOW and other tasks
        with Connection(url, transport_options={"key_prefix": key_prefix}) as producer:
            publish(producer, make_queue(), [SLOW] * 4 + [OTHER] * 3)
        # Then the limit stands and the producer's SLOW messages are under it
        assert _rates(redis_client, key_prefix) == {b"r:task:" + SLOW.encode(): 0.01}
        got = [b["task"] for b, _ in drain(worker, make_queue(), 7, timeout=1.5)]
    assert got == [OTHER] * 3
    q = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
    assert held_tenants(q) == {"task:" + SLOW: "rate"} and q.size() == 4


def test_a_producer_that_opened_the_queue_before_the_worker_declared_it_publishes_under_the_limit(
    url, key_prefix, redis_client
):
    with Connection(url, transport_options={"key_prefix": key_prefix}) as producer:
        # Given a producer that declared the queue before any worker consumed it (its options:
        # a plain queue, no limit)
        make_queue()(producer.default_channel).declare()
        assert producer.default_channel.queue("kq").task_limits == {}
        # When a worker limiting SLOW declares the queue (fair, its limit stored) and the same
        # producer publishes SLOW (its open queue is stale: the insert is refused, it reopens)
        worker_options = {"key_prefix": key_prefix, "task_rate": {SLOW: 0.01}}
        with Connection(url, transport_options=worker_options) as worker:
            drain(worker, make_queue(), 1, timeout=0.3)
            publish(producer, make_queue(), [SLOW] * 3 + [OTHER])
            got = [b["task"] for b, _ in drain(worker, make_queue(), 4, timeout=1.5)]
            assert producer.default_channel.queue("kq").task_limits == {"task:" + SLOW: 0.01}
    # Then the reopened queue's limit held the SLOW messages: they are the limit's tenant's
    assert got == [OTHER]
    q = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
    assert held_tenants(q) == {"task:" + SLOW: "rate"} and q.size() == 3


def test_a_producer_without_task_rate_does_not_turn_a_drained_fair_queue_plain(url, key_prefix, redis_client):
    worker_options = {"key_prefix": key_prefix, "task_rate": {SLOW: 100}}
    with Connection(url, transport_options=worker_options) as worker:
        publish(worker, make_queue(), [OTHER])
        assert len(drain(worker, make_queue(), 1, timeout=2)) == 1  # the fair queue, drained
        with Connection(url, transport_options={"key_prefix": key_prefix}) as producer:
            publish(producer, make_queue(), [OTHER, SLOW])
        # The worker's pops still work (no ModeMismatch) and take both
        got = sorted(b["task"] for b, _ in drain(worker, make_queue(), 2, timeout=2))
    assert got == sorted([OTHER, SLOW])
    assert (
        open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False).recorded()["mode"]["fair"]
        is True
    )


def test_a_process_whose_options_disagree_is_told_at_open_with_both_values(url, key_prefix, caplog):
    with Connection(url, transport_options={"key_prefix": key_prefix, "fair_key": "tenant"}) as worker:
        drain(worker, make_queue(), 1, timeout=0.3)
        publish(worker, make_queue(), [OTHER])  # the queue records its mode: fair
    caplog.set_level(logging.WARNING, logger="celery_pq")
    options = {"key_prefix": key_prefix, "priority_order": "lower_first"}
    with Connection(url, transport_options=options) as producer:
        publish(producer, make_queue(), [OTHER])
    told = [r.getMessage() for r in caplog.records if r.name == "celery_pq"]
    assert any("'kq'" in t and "fair is True in Redis, False in this process's options" in t for t in told), told
    assert any("priority_order is 'higher_first' in Redis, 'lower_first'" in t for t in told), told


def test_a_worker_whose_options_limit_no_task_lifts_no_limit_when_it_starts(url, key_prefix, redis_client):
    # Given a worker that limits SLOW to 0.01/s on the queue (declared)
    with Connection(url, transport_options={"key_prefix": key_prefix, "task_rate": {SLOW: 0.01}}) as new:
        drain(new, make_queue(), 1, timeout=0.3)
        # When an old worker whose options name no task_rate (but a fair_key) starts beside it
        old_options = {"key_prefix": key_prefix, "fair_key": "tenant"}
        with Connection(url, transport_options=old_options) as old:
            drain(old, make_queue(), 1, timeout=0.3)
            publish(old, make_queue(), [SLOW] * 3 + [OTHER])
            got = [b["task"] for b, _ in drain(old, make_queue(), 4, timeout=1.5)]
    # Then the limit stands, and the old worker's pops follow it
    assert _rates(redis_client, key_prefix) == {b"r:task:" + SLOW.encode(): 0.01}
    assert got == [OTHER]


@pytest.mark.parametrize("new_rate", [0.01, 200])
def test_a_rolling_deploy_changes_the_limit_for_old_and_new_workers_alike(url, key_prefix, redis_client, new_rate):
    # Given an old worker with one limit on SLOW and 40 SLOW tasks waiting
    old_rate = 200 if new_rate < 1 else 0.01
    with Connection(url, transport_options={"key_prefix": key_prefix, "task_rate": {SLOW: old_rate}}) as old:
        drain(old, make_queue(), 1, timeout=0.3)
        # When a new worker with another limit starts beside it (it declares the new one)
        with Connection(url, transport_options={"key_prefix": key_prefix, "task_rate": {SLOW: new_rate}}) as new:
            drain(new, make_queue(), 1, timeout=0.3)
            publish(new, make_queue(), [SLOW] * 40)
            assert _rates(redis_client, key_prefix) == {b"r:task:" + SLOW.encode(): float(new_rate)}
            # Then the old worker's pops follow the new limit (the scripts read it from the queue)
            start = time.monotonic()
            got = drain(old, make_queue(), 40, timeout=1.5)
    if new_rate < 1:
        assert len(got) <= 1  # held: the old worker's own 200/s no longer applies
    else:
        assert len(got) == 40 and time.monotonic() - start < 1.5  # lifted to 200/s for the old worker too
