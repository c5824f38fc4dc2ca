"""Several processes with different options on one sharded queue, through real Celery workers:
a new worker that limits a task (``task_rate``), an old worker without the limit started after
it, and a producer with fewer options than either, publishing limited tasks, delayed tasks and bursts of unique keys
together. Every task runs once (each burst of a key once), no delayed task starts before its
ETA, and the limit holds over both shards, whichever worker took the task (docs/settings.md)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from celery_pq.queue import open_queue
from celery_pq.testing import wait_for
from celery_pq.transport.options import Options
from celery_pq.transport.task_rates import task_tenant

from .test_celery_e2e import Harness
from .test_task_rate_e2e import most_in_window

pytestmark = pytest.mark.e2e

SHARDS = 2  # every process of a sharded queue names the same number
RATE = 5  # the limited task's deliveries per second, over the whole queue
LIMITED, DELAYED, KEYS, BURST = 15, 20, 4, 5


def test_a_new_worker_an_old_one_and_a_producer_with_fewer_options_on_one_sharded_queue(
    redis_server, key_prefix, tmp_path
):
    new = Harness(
        redis_server,
        key_prefix,
        tmp_path,
        {"shards": SHARDS, "task_rate": {"e2e.rate_limited": RATE}, "event_log": 100_000, "lease_seconds": 5},
        acks_late=True,
    )
    old = Harness(redis_server, key_prefix, tmp_path, {"shards": SHARDS, "event_log": 100_000}, acks_late=True)
    producer = Harness(redis_server, key_prefix, tmp_path, {"shards": SHARDS}, acks_late=False)
    try:
        # Given a new worker that declares the limit, and an old worker without it (re)started
        # after it, as during a rolling deploy, on one sharded queue
        new.worker("new")
        old.worker("old")
        # When the producer, whose options name no limit and no event log, publishes limited
        # tasks, delayed tasks and bursts of publishes of unique keys (each burst while its
        # first publish still waits: delayed), all at once
        for i in range(LIMITED):
            producer.send("e2e.rate_limited", i)
        etas = {}
        for i in range(DELAYED):
            eta = datetime.now(UTC) + timedelta(seconds=1 + (i % 3) * 0.5)
            etas[i] = eta.timestamp()
            producer.send("e2e.rate_free", i, eta=eta)
        for k in range(KEYS):
            for b in range(BURST):
                producer.send(
                    "e2e.record",
                    k,
                    b,
                    countdown=1.5,
                    headers={"pq_unique": f"key-{k}", "pq_unique_mode": "while_waiting"},
                )
        wait_for(
            lambda: (
                len(new.records("limited")) == LIMITED
                and len(new.records("free")) == DELAYED
                and len(new.records("order")) >= KEYS
            ),
            60,
            "every task ran",
        )
        # Then each limited and each delayed task ran once, and each key's burst once (its
        # first publish stood, the others merged into it)
        assert sorted(n for n, _ in new.records("limited")) == list(range(LIMITED))
        assert sorted(n for n, _ in new.records("free")) == list(range(DELAYED))
        ran = Counter(k for k, _ in new.records("order"))
        assert ran == dict.fromkeys(range(KEYS), 1), ran
        # And no delayed task started before its ETA (the task's clock is Redis's)
        for n, started_us in new.records("free"):
            assert started_us / 1e6 >= etas[n] - 0.01, (n, started_us / 1e6 - etas[n])
        # And the limit held over both shards, the old worker's pops included
        q = open_queue(new.redis, "q", Options(key_prefix=key_prefix, shards=SHARDS).queue_settings("q"), declare=False)
        delivered = [e for s in q.shards for e in s.events() if e["e"] == "deliver"]
        limited = [e["ms"] for e in delivered if e["t"] == task_tenant("e2e.rate_limited")]
        assert len(limited) == LIMITED, Counter(e["t"] for e in delivered)
        for seconds in (0.5, 1.0, 2.0):
            assert most_in_window(limited, seconds) <= max(RATE, 1) + RATE * seconds, seconds
        # And the stored limit is the new worker's: neither the old worker (it names no limit,
        # so it declares none) nor the producer lifted it
        assert q.task_limits == {task_tenant("e2e.rate_limited"): float(RATE)}
    finally:
        for h in (new, old, producer):
            h.close()
