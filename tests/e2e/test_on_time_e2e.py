"""On time, end to end: countdown and eta tasks start when due through a real prefork worker,
with the sweep an hour apart (so only the consumers' own pops can promote them), including one
sent due sooner than every task already waiting (docs/views-and-delays.md)."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import pytest

from celery_pq.storage.keys import shard_names
from celery_pq.testing import wait_for

from .test_celery_e2e import Harness, harness  # noqa: F401  (the fixture)

pytestmark = pytest.mark.e2e

#: Seconds a task may start after its eta here: far under the sweep's second (and its hour
#: here), a bound that holds on a loaded machine (the benchmark measures the real figures).
LATE_BOUND = 0.3


def test_countdown_tasks_start_when_due_without_a_sweep(harness):  # noqa: F811
    h: Harness = harness({"sweep_interval": 3600})
    h.worker("w1", "-P", "prefork", "-c", "2")
    time.sleep(1.5)  # (the keeper's first sweep, at its start, is long over: none follows for an hour)
    rng = random.Random(7)
    etas = {}
    start = time.time()
    late_first = start + 4.0  # waiting first: the tasks below are due sooner, and must wake the worker
    h.send("e2e.stamp", "last", eta=datetime.fromtimestamp(late_first, UTC))
    etas["last"] = late_first
    for i in range(24):
        eta = time.time() + rng.uniform(0.4, 3.0)
        h.send("e2e.stamp", f"t{i}", eta=datetime.fromtimestamp(eta, UTC))
        etas[f"t{i}"] = eta
    h.send("e2e.stamp", "countdown", countdown=1)
    etas["countdown"] = time.time() + 1
    wait_for(lambda: len(h.records("stamp")) == len(etas), 30, "every delayed task")
    late = {tag: started - etas[tag] for tag, _, started in h.records("stamp")}
    assert max(late.values()) < LATE_BOUND, sorted(late.items(), key=lambda kv: -kv[1])[:5]
    assert min(late.values()) > -0.05, late  # (none before its time; clocks agree on one host)


KINDS = {"plain": {}, "fair": {"fair_key": "tenant"}, "sharded": {"shards": 4, "peek": 2}}


@pytest.mark.parametrize("kind", list(KINDS))
def test_thousands_of_countdown_tasks_due_at_once_run_without_a_sweep(harness, kind):  # noqa: F811
    """2,000 tasks due at one moment (a bounded version of the 50,000 of ``make bench``), on a
    plain, a fair (3 tenants) and a sharded queue, the sweep an hour apart: the worker's own pops
    promote every one."""
    h: Harness = harness({"sweep_interval": 3600, **KINDS[kind]})
    h.worker("w1", "-P", "prefork", "-c", "2")
    time.sleep(1.5)  # (the keeper's first sweep is over: none follows for an hour)
    n, eta = 2_000, datetime.fromtimestamp(time.time() + 4.0, UTC)
    with h.app.producer_or_acquire() as producer:
        for i in range(n):
            tenant = f"t{i % 3}"
            h.send("e2e.stamp", f"m{i}", eta=eta, producer=producer, headers={"tenant": tenant})
    shards = shard_names("q", KINDS[kind].get("shards", 1))
    assert sum(h.queue(name).stats()["delayed"] for name in shards) == n  # (all sent before the eta)
    wait_for(lambda: len(h.records("stamp")) == n, 60, "every task due at once")
    started = sorted(at for _, _, at in h.records("stamp"))
    assert started[0] >= eta.timestamp() - 0.05  # (none before its time)
    assert len({tag for tag, _, _ in h.records("stamp")}) == n  # each ran once
