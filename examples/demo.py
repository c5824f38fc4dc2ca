"""``make demo``: a producer and real Celery workers on a real Redis, showing priorities
overtaking a backlog, fair delivery between tenants, and a killed worker's task coming back.

    python -m examples.demo
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import redis
from celery import Celery

import celery_pq  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
LEASE = 3  # seconds: short, so that recovery shows within the demo
CHECKS: list[tuple[str, bool]] = []


def say(text=""):
    print(text, flush=True)


def check(label, ok):
    CHECKS.append((label, ok))
    say(f"  {'PASS' if ok else 'FAIL'}: {label}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def find_or_start_redis():
    """Yield (port, key prefix, description)."""
    prefix = "pqdemo" + uuid.uuid4().hex[:8]
    url = os.environ.get("PQ_DEMO_REDIS_URL")
    if url:
        client = redis.Redis.from_url(url)
        yield client.connection_pool.connection_kwargs["port"], prefix, f"the Redis at {url} (PQ_DEMO_REDIS_URL)"
        _delete_prefix(client, prefix)
        return
    binary = os.environ.get("PQ_REDIS_SERVER") or shutil.which("redis-server")
    if binary:
        tmp = tempfile.mkdtemp(prefix="pq-demo-")
        port = free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            _wait_ping(port)
            yield port, prefix, f"a private redis-server ({binary}) on port {port}"
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        client = redis.Redis(port=6379, socket_connect_timeout=1)
        client.ping()
    except redis.RedisError:
        client = None
    if client is not None:
        try:
            yield 6379, prefix, f"the Redis on 127.0.0.1:6379, keys under {prefix}: (deleted afterwards)"
        finally:
            _delete_prefix(client, prefix)
        return
    raise SystemExit("no Redis: install redis-server (apt-get install redis-server) or set PQ_DEMO_REDIS_URL")


def _wait_ping(port):
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit(f"redis-server on port {port} did not start")


def _delete_prefix(client, prefix):
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.unlink(key)


class Demo:
    def __init__(self, port, prefix, options):
        self.port, self.prefix = port, prefix
        self.options = {"key_prefix": prefix, "lease_seconds": LEASE, "sweep_interval": 0.5, **options}
        self.url = f"pq://127.0.0.1:{port}/0"
        self.redis = redis.Redis(port=port)
        self.env = dict(os.environ, PQ_DEMO_BROKER=self.url, PQ_DEMO_OPTIONS=json.dumps(self.options),
                        PQ_DEMO_RECORD=f"redis://127.0.0.1:{port}/0", PQ_DEMO_PREFIX=prefix,
                        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.app = Celery("demo-producer", broker=self.url)
        self.app.conf.broker_transport_options = self.options
        self.workers = []

    def send(self, name, *args, **kw):
        self.app.send_task(name, args=args, queue="demo", **kw)

    def records(self, kind):
        return [json.loads(x) for x in self.redis.lrange(f"{self.prefix}:demo:{kind}", 0, -1)]

    def worker(self, name):
        log = tempfile.NamedTemporaryFile(prefix=f"pq-demo-{name}-", suffix=".log", delete=False)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "examples.demo_app", "worker", "-P", "solo", "-c", "1",
             "--prefetch-multiplier", "1", "-Q", "demo", "--without-mingle", "--without-gossip", "-l", "info",
             "-n", f"{name}@%h"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        proc.log = Path(log.name)
        self.workers.append(proc)
        self.wait(lambda: b" ready." in proc.log.read_bytes() or proc.poll() is not None, 30, f"worker {name}")
        if proc.poll() is not None:
            say(proc.log.read_text(errors="replace")[-3000:])
            raise SystemExit(f"worker {name} did not start")
        return proc

    def stop(self, proc, sig=signal.SIGTERM):
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        proc.log.unlink(missing_ok=True)

    def close(self):
        for proc in self.workers:
            self.stop(proc)

    @staticmethod
    def wait(pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.05)
        raise SystemExit(f"timed out waiting for {what}")


def part_priorities(port, prefix):
    say("\n1. Priorities overtake a backlog")
    d = Demo(port, prefix + "p", {})
    try:
        sent = [(f"bulk-{i:02d}", i % 10) for i in range(40)] + [("urgent-a", 200), ("urgent-b", 255),
                                                                 ("urgent-c", 200)]
        for label, p in sent:
            d.send("demo.job", label, p, priority=p)
        say(f"  queued {len(sent)} tasks before any worker runs: 40 bulk (priorities 0..9), then 3 urgent")
        w = d.worker("prio")
        d.wait(lambda: len(d.records("order")) == len(sent), 30, "all tasks")
        ran = [tuple(x) for x in d.records("order")]
        say("  ran in this order: " + ", ".join(f"{label}({p})" for label, p in ran[:8]) + ", ...")
        expected = sorted(sent, key=lambda t: (-t[1], sent.index(t)))
        check("urgent tasks ran first, strictly by priority, FIFO within a priority", ran == expected)
        d.stop(w)
    finally:
        d.close()


def part_fairness(port, prefix):
    say("\n2. Fair delivery between tenants")
    d = Demo(port, prefix + "f", {"fair_key": "tenant"})
    try:
        for i in range(200):
            d.send("demo.tenant_job", "big-co", i, headers={"tenant": "big-co"})
        for t in ("small-a", "small-b"):
            for i in range(5):
                d.send("demo.tenant_job", t, i, headers={"tenant": t})
        say("  tenant big-co queued 200 tasks, then small-a and small-b 5 each; one worker")
        w = d.worker("fair")
        d.wait(lambda: len(d.records("tenant")) >= 30, 30, "first 30 deliveries")
        order = [t for t, _ in d.records("tenant")[:30]]
        say("  first 15 deliveries: " + " ".join(t.replace("small-", "s").replace("big-co", "B") for t in order[:15]))
        last_small = max(i for i, t in enumerate(order) if t.startswith("small"))
        check(f"the small tenants were done by delivery {last_small + 1} (of 210), not behind big-co's backlog",
              last_small < 15)
        d.stop(w)
    finally:
        d.close()


def part_recovery(port, prefix):
    say(f"\n3. A killed worker's task comes back (lease_seconds={LEASE})")
    d = Demo(port, prefix + "r", {})
    try:
        d.send("demo.slow", 2.0, "report")
        a = d.worker("worker-a")
        d.wait(lambda: d.records("start"), 20, "the task to start on worker A")
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(10)
        killed = time.time()
        say(f"  worker A (pid {a.pid}) started the task and was killed with SIGKILL")
        b = d.worker("worker-b")
        d.wait(lambda: len(d.records("start")) == 2, LEASE + 15, "the task to start again on worker B")
        first, second = d.records("start")
        say(f"  worker B (pid {b.pid}) started it {second[3] - killed:.1f} s after the kill, "
            f"delivery count {second[2]}")
        check("the task ran again on the second worker, delivery count 2",
              second[1] == b.pid and second[2] == 2)
        check(f"recovered within lease_seconds + 5 s ({LEASE + 5} s)", second[3] - killed <= LEASE + 5)
        d.wait(lambda: d.records("done"), 20, "the task to finish")
        d.send("demo.slow", LEASE * 3, "long")
        d.wait(lambda: len(d.records("done")) == 2, LEASE * 3 + 15, "the long task")
        time.sleep(1.5)
        runs = [r for r in d.records("start") if r[0] == "long"]
        check(f"a task running {LEASE * 3} s (3 leases) ran once: its lease was renewed", len(runs) == 1)
        d.stop(b)
    finally:
        d.close()


def main():
    with find_or_start_redis() as (port, prefix, where):
        say(f"celery-pq demo, using {where}")
        part_priorities(port, prefix)
        part_fairness(port, prefix)
        part_recovery(port, prefix)
    failed = [label for label, ok in CHECKS if not ok]
    say(f"\n{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed.")
    if failed:
        say("failed: " + "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
