"""Real Celery workers on the local Redis Cluster, consuming queues that live on different
masters: priority order, fairness, a priority view, a countdown, remote control (``inspect
ping``, a ``control`` broadcast) and Celery's own queues (pidbox fanout, reply queues); then a
master failover under a running worker and live producers."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import wait_for
from tests.e2e.test_celery_e2e import ROOT, Harness

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

#: Celery's publish retries, long enough to cover a failover (a second or two here): the
#: producer's side of the failover (docs/cluster.md).
PUBLISH_RETRY = {"max_retries": 40, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


class ClusterHarness(Harness):
    """The e2e harness with the broker on the cluster; the tasks' records stay on a plain
    redis-server (outside the cluster, so a failover cannot touch them)."""

    def __init__(self, cluster, records, prefix, tmp_path, options, acks_late=False):
        super().__init__(records, prefix, tmp_path, {"cluster": True, **options}, acks_late)
        self.cluster = cluster
        self.url = cluster.pq_url
        self.env.update(PQ_TEST_BROKER=self.url, PQ_TEST_OPTIONS=json.dumps(self.options))
        self.app.conf.broker_url = self.url
        self.app.conf.task_publish_retry_policy = PUBLISH_RETRY
        self.client = cluster.client()

    def queue(self, name="q"):
        return open_queue(self.client, name, QueueSettings(key_prefix=self.prefix), declare=False)

    def to(self, queue, name, *args, **kw):
        return self.app.send_task(name, args=args, queue=queue, **kw)

    def celery(self, *args):
        out = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.app", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def close(self):
        super().close()
        self.client.close()


@contextmanager
def live_producer(h, queues, first=0):
    """A producer thread publishing ``e2e.record(n, 0)`` every 20 ms, round robin over ``queues``
    (n from ``first``), across the block: yields (n of each publish that returned, errors of
    those that raised). The block begins after 30 publishes and ends 60 publishes after the
    block's body (a failover) has run."""
    confirmed: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce():
        n = first
        while not stop.is_set():
            try:
                h.to(queues[n % len(queues)], "e2e.record", n, 0)
                confirmed.append(n)
            except Exception as exc:
                errors.append(exc)
            n += 1
            time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: len(confirmed) >= 30, 30, "publishes before the failover")
        yield confirmed, errors
        done = len(confirmed)
        wait_for(lambda: len(confirmed) >= done + 60, 60, "publishes after the failover")
    finally:
        stop.set()
        producer.join(30)


@pytest.fixture
def on_cluster(cluster, redis_server, key_prefix, tmp_path):
    made = []

    def make(options=None, acks_late=False):
        h = ClusterHarness(cluster, redis_server, key_prefix, tmp_path, options or {}, acks_late)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_celery_workers_on_three_masters(on_cluster, spread):
    h = on_cluster({"fair_key": "tenant", "sweep_interval": 0.5})
    ordered, fair, viewed = spread
    late = spread[0] + "-late"
    # Given work waiting on three masters before the worker starts: priorities, tenants, a view
    priorities = [random.randrange(256) for _ in range(30)]
    for n, p in enumerate(priorities):
        h.to(ordered, "e2e.record", n, p, priority=p)
    for tenant, count in (("A", 12), ("B", 3), ("C", 3)):
        for i in range(count):
            h.to(fair, "e2e.tenant_record", tenant, i, headers={"tenant": tenant})
    h.to(viewed, "e2e.stamp", "urgent", priority=250)
    h.to(viewed, "e2e.stamp", "bulk", priority=1)
    # When one worker consumes all of it, the last through a priority view
    h.worker("w1", "-Q", f"{ordered},{fair},{viewed}[>=200]", gossip=True)
    wait_for(lambda: len(h.records("order")) == 30 and len(h.records("tenant")) == 18, 60, "the backlog")
    # Then each queue was served by priority, fairly, and through its view only
    assert [p for _, p in h.records("order")] == sorted(priorities, reverse=True)
    tenants = [t for t, _ in h.records("tenant")]
    assert tenants[:9] == ["A", "B", "C"] * 3
    wait_for(lambda: h.records("stamp"), 10, "the urgent task")
    assert [tag for tag, *_ in h.records("stamp")] == ["urgent"]
    assert h.queue(viewed).stats()["waiting"] == 1  # "bulk" is not the view's

    # A countdown waits in the broker, then runs
    sent = time.time()
    h.to(fair, "e2e.stamp", "countdown", countdown=2, headers={"tenant": "A"})
    wait_for(lambda: len(h.records("stamp")) == 2, 15, "the countdown task")
    assert h.records("stamp")[1][0] == "countdown" and h.records("stamp")[1][2] - sent >= 1.9

    # Remote control: inspect ping (pidbox fanout, a reply queue) and a control broadcast
    w1 = f"w1@{os.uname().nodename}"  # (named: the command returns once it answered)
    out = h.celery("inspect", "ping", "--timeout", "5", "-d", w1)
    assert "pong" in out and "w1@" in out
    out = h.celery("control", "add_consumer", late, "--timeout", "5")
    assert "add consumer" in out.lower() or "ok" in out.lower(), out
    h.to(late, "e2e.stamp", "late")
    wait_for(lambda: len(h.records("stamp")) == 3, 15, "a task of the queue added by control")
    queues = json.loads(h.celery("inspect", "active_queues", "--json", "--timeout", "5", "-d", w1))
    assert late in {q["name"] for qs in queues.values() for q in qs}


def test_a_master_failover_under_a_worker_and_producers(on_cluster, spread, healed):
    # leases shorter than the long task: it runs once only if its lease is renewed through the failover
    h = on_cluster({"lease_seconds": 4, "sweep_interval": 0.5}, acks_late=True)
    victim_queue = spread[0]
    h.worker("w1", "-Q", ",".join(spread))
    # Given a task running on the master that will fail, and producers publishing to all three
    h.to(victim_queue, "e2e.sleep", 7, "long")
    wait_for(lambda: h.records("start"), 20, "the long task to start")
    with live_producer(h, spread) as (confirmed, errors):
        # When the master of the long task's queue is killed and its replica takes over
        h.cluster.kill_master(h.cluster.master_of(h.queue(victim_queue).keys.entries))
    # Then every acknowledged publish ran at least once, the worker carried on, the long task ended
    wait_for(lambda: set(confirmed) <= {n for n, _ in h.records("order")}, 90, "every confirmed task to run")
    wait_for(lambda: h.records("done"), 30, "the long task to end")
    ran = [n for n, _ in h.records("order")]
    starts = len(h.records("start"))
    print(
        f"\nfailover under a worker: {len(confirmed)} publishes confirmed, {len(errors)} refused, "
        f"{len(ran) - len(set(ran))} tasks ran twice; the long task started {starts} time(s)"
    )
    assert h.workers[0].poll() is None
    assert starts == 1  # the running task's lease held through the failover: not delivered again


def test_a_slot_migration_away_and_back_under_a_prefork_worker_and_a_producer(on_cluster, spread):
    # leases shorter than the long task: it runs once only if its lease is renewed while its slot moves
    h = on_cluster({"lease_seconds": 4, "sweep_interval": 0.5}, acks_late=True)
    queue = spread[0]
    slot = h.cluster.slot_of(h.queue(queue).keys.entries)
    home = h.cluster.master_of(h.queue(queue).keys.entries)
    away = next(m for m in h.cluster.masters() if m.port != home.port)
    worker = h.worker("w1", "-Q", queue, "-P", "prefork", "-c", "2")
    # Given a task running, and a producer publishing with Celery's publish retry
    h.to(queue, "e2e.sleep", 6, "long")
    wait_for(lambda: h.records("start"), 20, "the long task to start")
    moved, took = [], []
    with live_producer(h, [queue]) as (confirmed, errors):
        # When the queue's slot moves to another master key by key, half a second after each key
        # (calls meet it half moved; each move lasts longer than a lease), then back
        for to in (away, home):
            started = time.monotonic()
            moved.append(h.cluster.move_slot(slot, to, pause=0.5))
            took.append(round(time.monotonic() - started, 1))
            time.sleep(0.5)
    # Then every publish that returned ran, none is left waiting, the worker never stopped
    wait_for(lambda: set(confirmed) <= {n for n, _ in h.records("order")}, 60, "every confirmed task to run")
    wait_for(lambda: h.records("done"), 30, "the long task to end")
    wait_for(
        lambda: h.queue(queue).stats()["waiting"] == 0 and h.queue(queue).stats()["leased"] == 0,
        30,
        "the queue to empty",
    )
    ran = [n for n, _ in h.records("order")]
    log = worker.log_path.read_text(errors="replace")
    print(
        f"\nslot moved away and back ({moved} keys, {took} s) under a prefork worker: {len(confirmed)} publishes "
        f"confirmed, {len(errors)} refused, {len(ran) - len(set(ran))} ran twice; long task started "
        f"{len(h.records('start'))} time(s)"
    )
    assert min(moved) >= 5
    assert errors == []
    assert worker.poll() is None
    assert "Unrecoverable error" not in log
    assert len(h.records("start")) == 1  # the running task's lease held through a move longer than a lease
    assert max(took) > 4
