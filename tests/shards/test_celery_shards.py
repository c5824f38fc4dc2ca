"""A real Celery worker on a queue of four shards."""

import random

import pytest

from celery_pq.queue import open_queue
from celery_pq.testing import wait_for
from celery_pq.transport.options import Options

try:
    from e2e.test_celery_e2e import harness
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.e2e.test_celery_e2e import harness  # noqa: F401

pytestmark = pytest.mark.e2e


def test_a_worker_peeking_every_shard_runs_every_task_once_in_priority_order(harness):
    # Given 120 tasks spread over 4 shards, published before any worker runs
    h = harness({"shards": 4, "peek": 4})
    rng = random.Random(4)
    sent = [(i, rng.randint(0, 255)) for i in range(120)]
    for i, p in sent:
        h.send("e2e.record", i, p, priority=p)
    queue = open_queue(h.redis, "q", Options(key_prefix=h.prefix, shards=4).queue_settings("q"))
    assert sum(1 for s in queue.shards if s.size()) == 4
    # When one worker (prefetch 1) takes them all
    h.worker("w1")
    wait_for(lambda: len(h.records("order")) == 120, 60, "120 tasks")
    ran = [tuple(r) for r in h.records("order")]
    # Then each ran once, and peeking all 4 shards keeps the priority order exact
    assert sorted(ran) == sorted(sent)
    assert [p for _, p in ran] == sorted((p for _, p in sent), reverse=True)
    wait_for(lambda: queue.stats()["leased"] == 0, 10, "last ack")
    assert queue.size() == 0 and queue.counters()["acked"] == 120


def test_two_workers_on_sixteen_shards_lose_and_double_nothing(harness):
    h = harness({"shards": 16, "peek": 2})
    h.worker("w1")
    h.worker("w2")
    for i in range(100):
        h.send("e2e.record", i, i % 10, priority=i % 10)
    wait_for(lambda: len(h.records("order")) >= 100, 60, "100 tasks")
    ran = sorted(n for n, _ in h.records("order"))
    assert ran == list(range(100))
    queue = open_queue(h.redis, "q", Options(key_prefix=h.prefix, shards=16).queue_settings("q"))
    wait_for(lambda: queue.stats()["leased"] == 0, 10, "last ack")
    assert queue.size() == 0 and queue.counters()["acked"] == 100
