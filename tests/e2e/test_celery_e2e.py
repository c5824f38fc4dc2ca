"""End to end: real Celery workers as subprocesses on a real redis-server."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import celery
import pytest
import redis
from celery import Celery

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.codec import decode
from celery_pq.testing import celery_env, start_worker, stop_workers, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


class Harness:
    def __init__(self, server, prefix, tmp_path, options, acks_late):
        self.server = server
        self.prefix = prefix
        self.tmp = tmp_path
        self.options = {"key_prefix": prefix, **options}
        self.url = f"pq://127.0.0.1:{server.port}/0"
        self.env = celery_env(
            ROOT,
            PQ_TEST_BROKER=self.url,
            PQ_TEST_OPTIONS=json.dumps(self.options),
            PQ_TEST_RECORD=f"redis://127.0.0.1:{server.port}/0",
            PQ_TEST_PREFIX=prefix,
            PQ_TEST_ACKS_LATE="1" if acks_late else "0",
        )
        self.redis = redis.Redis(port=server.port)
        self.app = Celery("e2e-client", broker=self.url)
        self.app.conf.broker_transport_options = self.options
        self.app.conf.task_default_queue = "q"
        self.workers = []

    def queue(self, name="q"):
        return open_queue(self.redis, name, QueueSettings(key_prefix=self.prefix), declare=False)

    def send(self, name, *args, **kw):
        return self.app.send_task(name, args=args, queue="q", **kw)

    def records(self, kind):
        return [json.loads(x) for x in self.redis.lrange(f"{self.prefix}:rec:{kind}", 0, -1)]

    def worker(self, name, *extra, gossip=False, may_die=False):
        """A worker of tests.e2e.app on queue q, solo (``extra``: more of its arguments, a ``-Q``
        or ``-P`` of their own instead of those), once ready."""
        proc = start_worker(
            "tests.e2e.app",
            cwd=ROOT,
            env=self.env,
            name=name,
            queues=None if "-Q" in extra else "q",
            pool=None if "-P" in extra else "solo",
            gossip=gossip,
            mingle=gossip,
            args=extra,
            log=self.tmp / f"{name}.log",
        )
        self.workers.append(proc)
        return proc.wait_ready(30, may_exit=may_die)

    def kill(self, proc, sig=signal.SIGKILL):
        proc.signal_group(sig)
        proc.wait(timeout=30)

    def close(self):
        stop_workers(self.workers)


@pytest.fixture
def harness(redis_server, key_prefix, tmp_path):
    made = []

    def make(options=None, acks_late=False):
        h = Harness(redis_server, key_prefix, tmp_path, options or {}, acks_late)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.mark.parametrize("order", ["higher_first", "lower_first"])
def test_300_tasks_run_in_exact_priority_order(harness, order):
    h = harness({"priority_order": order})
    rng = random.Random(300)
    sent = [(i, rng.randint(0, 255)) for i in range(300)]
    for i, p in sent:
        h.send("e2e.record", i, p, priority=p)
    h.worker("w1")
    wait_for(lambda: len(h.records("order")) == 300, 60, "300 tasks")
    ran = [tuple(r) for r in h.records("order")]
    sign = -1 if order == "higher_first" else 1
    assert ran == sorted(sent, key=lambda t: (sign * t[1], t[0]))
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "last ack")
    assert h.queue().size() == 0


#: The worker arguments of each pool Celery ships (docs/reliability.md, "Worker pools").
POOLS = {
    "solo": (),
    "prefork": ("-P", "prefork", "-c", "2"),
    "threads": ("-P", "threads", "-c", "4"),
    "gevent": ("-P", "gevent", "-c", "20"),
    "eventlet": ("-P", "eventlet", "-c", "20"),
}


@pytest.mark.parametrize(
    ("pool", "task", "acks_late"),
    [
        ("solo", "e2e.sleep", True),
        ("solo", "e2e.sleep", False),
        ("prefork", "e2e.spin", True),
        ("threads", "e2e.spin", True),
        ("gevent", "e2e.spin", True),
        ("eventlet", "e2e.spin", True),
    ],
)
def test_task_longer_than_three_leases_runs_once(harness, pool, task, acks_late):
    # e2e.spin holds the CPU for 3.5 lease lengths without yielding: under gevent and eventlet it
    # blocks the hub, and every greenlet with it (the lease keeper's thread is one there)
    # (2 s leases in a green pool: its keeper's native watch steps in a quarter renewal late, and a
    # loaded machine's scheduling must not eat the rest of a 1 s lease)
    lease = 2 if pool in ("gevent", "eventlet") else 1
    h = harness({"lease_seconds": lease, "sweep_interval": 0.2}, acks_late=acks_late)
    h.send(task, 3.5 * lease, "long")
    h.worker("w1", *POOLS[pool])
    wait_for(lambda: h.records("start"), 20, "long task start")
    # meanwhile another consumer of q sweeps it, as its own worker would: a lease that ran out goes
    # back to waiting (the worker's own sweep is as blocked as its renewals)
    returned = 0
    while not h.records("done"):
        returned += h.queue().reclaim()["returned"]
        time.sleep(0.2)
    time.sleep(1.5)  # a redelivery, if any, would start now
    assert [r[0] for r in h.records("start")] == ["long"]
    assert returned == 0
    assert h.queue().size() == 0


def test_sigkilled_worker_task_runs_again_on_another_worker(harness):
    lease = 2
    h = harness({"lease_seconds": lease, "sweep_interval": 0.5}, acks_late=True)
    h.send("e2e.sleep", 3, "victim")
    a = h.worker("wa")
    wait_for(lambda: h.records("start"), 20, "task start on worker A")
    h.kill(a)  # SIGKILL: no shutdown, no ack, no renewals
    killed_at = time.monotonic()
    b = h.worker("wb")
    wait_for(lambda: len(h.records("start")) == 2, lease + 10, "task start on worker B")
    recovery = time.monotonic() - killed_at
    first, second = h.records("start")
    assert first[1] == a.pid and second[1] == b.pid
    assert (first[2], second[2]) == (1, 2)  # delivery count raised
    assert recovery <= lease + 5, recovery
    wait_for(lambda: h.records("done"), 20, "task done on worker B")
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "ack")


def test_task_that_always_crashes_its_worker_ends_in_dead_letter_queue(harness):
    h = harness({"lease_seconds": 1, "sweep_interval": 0.2, "max_deliveries": 2}, acks_late=True)
    h.send("e2e.crash", "boom")
    for n in range(2):
        w = h.worker(f"crash{n}", may_die=True)
        wait_for(lambda: w.poll() is not None, 20, f"worker {n} to die")
    assert len(h.records("crash")) == 2
    h.worker("sweeper")  # a live consumer's sweep finds the expired lease: no deliveries left
    wait_for(lambda: h.queue().stats()["dead"] == 1, 10, "dead-lettering")
    [dead] = h.queue().dead.peek()
    assert dead.dead_reason == "max_deliveries"
    assert decode(dead.payload)["headers"]["task"] == "e2e.crash"
    assert len(h.records("crash")) == 2  # not delivered a third time
    assert h.queue().size() == 0 and h.queue().stats()["leased"] == 0


def test_retry_with_same_task_id_while_first_delivery_is_leased(harness):
    h = harness({"lease_seconds": 5}, acks_late=True)
    res = h.send("e2e.retry_once", "r", 1.0)
    h.worker("w1")
    wait_for(lambda: len(h.records("retry_done")) == 2, 30, "both deliveries")
    runs = h.records("retry")
    assert [r[1] for r in runs] == [res.id, res.id]  # one task id, two deliveries
    assert sorted(r[2] for r in runs) == [0, 1]
    wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 10, "queue to drain")


def test_a_task_sent_again_on_purpose_runs_every_time(harness):
    # Given a worker, and a task sent twice at once with one task id and the same arguments
    h = harness()
    h.worker("w1")
    h.send("e2e.record", "report-42", task_id="report-42")
    h.send("e2e.record", "report-42", task_id="report-42")
    wait_for(lambda: len(h.records("order")) == 2, 30, "both sends to run")
    wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 10, "both acked")
    # When it is sent a third time, after the first two ran and were acked
    h.send("e2e.record", "report-42", task_id="report-42")
    # Then it runs a third time: no send is ever taken for a retry of another
    wait_for(lambda: len(h.records("order")) == 3, 30, "the third send to run")
    assert [r[0] for r in h.records("order")] == ["report-42"] * 3
    wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 10, "queue to drain")


def celery_inspect(env, worker, *args):
    """``celery inspect *args`` of one named worker: it returns once that worker answered,
    instead of waiting out the timeout for workers it does not know of."""
    command = ["inspect", *args, "--timeout", "5", "-d", f"{worker}@{os.uname().nodename}"]
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_inspect_ping_and_control_answer_through_the_transport(harness):
    h = harness()
    h.worker("pingme", gossip=True)
    out = celery_inspect(h.env, "pingme", "ping")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pong" in out.stdout and "pingme@" in out.stdout
    out = celery_inspect(h.env, "pingme", "active_queues")
    assert out.returncode == 0 and "'name': 'q'" in out.stdout, out.stdout + out.stderr


def test_worker_goes_on_after_redis_restarts_and_nothing_acknowledged_is_lost(key_prefix, tmp_path):
    from celery_pq.testing import RedisServer

    # Given a Redis that keeps its data across a restart (AOF, fsync always)
    with RedisServer(config={"appendonly": "yes", "appendfsync": "always"}) as server:
        h = Harness(server, key_prefix, tmp_path, {"lease_seconds": 3, "sweep_interval": 0.2}, acks_late=True)
        try:
            for i in range(20):
                h.send("e2e.record", i, 1, priority=1)
            h.worker("w1")
            wait_for(lambda: len(h.records("order")) == 20, 30, "first batch")
            # When Redis restarts under a live worker, with work queued while it was down
            for i in range(20, 40):
                h.send("e2e.record", i, 1, priority=1)
            server.restart()
            for i in range(40, 60):
                h.send("e2e.record", i, 1, priority=1)
            # Then the worker reconnects and every published task runs
            wait_for(lambda: {r[0] for r in h.records("order")} >= set(range(60)), 60, "all 60 tasks after restart")
            wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 20, "queue to drain")
        finally:
            h.close()


def test_worker_events_reach_an_event_receiver(harness):
    import threading

    h = harness()
    h.worker("ev", "-E")
    seen = []

    def listen():
        with h.app.connection_for_read() as conn:
            recv = h.app.events.Receiver(conn, handlers={"*": on_event})
            listen.recv = recv
            recv.capture(limit=None, timeout=None, wakeup=False)

    def on_event(event):
        seen.append(event["type"])
        if event["type"] == "task-succeeded":
            listen.recv.should_stop = True

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    time.sleep(1.0)  # the receiver subscribes
    h.send("e2e.record", 1, 0)
    wait_for(lambda: "task-succeeded" in seen, 20, "task events")
    assert "task-received" in seen and "task-started" in seen


def test_celery_pq_stats_command(harness):
    h = harness()
    for p in (5, 5, 200):
        h.send("e2e.record", 0, p, priority=p)
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", "stats", "--json", "q"],
        cwd=ROOT,
        env=h.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["queue"] == "q" and row["waiting"] == 3 and row["per_priority"] == {"200": 1, "5": 2}
    text = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", "stats"],
        cwd=ROOT,
        env=h.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = [line.split() for line in text.stdout.splitlines()]
    assert ["q", "3", "0", "0", "0", "no"] in [r[:6] for r in rows], text.stdout + text.stderr  # queue, waiting, ...


def test_fair_delivery_small_tenants_are_not_starved(harness):
    # Acceptance 1: A queues 2,000, then B and C 20 each; one solo worker, prefetch 1
    h = harness({"fair_key": "tenant"})
    for tenant, n in (("A", 2000), ("B", 20), ("C", 20)):
        for i in range(n):
            h.send("e2e.tenant_record", tenant, i, headers={"tenant": tenant})
    h.worker("w1")
    wait_for(lambda: len(h.records("tenant")) >= 100, 60, "first 100 deliveries")
    order = [t for t, _ in h.records("tenant")]
    last_b = max(i for i, t in enumerate(order[:100]) if t == "B")
    last_c = max(i for i, t in enumerate(order[:100]) if t == "C")
    assert last_b < 66 and last_c < 66, (last_b, last_c)


def test_urgent_pool_is_not_held_up_by_a_bulk_backlog(harness):
    # Acceptance 9: an urgent pool on q[>=200] and a bulk pool on q, 5,000 low-priority tasks
    h = harness()
    for i in range(5000):
        h.send("e2e.sleep", 0.2, f"bulk{i}", priority=1)
    bulk = h.worker("bulk")
    urgent = h.worker("urgent", "-Q", "q[>=200]")
    wait_for(lambda: h.records("start"), 20, "bulk work under way")
    sent = time.time()
    h.send("e2e.stamp", "urgent", priority=250)
    wait_for(lambda: h.records("stamp"), 10, "urgent task")
    [(tag, pid, started)] = h.records("stamp")
    # The urgent pool is woken at once; the bulk pool, which consumes all of q, may still win the
    # race when it pops right after the publish (it takes the best entry: the urgent one). Either
    # way the urgent task is not served behind the backlog (1,000 s of bulk work): it starts
    # within a few bulk task-durations, while the backlog is still there.
    assert pid in (urgent.pid, bulk.pid)
    assert started - sent < 1.0
    assert h.queue().size() > 4000


def test_a_decompression_bomb_in_the_queue_is_dead_lettered_and_the_worker_goes_on(harness):
    """A 9.6 KB entry whose zstd frame declares 300 MB, written straight into the queue's hash
    (no producer's checks), is set aside within the pop that takes it; the worker's peak memory
    grows by under 100 MB (inflating it would take 300 MB), it stays up, and runs the next task."""
    try:
        from support.bombs import zstd_bomb
    except ImportError:  # collected with the repository root on sys.path instead of tests/
        from tests.support.bombs import zstd_bomb
    from celery_pq.storage.ids import encode_id

    h = harness()
    w = h.worker("w1")
    h.send("e2e.stamp", "before")
    wait_for(lambda: h.records("stamp"), 30, "a first task")

    def peak_rss_kb():
        with open(f"/proc/{w.pid}/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM")).split()[1])

    peak_before = peak_rss_kb()
    # Given the bomb in the queue, ahead of a good task: a placeholder entry inserted while the
    # queue is paused, its payload then replaced by a raw HSET (its entry header kept)
    q = h.queue()
    q.pause()
    q.insert(b"placeholder", 255, id="bomb")
    field = encode_id("bomb")
    header, bar, _ = h.redis.hget(q.keys.entries, field).partition(b"|")
    assert bar
    h.redis.hset(q.keys.entries, field, header + b"|" + zstd_bomb())
    h.send("e2e.stamp", "after")
    q.resume()
    # When the worker takes them: the good task after the bomb runs
    wait_for(lambda: [r[0] for r in h.records("stamp")] == ["before", "after"], 30, "the task after the bomb")
    # Then the bomb is in q.dead as malformed, unchanged; the worker is alive and said why
    [dead] = q.dead.peek(5)
    assert (dead.id, dead.dead_reason) == ("bomb", "malformed") and dead.payload == zstd_bomb()
    assert w.poll() is None
    assert b"declares 314572800 bytes" in w.log_path.read_bytes()
    assert peak_rss_kb() - peak_before < 100 * 1024  # KiB
    assert q.size() == 0 and q.stats()["leased"] == 0


def test_countdown_tasks_wait_in_the_broker_not_in_the_worker(harness):
    # Acceptance 10
    h = harness({"sweep_interval": 0.5})
    w = h.worker("w1")

    def inspect(what):
        out = celery_inspect(h.env, "w1", what, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    def rss_kb():
        with open(f"/proc/{w.pid}/status") as f:
            return int(next(line for line in f if line.startswith("VmRSS")).split()[1])

    rss_before = rss_kb()
    with h.app.producer_or_acquire() as producer:
        for i in range(10_000):
            h.app.send_task("e2e.record", args=(i, 0), queue="q", countdown=3600, producer=producer)
    assert h.queue().stats()["delayed"] == 10_000
    time.sleep(2)
    assert all(v == [] for v in inspect("scheduled").values())
    assert all(v == [] for v in inspect("reserved").values())
    assert rss_kb() - rss_before < 20_000  # KiB: the worker holds none of them
    sent = time.time()
    h.send("e2e.stamp", "soon", countdown=2)
    wait_for(lambda: h.records("stamp"), 10, "countdown=2 task")
    [(_, _, started)] = h.records("stamp")
    assert 1.9 <= started - sent <= 3.0, started - sent
    assert h.queue().stats()["delayed"] == 10_000


def test_tenant_concurrency_cap_with_a_prefork_pool(harness):
    # Acceptance 11: at most 2 of A's tasks at once while B keeps flowing
    h = harness({"fair_key": "tenant", "tenant_concurrency": 2}, acks_late=True)  # the cap counts leases
    for i in range(12):
        h.send("e2e.tenant_work", "A", 0.3, headers={"tenant": "A"})
    for i in range(12):
        h.send("e2e.tenant_work", "B", 0.3, headers={"tenant": "B"})
    h.worker("pool", "-P", "prefork", "-c", "4")
    wait_for(lambda: len(h.records("concurrency")) == 24, 60, "24 tasks")
    peaks = {}
    for tenant, running in h.records("concurrency"):
        peaks[tenant] = max(peaks.get(tenant, 0), running)
    assert peaks == {"A": 2, "B": 2}
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "acks")


def test_a_prefetched_batch_keeps_its_leases_while_earlier_tasks_run(harness):
    # A solo worker with a prefetch window of 4 pops 4 at once; the 3 waiting behind the running
    # task must have their leases renewed too, or they run twice (once here, once redelivered).
    h = harness({"lease_seconds": 2, "sweep_interval": 0.2}, acks_late=True)
    for i in range(4):
        h.send("e2e.sleep", 1.5, f"t{i}")
    h.worker("batch", "--prefetch-multiplier", "4")
    wait_for(lambda: len(h.records("done")) >= 4, 40, "4 tasks")
    time.sleep(2.5)  # a redelivery, if any, would start now
    starts = [r[0] for r in h.records("start")]
    assert sorted(starts) == ["t0", "t1", "t2", "t3"], starts
    assert [r[2] for r in h.records("start")] == [1, 1, 1, 1]  # every one a first delivery


def test_a_running_acks_late_task_keeps_its_lease_when_the_connection_is_lost(key_prefix, tmp_path):
    from celery_pq.testing import RedisServer

    # Given a prefork worker running a long acks_late task, its consumer blocked for more work
    with RedisServer() as server:
        h = Harness(server, key_prefix, tmp_path, {"lease_seconds": 3, "sweep_interval": 0.2}, acks_late=True)
        try:
            h.send("e2e.sleep", 4, "running")
            w = h.worker("w1", "-P", "prefork", "-c", "2")
            wait_for(lambda: h.records("start"), 20, "task start")
            time.sleep(0.5)
            # When every connection of the worker is cut (Celery reconnects, and kombu tears the
            # old connection down, giving back the messages it holds)
            assert h.redis.client_kill_filter(_type="normal", skipme=True) >= 1
            # Then the running task is not given back: it runs once, and its ack goes through
            wait_for(lambda: h.records("done"), 20, "task done")
            time.sleep(3.5)  # a second start, if any, would come now
            starts = [(r[0], r[2]) for r in h.records("start")]
            if celery.VERSION[:3] < (5, 6, 3):
                # (Celery before 5.6.3 forgets the prefork pool's running jobs at a lost connection:
                # no ack would ever come, so the task is given back and runs again, as with kombu)
                assert starts == [("running", 1), ("running", 1)]
            else:
                assert starts == [("running", 1)]
            wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 10, "its ack")
            # and the worker goes on with new work on its new connection
            h.send("e2e.stamp", "after")
            wait_for(lambda: h.records("stamp"), 20, "a task after the reconnect")
            assert b"Connection to broker lost" in w.log_path.read_bytes()
        finally:
            h.close()


def test_a_task_celery_cancels_at_a_lost_connection_is_not_kept_leased(key_prefix, tmp_path):
    """A lease kept across a lost connection is renewed only while its task runs: one whose
    delivery ended without an ack comes back when its lease expires, not never."""
    from celery_pq.testing import RedisServer

    # Given a prefork worker that cancels its running acks_late tasks at a lost connection
    with RedisServer() as server:
        h = Harness(server, key_prefix, tmp_path, {"lease_seconds": 3, "sweep_interval": 0.2}, acks_late=True)
        h.env["PQ_TEST_CANCEL_ON_LOSS"] = "1"
        try:
            h.send("e2e.sleep", 4, "cancelled")
            h.worker("w1", "-P", "prefork", "-c", "2")
            wait_for(lambda: h.records("start"), 20, "task start")
            time.sleep(0.5)
            # When every connection of the worker is cut (Celery cancels the task: no ack comes)
            assert h.redis.client_kill_filter(_type="normal", skipme=True) >= 1
            # Then its lease runs out and it is delivered again, run, and acked: nothing stays leased
            # (before Celery 5.6.3 it is given back at the cut, uncounted: see the test above)
            wait_for(lambda: len(h.records("start")) >= 2, 20, "a second delivery")
            again = 1 if celery.VERSION[:3] < (5, 6, 3) else 2
            assert [(r[0], r[2]) for r in h.records("start")][1] == ("cancelled", again)
            wait_for(lambda: h.queue().size() + h.queue().stats()["leased"] == 0, 20, "its ack")
        finally:
            h.close()


def test_every_field_a_task_carries_reaches_the_worker_from_the_compact_form(harness):
    """Args, kwargs, eta, expires, retries, chains (parent_id, root_id) and groups (group,
    group_index) survive the compact stored form."""
    from datetime import datetime, timedelta

    from celery import chain, group

    h = harness()
    echo = h.app.signature("e2e.echo")
    expires = datetime.now(UTC) + timedelta(hours=1)
    sent = datetime.now(UTC)
    plain = echo.clone(args=("order-00000001", 0.5), kwargs={"note": "ü" * 300, "n": [1, None, True]}).apply_async(
        queue="q", priority=9, expires=expires, countdown=1
    )
    retried = echo.clone(args=("again",), kwargs={"retry": True}).apply_async(queue="q")
    chained = chain(echo.clone(args=("first",)), echo.clone()).apply_async(queue="q")
    grouped = group(echo.clone(args=(f"g{i}",)) for i in range(2)).apply_async(queue="q")

    h.worker("w1")
    wait_for(lambda: len(h.records("echo")) >= 7, 60, "7 task runs")
    runs = h.records("echo")
    by_first = {}
    for r in runs:
        by_first.setdefault(r["args"][0] if r["args"] else None, []).append(r)
    [p] = by_first["order-00000001"]
    assert (p["id"], p["args"], p["kwargs"]) == (
        plain.id,
        ["order-00000001", 0.5],
        {"note": "ü" * 300, "n": [1, None, True]},
    )
    assert datetime.fromisoformat(p["expires"]) == expires and p["priority"] == 9
    # held in Redis for its countdown, it reaches the task with the eta it was sent with
    assert timedelta(seconds=1) <= datetime.fromisoformat(p["eta"]) - sent < timedelta(seconds=1.5)
    assert by_first["again"][0]["eta"] is None
    assert [r["retries"] for r in by_first["again"]] == [0, 1] and {r["id"] for r in by_first["again"]} == {retried.id}
    [first] = [r for r in runs if r["id"] == chained.parent.id]
    [second] = [r for r in runs if r["id"] == chained.id]  # the chain's last task gets the first's result
    assert first["args"] == second["args"] == ["first"] and second["parent_id"] == first["id"]
    assert first["root_id"] == second["root_id"] == first["id"]
    g = [by_first[f"g{i}"][0] for i in range(2)]
    assert {r["group"] for r in g} == {grouped.id} and sorted(r["group_index"] for r in g) == [0, 1]


def test_task_past_its_expires_never_runs_and_is_dead_lettered(harness):
    h = harness({"event_log": 1000})
    # Given a task whose expires passes while it waits (no worker yet), and one without
    h.send("e2e.record", "expired", 1, expires=1)
    h.send("e2e.record", "live", 2)
    time.sleep(1.5)
    # When a worker starts
    h.worker("wx")
    wait_for(lambda: h.records("order"), 20, "the live task")
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "its ack")
    # Then only the live task ran: the broker never delivered the expired one
    assert [r[0] for r in h.records("order")] == ["live"]
    q = h.queue()
    [dead] = q.dead.peek(5)
    assert dead.dead_reason == "expired"
    assert decode(dead.payload)["headers"]["task"] == "e2e.record"
    assert q.counters()["expired"] == 1
    assert [e["r"] for e in q.events() if e["e"] == "dead"] == ["expired"]
    assert q.size() == 0


def test_worker_still_checks_expires_of_a_task_delivered_in_time(harness):
    h = harness()
    # Given a worker busy with a long task (in its one pool process) and a task that expires
    # while it waits in the worker's prefetch (delivered by the broker before its expiry)
    h.worker("wy", "-P", "prefork", "-c", "1")
    h.send("e2e.sleep", 4, "busy")
    wait_for(lambda: h.records("start"), 20, "the long task")
    h.send("e2e.record", "late", 1, expires=2)  # (2 s: the prefetch takes it well before)
    wait_for(lambda: h.queue().stats()["waiting"] == 0, 10, "the prefetch")
    # Then Celery's own check in the worker revokes it as expired: it never runs, and the
    # broker counted no expiry (it delivered it in time)
    wait_for(lambda: h.records("done"), 20, "the long task done")
    time.sleep(1.0)
    assert h.records("order") == []
    assert h.queue().counters()["expired"] == 0
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "the revoked task's ack")
