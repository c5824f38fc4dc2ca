"""Unique tasks, debounce and throttle by key (docs/unique.md), end to end: real Celery worker
subprocesses, many producers publishing at once (threads here and producer processes), and a
worker SIGKILLed while it holds a unique task.

One fleet of three solo workers (acks late, prefetch 1, 3 s leases) serves every test of the
module, each mode on a queue of its own and each test on keys of its own. Runs are counted from
what the task records (task id, key, argument, delivery number); the producers' view from
``celery_pq.publish_outcome``. Every count checked is one the design promises exactly; no check
is on how long anything took, only on the order the semantics give (a debounced run starts no
sooner than its delay after the last publish).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from celery import Celery

import celery_pq
from celery_pq import PriorityQueue
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import celery_env, start_worker, stop_workers, wait_for

from .unique_app import publish_all

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.e2e.unique_app"
LEASE = 3.0  # seconds: short, so a SIGKILLed worker's lease runs out within the test
DEBOUNCE = 2.0  # the debounce delay of u_debounce (seconds)
PERIOD = 2.0  # the throttle period of u_throttle (seconds)
QUEUES = ["u_wait", "u_active", "u_replace", "u_debounce", "u_throttle", "u_crash"]
OPTIONS = {
    "lease_seconds": LEASE,
    "sweep_interval": 0.5,
    "event_log": 100_000,
    # u_debounce and u_throttle take mode and seconds from the options (their messages carry only
    # the key); the other queues name the mode in each message's headers
    "unique_mode": {"u_debounce": "debounce", "u_throttle": "throttle", "*": "while_waiting"},
    "unique_seconds": {"u_debounce": DEBOUNCE, "u_throttle": PERIOD, "*": 60},
}
WORKERS = 3


class Fleet:
    """The module's workers, its producer app, and readers of what the tasks recorded."""

    def __init__(self, server, prefix: str, tmp: Path):
        self.prefix = prefix
        self.tmp = tmp
        self.options = {"key_prefix": prefix, **OPTIONS}
        url = f"pq://127.0.0.1:{server.port}/0"
        self.env = celery_env(
            ROOT,
            PQ_TEST_BROKER=url,
            PQ_TEST_OPTIONS=json.dumps(self.options),
            PQ_TEST_RECORD=f"redis://127.0.0.1:{server.port}/0",
            PQ_TEST_PREFIX=prefix,
        )
        self.redis = redis.Redis(port=server.port)
        self.client = Celery("unique-client", broker=url)
        self.client.conf.broker_transport_options = self.options
        self.client.conf.broker_pool_limit = 16  # one producer connection per publishing thread
        self.workers: list = []
        self.started = 0

    # workers
    def ensure(self, n: int = WORKERS) -> None:
        """``n`` workers running: start as many as are missing (one a test killed), then wait
        for each to be ready."""
        self.workers = [w for w in self.workers if w.poll() is None]
        fresh = []
        while len(self.workers) + len(fresh) < n:
            self.started += 1
            fresh.append(
                start_worker(
                    APP,
                    cwd=ROOT,
                    env=self.env,
                    name=f"u{self.started}",
                    queues=",".join(QUEUES),
                    log=self.tmp / f"u{self.started}.log",
                )
            )
        for w in fresh:
            w.wait_ready(60)
        self.workers += fresh

    def worker_of(self, pid: int):
        [worker] = [w for w in self.workers if w.pid == pid]
        return worker

    def close(self) -> None:
        self.redis.set(f"{self.prefix}:go-all", 1)  # a held run a failed test left ends now
        stop_workers(self.workers)
        self.client.close()

    # publishing
    def publish(self, queue: str, calls: list, threads: int = 8) -> list[list]:
        """``calls`` (``[key, arg, headers, hold]``) published from ``threads`` threads at once."""
        return publish_all(self.client, queue, calls, threads)

    def burst(self, queue: str, calls: list, processes: int = 2, threads: int = 8) -> list[list]:
        """``calls`` published at once by ``processes`` producer processes (a share each, 4
        threads apiece) and ``threads`` threads of this one (the rest), all starting together;
        the outcome rows of all of them."""
        shares = [calls[i :: processes + 1] for i in range(processes + 1)]
        start_at = time.time() + 2.0  # the producer processes import Celery meanwhile
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", APP, queue, json.dumps(share), str(start_at)],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for share in shares[1:]
        ]
        time.sleep(max(0.0, start_at - time.time()))
        rows = self.publish(queue, shares[0], threads)
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err[-3000:]
            rows += json.loads(out.strip().splitlines()[-1])
        return rows

    # what the tasks recorded
    def records(self, kind: str, key: str | None = None) -> list[dict]:
        got = [json.loads(x) for x in self.redis.lrange(f"{self.prefix}:rec:{kind}", 0, -1)]
        return [r for r in got if key is None or r["key"] == key]

    def runs(self, key: str) -> list[tuple[str, object]]:
        """(task id, argument) of each run of ``key`` that ended, in the order they ended."""
        return [(r["id"], r["arg"]) for r in self.records("done", key)]

    def go(self, *keys: str) -> None:
        """Let the held runs of ``keys`` (and any later run of them) end."""
        for key in keys:
            self.redis.set(f"{self.prefix}:go:{key}", 1)

    def queue(self, name: str) -> PriorityQueue:
        return open_queue(self.redis, name, QueueSettings(key_prefix=self.prefix), declare=False)

    def idle(self, name: str) -> None:
        """Until ``name`` has nothing waiting, delayed or leased: nothing more of it can run."""

        def empty():
            s = self.queue(name).stats()
            return s["waiting"] + s["delayed"] + s["leased"] == 0

        wait_for(empty, 30, f"{name} to be empty")

    def pq_stats(self, *names: str) -> list[dict]:
        """What ``celery -A APP pq stats --json NAMES`` prints, read."""
        out = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "pq", "stats", "--json", *names],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    def events(self, name: str, kind: str, keys: list[str]) -> list[dict]:
        """The events ``kind`` of queue ``name``, each of which names one of ``keys`` (in ``r``)."""
        got = [e for e in self.queue(name).events() if e["e"] == kind]
        assert all(e["r"] in keys for e in got), got[:5]
        return got


@pytest.fixture(scope="module")
def fleet(redis_server, tmp_path_factory):
    prefix = "pqu" + str(time.time_ns())[-10:]
    made = Fleet(redis_server, prefix, tmp_path_factory.mktemp("unique"))
    try:
        made.ensure()
        yield made
    finally:
        made.close()
        client = redis_server.client()
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i : i + 500])
        client.close()


@pytest.fixture
def f(fleet):
    fleet.ensure()  # a test before may have killed one
    return fleet


def by_kind(rows: list[list], key: str) -> dict[str, list[list]]:
    """The outcome rows of ``key``, grouped by kind; every row's outcome is known and names it."""
    out: dict[str, list[list]] = {}
    for row in rows:
        requested, kind, standing, row_key = row
        assert kind is not None, f"no publish_outcome for {requested}"
        if row_key == key:
            out.setdefault(kind, []).append(row)
    return out


def test_publish_outcome_of_an_unknown_id_is_none():
    assert celery_pq.publish_outcome("no-such-task-id") is None


def test_while_waiting_a_burst_runs_once_and_a_publish_after_the_start_runs_again(f):
    q, keys, n = f.queue("u_wait"), ["ww-a", "ww-b"], 60
    # Given a paused queue (nothing of it can start), and a burst of n publishes per key from two
    # producer processes and eight threads at once; the mode is the options' default
    q.pause()
    rows = f.burst("u_wait", [[k, i, {"pq_unique": k}, True] for i in range(n) for k in keys])
    # Then one publish of each key was stored, and every other one merged into it
    first = {}
    for k in keys:
        kinds = by_kind(rows, k)
        assert sorted(kinds) == ["merged", "stored"] and len(kinds["stored"]) == 1, kinds.keys()
        [(stored_id, _, standing, _)] = kinds["stored"]
        assert standing == stored_id
        assert len(kinds["merged"]) == n - 1 and {r[2] for r in kinds["merged"]} == {stored_id}
        first[k] = stored_id
    # When the queue is resumed: each key runs once, and its run is held running
    q.resume()
    wait_for(lambda: all(f.records("start", k) for k in keys), 30, "both keys to start")
    # a second burst while they run (the queue paused again, so nothing of it starts yet)
    q.pause()
    rows2 = f.publish("u_wait", [[k, f"second{i}", {"pq_unique": k}, True] for i in range(n) for k in keys])
    second = {}
    for k in keys:
        kinds = by_kind(rows2, k)
        [(stored_id, _, standing, _)] = kinds["stored"]  # the first is leased: a new one is stored
        assert standing == stored_id and stored_id != first[k]
        assert len(kinds["merged"]) == n - 1 and {r[2] for r in kinds["merged"]} == {stored_id}
        second[k] = stored_id
    f.go(*keys)
    q.resume()
    f.idle("u_wait")
    # Then each key ran exactly twice: the stored publish of each burst, once each
    for k in keys:
        assert sorted(r[0] for r in f.runs(k)) == sorted([first[k], second[k]])  # (both end at go)
        assert [r["id"] for r in f.records("start", k)] == [first[k], second[k]]
    merged = 2 * len(keys) * (n - 1)
    assert q.counters()["unique_merged"] == merged
    assert len(f.events("u_wait", "merged", keys)) == merged


def test_while_active_a_burst_while_one_runs_adds_no_run(f):
    q, keys, n = f.queue("u_active"), ["wa-a", "wa-b"], 40
    headers = {k: {"pq_unique": k, "pq_unique_mode": "while_active"} for k in keys}
    # Given one stored publish per key (a burst of n, the queue paused), each now running, held
    q.pause()
    rows = f.publish("u_active", [[k, i, headers[k], True] for i in range(n) for k in keys])
    running = {k: by_kind(rows, k)["stored"][0][0] for k in keys}
    q.resume()
    wait_for(lambda: all(f.records("start", k) for k in keys), 30, "both keys to start")
    # When a burst of n more per key comes from two processes and eight threads while they run
    # (the queue not paused: an idle worker would take anything stored)
    rows = f.burst("u_active", [[k, f"during{i}", headers[k], True] for i in range(n) for k in keys])
    # Then none was stored: each merged into the running one
    for k in keys:
        kinds = by_kind(rows, k)
        assert list(kinds) == ["merged"] and {r[2] for r in kinds["merged"]} == {running[k]}
    # and `pq stats` shows the two keys held, and the publishes merged so far
    [row] = f.pq_stats("u_active")
    assert row["unique"]["keys"] == len(keys) and row["unique"]["merged"] == len(keys) * (2 * n - 1), row
    # and once the runs end (and are acked), the key is free: the next publish is stored and runs
    f.go(*keys)
    f.idle("u_active")
    later = f.publish("u_active", [[k, "later", headers[k], False] for k in keys])
    for k in keys:
        [(later_id, kind, standing, _)] = [r for r in later if r[3] == k]
        assert (kind, standing) == ("stored", later_id)
    f.idle("u_active")
    for k in keys:
        later_id = next(r[0] for r in later if r[3] == k)
        assert [r[0] for r in f.runs(k)] == [running[k], later_id]
        assert [r["id"] for r in f.records("start", k)] == [running[k], later_id]
    assert q.counters()["unique_merged"] == len(keys) * (2 * n - 1)
    assert len(f.events("u_active", "merged", keys)) == len(keys) * (2 * n - 1)


def test_replace_the_last_publish_runs_once_with_its_arguments(f):
    q, key, n = f.queue("u_replace"), "rp-a", 60
    headers = {"pq_unique": key, "pq_unique_mode": "replace"}
    # Given a paused queue and a burst of n publishes of one key from eight threads, then one
    # more, the last, from this thread
    q.pause()
    rows = f.publish("u_replace", [[key, i, headers, False] for i in range(n)])
    [last] = f.publish("u_replace", [[key, "last", headers, False]])
    rows.append(last)
    # Then the first was stored and each later one replaced the one waiting; each stands for itself
    kinds = by_kind(rows, key)
    assert sorted(kinds) == ["replaced", "stored"] and len(kinds["stored"]) == 1
    assert len(kinds["replaced"]) == n and last[1] == "replaced"
    assert all(r[2] == r[0] for r in rows)
    assert q.stats()["waiting"] == 1
    # When the queue is resumed: the last one's arguments run, once
    q.resume()
    f.idle("u_replace")
    assert f.runs(key) == [(last[0], "last")]
    assert len(f.records("start", key)) == 1
    assert q.counters()["unique_replaced"] == n
    assert len(f.events("u_replace", "replaced", [key])) == n


def test_debounce_a_burst_runs_once_with_the_last_arguments_after_the_delay(f):
    keys, n = ["db-a", "db-b"], 40
    # Given a burst of n publishes per key from eight threads (mode and delay from the options:
    # the messages carry only the key), then a last one per key from this thread
    rows = f.publish("u_debounce", [[k, i, {"pq_unique": k}, False] for i in range(n) for k in keys])
    sent_last = time.time()
    last = f.publish("u_debounce", [[k, f"last-{k}", {"pq_unique": k}, False] for k in keys], threads=1)
    rows += last
    # Then the first of each key was stored, and each later one debounced the waiting one
    for k in keys:
        kinds = by_kind(rows, k)
        assert sorted(kinds) == ["debounced", "stored"] and len(kinds["stored"]) == 1
        assert len(kinds["debounced"]) == n
    assert all(r[2] == r[0] for r in rows)  # the newest publish stands for the key
    # When the delay has passed: each key ran exactly once, with its last call's arguments, no
    # sooner than the delay after that call
    f.idle("u_debounce")
    for k in keys:
        [(last_id, *_)] = [r for r in last if r[3] == k]
        assert f.runs(k) == [(last_id, f"last-{k}")]
        [start] = f.records("start", k)
        assert start["at"] >= sent_last + DEBOUNCE - 0.05  # (clock granularity)
    assert f.queue("u_debounce").counters()["unique_debounced"] == len(keys) * n
    assert len(f.events("u_debounce", "debounced", keys)) == len(keys) * n


def test_throttle_at_most_one_run_per_period(f):
    q, n = f.queue("u_throttle"), 30
    controlled, steady = "th-a", "th-b"
    headers = {k: {"pq_unique": k} for k in (controlled, steady)}  # mode and period from the options
    stream: list[list] = []

    def publish_steadily(seconds: float = 4.5) -> tuple[float, float]:
        begin = time.time()
        while time.time() - begin < seconds:
            stream.extend(f.publish("u_throttle", [[steady, time.time(), headers[steady], False]] * 4, threads=4))
            time.sleep(0.1)
        return begin, time.time()

    span: list = []
    steady_thread = threading.Thread(target=lambda: span.extend(publish_steadily()))
    steady_thread.start()
    # Given a burst of n publishes of one key from eight threads, then another after the period
    burst1 = f.publish("u_throttle", [[controlled, f"first{i}", headers[controlled], False] for i in range(n)])
    time.sleep(PERIOD + 0.5)
    burst2 = f.publish("u_throttle", [[controlled, f"second{i}", headers[controlled], False] for i in range(n)])
    steady_thread.join()
    # Then one publish of each burst was stored; the others were throttled, pointing at it
    stored = []
    for rows in (burst1, burst2):
        kinds = by_kind(rows, controlled)
        assert sorted(kinds) == ["stored", "throttled"] and len(kinds["stored"]) == 1
        [(stored_id, _, standing, _)] = kinds["stored"]
        assert standing == stored_id and {r[2] for r in kinds["throttled"]} == {stored_id}
        stored.append(stored_id)
    f.idle("u_throttle")
    # and exactly those ran, once each
    assert [r[0] for r in f.runs(controlled)] == stored
    # The steady stream (a publish every ~0.1 s from four threads for ~4.5 s): exactly its
    # stored publishes ran, at least a period apart as Redis stored them, at most one per period
    kept = [r[0] for r in stream if r[1] == "stored"]
    assert all(r[1] in ("stored", "throttled") for r in stream)
    assert sorted(r[0] for r in f.runs(steady)) == sorted(kept)
    stored_ms = sorted(e["ms"] for e in q.events() if e["e"] == "enqueue" and e["id"] in kept)
    assert len(stored_ms) == len(kept)
    assert all(b - a >= PERIOD * 1000 - 1 for a, b in itertools.pairwise(stored_ms))
    begin, end = span
    assert 2 <= len(kept) <= int((end - begin) / PERIOD) + 1
    throttled = sum(1 for r in burst1 + burst2 + stream if r[1] == "throttled")
    assert q.counters()["unique_throttled"] == throttled
    assert len(f.events("u_throttle", "throttled", [controlled, steady])) == throttled


def test_a_task_id_of_the_callers_choosing_is_merged_and_throttled_and_a_retry_still_runs(f):
    """``apply_async(task_id=f"report-{n}")``: a publish of the standing task's own id is no
    retry (Celery's header ``retries`` is not above the standing one's): merged while that task
    runs (while_active), throttled within the period; a real ``Task.retry`` still runs."""
    key, active = "fixed-a", {"pq_unique": "fixed-a", "pq_unique_mode": "while_active"}
    # Given a while_active task published under an id of the caller's, running (held)
    first = f.client.send_task(
        "unique.work", ("fixed-a", "first", True), queue="u_active", task_id="report-a", headers=active
    )
    assert celery_pq.publish_outcome(first).kind == "stored"
    wait_for(lambda: f.records("start", key), 30, "the task to start")
    # When the same id is published again while it runs
    again = f.client.send_task(
        "unique.work", ("fixed-a", "again", True), queue="u_active", task_id="report-a", headers=active
    )
    # Then it is merged into the run, and runs neither beside it nor after it
    out = celery_pq.publish_outcome(again)
    assert (out.kind, out.task_id) == ("merged", "report-a")
    f.go(key)
    f.idle("u_active")
    assert f.runs(key) == [("report-a", "first")] and len(f.records("start", key)) == 1
    # A throttled key: the same id twice within the period is stored once and runs once
    tkey = "fixed-t"
    kinds = []
    for n in range(2):
        sent = f.client.send_task(
            "unique.work", (tkey, n, False), queue="u_throttle", task_id="ping-t", headers={"pq_unique": tkey}
        )
        kinds.append(celery_pq.publish_outcome(sent).kind)
    assert kinds == ["stored", "throttled"]
    f.idle("u_throttle")
    assert f.runs(tkey) == [("ping-t", 0)]
    # A retry of a task holding its key (while_active and throttle): the retry is stored, and runs
    for queue, rkey, headers in (
        ("u_active", "retry-a", {"pq_unique": "retry-a", "pq_unique_mode": "while_active"}),
        ("u_throttle", "retry-t", {"pq_unique": "retry-t"}),
    ):
        f.client.send_task("unique.retry_once", (rkey, "r"), queue=queue, task_id=f"job-{rkey}", headers=headers)
        wait_for(lambda k=rkey: f.runs(k), 30, f"the retry of {rkey} to run")
        starts = [(s["id"], s["retries"], s["unique"]) for s in f.records("start", rkey)]
        assert starts == [(f"job-{rkey}", 0, rkey), (f"job-{rkey}", 1, rkey)]  # (the retry carried the key)
        assert f.runs(rkey) == [(f"job-{rkey}", "r")]


def test_sigkill_of_a_worker_holding_a_while_active_task_does_not_hold_the_key_for_good(f):
    q, key = f.queue("u_crash"), "kill-a"
    headers = {"pq_unique": key, "pq_unique_mode": "while_active"}
    # Given a while_active task running (held) on one of the workers
    [(held, kind, _, _)] = f.publish("u_crash", [[key, "held", headers, True]])
    assert kind == "stored"
    wait_for(lambda: f.records("start", key), 30, "the task to start")
    [start] = f.records("start", key)
    victim = f.worker_of(start["pid"])
    merged = f.publish("u_crash", [[key, f"during{i}", headers, True] for i in range(20)])
    # When its worker is SIGKILLed (no ack, no renewal: its lease runs out)
    victim.signal_group(9)
    victim.wait(30)
    # Then publishes meanwhile still merge: the entry holds its key while its lease runs out
    merged += f.publish("u_crash", [[key, f"dead{i}", headers, True] for i in range(20)])
    # and the entry comes back and runs again on another worker (its second delivery)
    wait_for(lambda: len(f.records("start", key)) == 2, LEASE + 20, "the task's second delivery")
    merged += f.publish("u_crash", [[key, f"again{i}", headers, True] for i in range(20)])
    assert {(r[1], r[2]) for r in merged} == {("merged", held)}
    f.go(key)
    f.idle("u_crash")
    starts = f.records("start", key)
    assert [(s["id"], s["delivery"]) for s in starts] == [(held, 1), (held, 2)]
    assert starts[1]["pid"] != victim.pid
    # It ran to completion exactly once, and then the key was free: a later publish is stored
    assert f.runs(key) == [(held, "held")]
    [(later, kind, standing, _)] = f.publish("u_crash", [[key, "later", headers, False]])
    assert (kind, standing) == ("stored", later)
    f.idle("u_crash")
    assert f.runs(key) == [(held, "held"), (later, "later")]
    assert q.counters()["unique_merged"] == 60
    assert {e["id"] for e in f.events("u_crash", "merged", [key])} == {held}
    assert Counter(e["e"] for e in q.events())["expire"] == 1
