"""A real Celery worker on a sharded queue on the local Redis Cluster: every task runs once,
from shards on all three masters; then a master is killed under the worker and live producers,
and the shards it served come back through its replica with every confirmed task run."""

from __future__ import annotations

import pytest

from celery_pq.queue import open_queue
from celery_pq.testing import wait_for
from celery_pq.transport.options import Options
from tests.cluster.test_celery_on_cluster import live_producer, on_cluster  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

SHARDS = 16


def test_a_worker_on_sixteen_shards_then_a_master_failover(on_cluster, healed):  # noqa: F811
    h = on_cluster({"shards": SHARDS, "peek": 2, "lease_seconds": 4, "sweep_interval": 0.5}, acks_late=True)
    queue = open_queue(h.client, "q", Options(key_prefix=h.prefix, shards=SHARDS, peek=2).queue_settings("q"))
    placed = {s.name: h.cluster.master_of(s.keys.entries) for s in queue.shards}
    assert {m.port for m in placed.values()} == {m.port for m in h.cluster.masters()}
    # Given 80 tasks published over 16 shards before the worker starts
    for n in range(80):
        h.to("q", "e2e.record", n, n % 5, priority=n % 5)
    h.worker("w1", "-Q", "q")
    wait_for(lambda: len(h.records("order")) >= 80, 60, "80 tasks")
    # Then each ran exactly once, taken from shards on every master
    assert sorted(n for n, _ in h.records("order")) == list(range(80))
    assert {placed[s.name].port for s in queue.shards if s.counters()["delivered"]} == {m.port for m in placed.values()}
    wait_for(lambda: queue.stats()["leased"] == 0, 10, "the last ack")

    # When producers publish on while the master of shard 0 (and of a third of the shards) is killed
    victim = placed[queue.shards[0].name]
    on_victim = [s for s in queue.shards if placed[s.name] is victim]
    before = {s.name: s.counters()["delivered"] for s in on_victim}
    with live_producer(h, ["q"], first=1000) as (confirmed, errors):
        promoted = h.cluster.kill_master(victim)
    # Then every confirmed publish ran at least once, and the worker lives on
    wait_for(lambda: set(confirmed) <= {n for n, _ in h.records("order")}, 90, "every confirmed task to run")
    ran = [n for n, _ in h.records("order") if n >= 1000]
    print(
        f"\nfailover under a worker on {SHARDS} shards: {len(confirmed)} publishes confirmed, {len(errors)} "
        f"refused, {len(ran) - len(set(ran))} tasks ran twice"
    )
    assert h.workers[0].poll() is None
    # and the killed master's shards are served by its replica now, which delivered from them since
    assert all(h.cluster.master_of(s.keys.entries) is promoted for s in on_victim)
    after = {s.name: s.counters()["delivered"] for s in on_victim}
    assert sum(after.values()) > sum(before.values())
    wait_for(lambda: queue.stats()["waiting"] == 0 and queue.stats()["leased"] == 0, 30, "an empty queue")
