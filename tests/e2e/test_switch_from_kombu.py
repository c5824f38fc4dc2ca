"""The switch-over of a running system from kombu's Redis transport to celery-pq
(docs/migrating.md), under a producer that never stops: every task runs, none twice.

Three redis-server processes of the test's own: the old broker (kombu's ``redis://``), the new
one (``pq://``) and the result store, where each run of a task INCRs ``runs:<task id>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery

import celery_pq  # noqa: F401  (registers pq://)
from celery_pq.testing import RedisServer, celery_env, start_worker, stop_workers, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


class Producer(threading.Thread):
    """Sends switch.count without a pause, to whichever broker ``app`` is at the moment,
    priorities 0..9 in turn; those of priority 0 (served first by kombu's transport) with an
    ETA 3 s later: an old worker holds them unacked, celery-pq keeps them delayed."""

    def __init__(self, app: Celery):
        super().__init__(daemon=True)
        self.app = app
        self.sent: list[str] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            n = 0
            while not self.stopping.is_set():
                app = self.app  # (switched by the test between two sends)
                eta = datetime.now(UTC) + timedelta(seconds=3) if n % 10 == 0 else None
                r = app.send_task("switch.count", args=(n,), queue="q", priority=n % 10, eta=eta)
                self.sent.append(r.id)
                n += 1
                time.sleep(0.004)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_switch_over_under_a_producer_that_never_stops(tmp_path):
    old_redis, new_redis, results = RedisServer(), RedisServer(), RedisServer()
    workers = []
    producer = None
    try:
        old_url, new_url = old_redis.url, f"pq://127.0.0.1:{new_redis.port}/0"
        store = results.client()

        def worker(name, broker, sleep):
            env = celery_env(ROOT, PQ_SWITCH_BROKER=broker, PQ_SWITCH_RESULTS=results.url, PQ_SWITCH_SLEEP=str(sleep))
            proc = start_worker("tests.e2e.switch_app", cwd=ROOT, env=env, name=name, log=tmp_path / f"{name}.log")
            workers.append(proc)
            return proc.wait_ready(30)

        def app_on(url):
            app = Celery("switch-producer", broker=url)
            app.conf.task_default_queue = "q"
            return app

        def import_kombu(*extra):
            cmd = [
                sys.executable,
                "-m",
                "celery_pq",
                "--broker",
                new_url,
                "import-kombu",
                "q",
                "--from",
                old_url,
                "--json",
            ]
            done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=60, env=celery_env(ROOT))
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)["queues"][0]

        # Given: a system on kombu's Redis transport, its worker slower than its producer
        old = worker("old", old_url, 0.02)
        producer = Producer(app_on(old_url))
        producer.start()
        wait_for(lambda: old_redis.client().llen("q") >= 100, 30, "a backlog in kombu's lists")
        # When: celery-pq workers start, the producer is pointed at pq://, the backlog imported
        worker("new1", new_url, 0)
        worker("new2", new_url, 0)
        producer.app = app_on(new_url)
        first = import_kombu("--visibility-timeout", "3600")  # the old worker's (kombu's default)
        # the old worker retired (warm shutdown: kombu restores what it held, ETA tasks among
        # them), and what it gave back imported; nothing of kombu's transport runs any more
        old.stop()
        second = import_kombu("--include-unacked")
        time.sleep(1.0)  # the producer goes on for a while on pq:// alone
        producer.stopping.set()
        producer.join(10)
        assert producer.error is None, producer.error
        sent = producer.sent

        # Then: every task runs, none twice
        def runs():
            with store.pipeline() as p:
                for tid in sent:
                    p.get(f"runs:{tid}")
                return [int(v or 0) for v in p.execute()]

        wait_for(lambda: all(runs()), 40, "every task to run")
        time.sleep(1.0)  # a second run would show by now
        counts = runs()
        assert counts.count(0) == 0 and max(counts) == 1, (counts.count(0), max(counts))
        assert len(sent) > 300
        # the old broker holds nothing of q any more
        kombu = old_redis.client()
        assert sum(kombu.llen(k) for k in (b"q", b"q\x06\x163", b"q\x06\x166", b"q\x06\x169")) == 0
        assert kombu.hlen("unacked") == 0
        assert first["moved"] > 0, first
        assert first["staged"] == second["staged"] == 0 and first["repeats"] == second["repeats"] == 0
    finally:
        if producer is not None:
            producer.stopping.set()
        stop_workers(workers)
        for server in (old_redis, new_redis, results):
            server.close()
