"""``python -m celery_pq.demo`` (``make demo``): a producer and real Celery workers
(``celery_pq.demo.app``) on Redis, showing

1. priorities overtaking a backlog (strict priority, FIFO within a priority);
2. a SIGKILLed worker's task coming back on another worker (lease recovery);
3. a task longer than three leases running exactly once (lease renewal);
4. fair delivery between tenants.

It runs wherever celery-pq is installed. Which Redis: ``$PQ_DEMO_REDIS_URL`` if set; else a private
``redis-server`` (``$PQ_REDIS_SERVER`` or PATH) on a free port, stopped at the end; else one
answering on 127.0.0.1:6379; else it says what to install. On a Redis it did not start, its keys
are under a prefix of the run's own (``pqdemo<random>``), deleted at the end.
Exits 0 only if every check passed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from celery import Celery

import celery_pq  # noqa: F401  registers the pq:// scheme with kombu
from celery_pq import PriorityQueue
from celery_pq.storage.redact import redact
from celery_pq.testing import RedisServer, WaitTimeout, WorkerProcess, find_redis_server, start_worker, wait_for

QUEUE = "demo"
LEASE = 3  # lease_seconds: short, so that recovery shows within the demo
SWEEP = 0.5  # sweep_interval: expired leases are looked for this often
CHECKS: list[tuple[str, bool]] = []
LOCAL_REDIS = "redis://127.0.0.1:6379/0"  # the last resort: a Redis the machine runs


class DemoError(Exception):
    """Something the demo needs did not happen (a worker did not start, a wait timed out)."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP: unwind through every ``finally`` so that subprocesses are stopped."""


say = functools.partial(print, flush=True)


def check(label, ok):
    CHECKS.append((label, bool(ok)))
    say(f"  {'PASS' if ok else 'FAIL'}: {label}")


@dataclass
class Target:
    url: str  # redis:// URL: our own client and the tasks' records
    prefix: str  # every key of this run starts with it
    where: str  # what was chosen, for the reader


def broker_url_of(url: str) -> str:
    """``redis://...`` -> ``pq://...`` (``rediss://`` -> ``pqs://``), same host, port, db, password."""
    parts = urlsplit(url)
    scheme = {"redis": "pq", "rediss": "pqs"}.get(parts.scheme)
    if scheme is None:
        raise DemoError(f"PQ_DEMO_REDIS_URL must be a redis:// or rediss:// URL, got {redact(url)}")
    return urlunsplit((scheme, parts.netloc, parts.path, "", ""))


def redis_version(client: redis.Redis) -> str:
    """ " 7.2.4" (a leading space), or "" when INFO is not allowed; raises if Redis does not answer."""
    client.ping()
    try:
        return " " + client.info("server")["redis_version"]
    except redis.ResponseError:
        return ""


@contextmanager
def find_or_start_redis():
    """The Redis of this run (the module's docstring says which), as a ``Target``."""
    prefix = "pqdemo" + uuid.uuid4().hex[:8]
    url = os.environ.get("PQ_DEMO_REDIS_URL")
    if url:
        broker_url_of(url)  # a DemoError for a URL that names no Redis
    else:
        try:  # a RuntimeError: PQ_REDIS_SERVER names no executable, or the server did not start
            binary = find_redis_server(required=False)
            server = RedisServer(binary=binary) if binary else None
        except RuntimeError as exc:
            raise DemoError(str(exc)) from None
        if server is not None:
            with server, server.client() as client:
                where = f"a private redis-server{redis_version(client)} ({binary}) on 127.0.0.1:{server.port}"
                yield Target(server.url, prefix, where + ", stopped at the end")
            return
    client = redis.Redis.from_url(url or LOCAL_REDIS, socket_connect_timeout=5 if url else 1)
    try:
        version = redis_version(client)
    except redis.RedisError as exc:
        if url:
            raise DemoError(f"PQ_DEMO_REDIS_URL={redact(url)} does not answer: {exc}") from None
        raise DemoError(
            "no Redis found: no PQ_DEMO_REDIS_URL, no redis-server binary (PQ_REDIS_SERVER or PATH) and "
            "nothing on 127.0.0.1:6379. Install redis-server (apt-get install redis-server, brew install "
            "redis; 'make demo' does it as root on Debian/Ubuntu) or set PQ_DEMO_REDIS_URL."
        ) from None
    where = f"at {redact(url)} (PQ_DEMO_REDIS_URL)" if url else "on 127.0.0.1:6379 (no redis-server binary found)"
    try:  # a Redis the demo did not start: only keys under the run's prefix, deleted afterwards
        yield Target(url or LOCAL_REDIS, prefix, f"the Redis{version} {where}, keys under {prefix}* only")
    finally:
        try:
            n = sum(client.delete(key) for key in client.scan_iter(match=f"{prefix}*", count=1000))
            say(f"deleted the {n} keys this run left under {prefix}*")
        except redis.RedisError as exc:
            say(f"WARNING: could not delete the keys under {prefix}*: {exc}")


class Part:
    """One part of the demo: its own key prefix, a producer, workers."""

    def __init__(self, target: Target, suffix: str, logdir: Path, **options):
        self.prefix = target.prefix + suffix
        broker = broker_url_of(target.url)  # pq:// URL of the same Redis
        self.logdir = logdir
        self.options = {"key_prefix": self.prefix, "lease_seconds": LEASE, "sweep_interval": SWEEP, **options}
        self.redis = redis.Redis.from_url(target.url)
        self.queue = PriorityQueue(self.redis, QUEUE, key_prefix=self.prefix)
        # the workers import celery_pq.demo.app from where this process imports celery_pq
        self.env = {
            **os.environ,
            "PQ_DEMO_BROKER": broker,
            "PQ_DEMO_OPTIONS": json.dumps(self.options),
            "PQ_DEMO_RECORD": target.url,
            "PQ_DEMO_PREFIX": self.prefix,
        }
        self.app = Celery("demo-producer", broker=broker, set_as_current=False)
        self.app.conf.broker_transport_options = self.options
        self.workers: list[WorkerProcess] = []
        self._checks_before = len(CHECKS)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        failed = exc_type is not None or any(not ok for _, ok in CHECKS[self._checks_before :])
        for proc in self.workers:
            proc.stop(signal.SIGKILL if exc_type is not None else signal.SIGTERM, timeout=20)
        if failed and exc_type is not Interrupted:
            for proc in self.workers:
                say(f"  --- last lines of the log of {proc.name} (pid {proc.pid}) ---")
                for line in proc.log_text().splitlines()[-15:]:
                    say(f"  | {line}")
        self.app.close()
        self.redis.close()
        return False

    def send(self, name, *args, **kw) -> str:
        return self.app.send_task(name, args=args, queue=QUEUE, **kw).id

    def records(self, kind):
        return [json.loads(x) for x in self.redis.lrange(f"{self.prefix}:demo:{kind}", 0, -1)]

    def worker(self, name) -> WorkerProcess:
        """A worker of celery_pq.demo.app, once it has recorded that it is ready."""
        proc = start_worker(
            "celery_pq.demo.app",
            cwd=self.logdir,
            env=self.env,
            name=name,
            queues=QUEUE,
            loglevel="warning",
            log=self.logdir / f"{self.prefix}-{name}.log",
        )
        self.workers.append(proc)
        proc.wait_ready(30, lambda: proc.pid in self.records("ready"), may_exit=True)
        if proc.poll() is not None:
            raise DemoError(f"worker {name} exited at start with code {proc.returncode}")
        return proc

    def lease(self, entry_id):
        """(pid of the lease's consumer, seconds left, deadline in ms on the Redis clock), or None."""
        for held in self.queue.leases(id=entry_id):
            return int(held["consumer"].split(":")[-2]), held["seconds_left"], held["deadline_ms"]  # host:pid:random
        return None

    def check_empty(self, timeout=5.0):
        """Check the queue holds nothing, once nothing is leased (acks may ride with the next pop)."""
        deadline = time.monotonic() + timeout
        while (stats := self.queue.stats())["leased"] and time.monotonic() <= deadline:
            time.sleep(0.1)
        left = any(stats[kind] for kind in ("waiting", "leased", "delayed", "dead"))
        check("afterwards nothing is waiting, leased or dead-lettered", not left)


def part_priorities(target, logdir):
    say("\n1. Priorities overtake a backlog")
    with Part(target, "p", logdir) as d:
        sent = [(f"bulk-{i:02d}", i % 10) for i in range(40)]
        sent += [("urgent-a", 200), ("urgent-b", 255), ("urgent-c", 200), ("urgent-d", 230)]
        for label, p in sent:
            d.send("demo.job", label, p, priority=p)
        say(
            f"  queued {len(sent)} tasks before any worker runs: 40 bulk (priorities 0..9, in turn), "
            "then 4 urgent (200, 255, 200, 230)"
        )
        d.worker("prio")
        wait_for(lambda: len(d.records("order")) >= len(sent), 30, "all tasks to run")
        time.sleep(0.3)  # anything that ran twice would show now
        ran = [tuple(x) for x in d.records("order")]
        say("  one worker (solo, prefetch 1) ran them in this order, by priority:")
        for p, group in groupby(ran, key=lambda t: t[1]):
            say(f"    {p:>3}: {' '.join(label for label, _ in group)}")
        expected = sorted(sent, key=lambda t: (-t[1], sent.index(t)))
        check(f"all {len(sent)} tasks ran, each once", sorted(ran) == sorted(sent))
        check(
            "the 4 urgent tasks ran before any of the backlog",
            {label for label, _ in ran[:4]} == {"urgent-a", "urgent-b", "urgent-c", "urgent-d"},
        )
        check("strictly by priority, FIFO within a priority", ran == expected)


def part_recovery(target, logdir):
    say(f"\n2. A SIGKILLed worker's task comes back (lease_seconds={LEASE}, sweep_interval={SWEEP})")
    with Part(target, "r", logdir) as d:
        task_id = d.send("demo.slow", 2.0, "report")
        a = d.worker("worker-a")
        first = wait_for(lambda: d.records("start"), 20, "the task to start on worker A")[0]
        held = d.lease(task_id)
        a.signal_group(signal.SIGKILL)
        a.wait(10)
        killed = time.time()
        say(
            f"  worker A (pid {a.pid}) started the task (delivery {first['delivery_count']}) "
            "and was killed with SIGKILL"
        )
        if held:
            say(f"  Redis held its lease for pid {held[0]}, {held[1]:.1f} s from running out at the kill")
        check("the task started on worker A and A held its lease", first["pid"] == a.pid and held and held[0] == a.pid)
        b = d.worker("worker-b")
        say(f"  worker B (pid {b.pid}) was up {time.time() - killed:.1f} s after the kill")
        second = wait_for(lambda: d.records("start")[1:], LEASE + 15, "the task to start again on worker B")[0]
        recovery = second["time"] - killed
        say(
            f"  worker B ran the task {recovery:.1f} s after the kill: delivery count "
            f"{second['delivery_count']}, redelivered={second['redelivered']}"
        )
        check("the task ran again, on worker B", second["pid"] == b.pid)
        check(
            "its delivery count is 2 and it is marked redelivered",
            second["delivery_count"] == 2 and second["redelivered"] is True,
        )
        check(f"recovered within lease_seconds + 5 s ({LEASE + 5} s): {recovery:.1f} s", recovery <= LEASE + 5)
        wait_for(lambda: d.records("done"), 20, "the task to finish on worker B")
        d.check_empty()
        rc = b.stop(timeout=20)
        check(f"worker B stopped cleanly on SIGTERM (exit code {rc})", rc == 0)


def part_long_task(target, logdir):
    seconds = 3 * LEASE
    say(f"\n3. A task running {seconds} s (3 x lease_seconds) is not delivered twice")
    with Part(target, "l", logdir) as d:
        w = d.worker("worker-c")
        task_id = d.send("demo.slow", seconds, "long")
        wait_for(lambda: d.records("start"), 20, "the long task to start")
        deadlines, closest = set(), None
        while not d.records("done"):
            held = d.lease(task_id)
            if held:
                deadlines.add(held[2])
                closest = held[1] if closest is None else min(closest, held[1])
            if time.time() - d.records("start")[0]["time"] > seconds + 15:
                raise DemoError("the long task did not finish")
            time.sleep(0.2)
        time.sleep(LEASE + 2 * SWEEP)  # a lease that had run out would have been delivered again by now
        starts, dones = d.records("start"), d.records("done")
        say(
            f"  while it ran, its lease was renewed {max(len(deadlines) - 1, 0)} times by the worker's lease "
            f"keeper; it was never closer than {closest:.1f} s to running out"
        )
        check("the lease was renewed while the task ran", len(deadlines) >= 3 and closest is not None and closest > 0)
        check("the task ran exactly once", len(starts) == 1 and len(dones) == 1)
        d.check_empty()
        w.stop(timeout=20)
        lost = [line for line in w.log_text().splitlines() if "was lost" in line or "ran out" in line]
        check("the worker logged no lost lease", not lost)


def part_fairness(target, logdir):
    say("\n4. Fair delivery between tenants (fair_key='tenant')")
    with Part(target, "f", logdir, fair_key="tenant") as d:
        for i in range(200):
            d.send("demo.tenant_job", "big-co", i, headers={"tenant": "big-co"})
        for t in ("small-a", "small-b"):
            for i in range(5):
                d.send("demo.tenant_job", t, i, headers={"tenant": t})
        say("  tenant big-co queued 200 tasks, then small-a and small-b 5 each, all at priority 0; one worker")
        d.worker("fair")
        wait_for(lambda: len(d.records("tenant")) >= 30, 30, "the first 30 deliveries")
        order = [t for t, _ in d.records("tenant")[:30]]
        short = {"big-co": "B", "small-a": "a", "small-b": "b"}
        say("  first 18 deliveries: " + " ".join(short[t] for t in order[:18]))
        last_small = max(i for i, t in enumerate(order) if t.startswith("small"))
        check(
            f"the small tenants were all served by delivery {last_small + 1} of 210, in turn with big-co",
            last_small < 15,
        )


def _on_signal(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # let the clean-up run to its end
    raise Interrupted(signum)


def main(argv=None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m celery_pq.demo",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    ).parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="pq-demo-logs-"))
    error = None
    try:
        with find_or_start_redis() as target:
            say(f"celery-pq demo, using {target.where}")
            for part in (part_priorities, part_recovery, part_long_task, part_fairness):
                part(target, logdir)
    except (DemoError, WaitTimeout) as exc:
        error = str(exc)
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT
        say(f"\ninterrupted ({signal.Signals(signum).name}); workers stopped, Redis cleaned up")
        return 128 + signum
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    if error and not CHECKS:
        say(f"celery-pq demo could not run: {error}")
        return 1
    failed = [label for label, ok in CHECKS if not ok]
    say(f"\nSummary: {len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed in {time.monotonic() - started:.0f} s.")
    for label in failed:
        say(f"  failed: {label}")
    if error:
        say(f"  stopped early: {error}")
    return 1 if failed or error else 0


if __name__ == "__main__":
    sys.exit(main())
