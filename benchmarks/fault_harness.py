"""The fault suite's harness: producers, real Celery workers, faults, and Jepsen's queue checker.

One ``FaultRun`` is one broker (a redis-server of ``celery_pq.testing``) and one transport,
``celery-pq`` (``pq://``) or ``kombu-redis`` (kombu's Redis transport, ``redis://`` with
``visibility_timeout``), so that both run the same scenario in the same process:

- producers are threads of this process, each with its own connection, publishing task ids
  (``p<thread>-<n>``) with random priorities (0-9, the range both transports order by) and
  tenants (a ``tenant`` header; celery-pq's ``fair_key``), through Celery's ``send_task`` with
  its publish retry; each id is written down before the call and as returned or raised after it;
- workers are ``celery worker`` subprocesses (prefork unless ``pool`` names another, ``acks_late``, prefetch 1) of
  ``benchmarks/fault_app.py``, each in a process group of its own so that a fault reaches the
  main process and its pool children together; each run of a task is appended to a file of
  its process (``start``/``done`` lines), which no fault touches;
- ``classify()`` sorts every id as Jepsen's queue checker does: **lost** (publish returned,
  never done), **recovered** (publish raised, done anyway), **duplicated** (started more than
  once), **unexpected** (started, never published), with throughput.

The CI tests (tests/faults/) run each scenario bounded; benchmarks/faults.py runs them long.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import redis
from celery import Celery

import celery_pq  # noqa: F401  (pq://)
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import WorkerProcess, celery_env, start_worker, stop_workers

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "faults"
TRANSPORTS = ("celery-pq", "kombu-redis")
RETRY_POLICY = {"max_retries": 60, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


class FaultRun:
    """One scenario on one transport. ``lease`` is celery-pq's ``lease_seconds`` and kombu's
    ``visibility_timeout`` alike; ``options`` adds transport options; ``via_port`` sends the
    producers and workers to Redis through that port (a proxy), the checks go straight."""

    def __init__(
        self,
        transport: str,
        server,
        workdir: Path,
        *,
        lease: float = 2.0,
        concurrency: int = 2,
        task_seconds: float = 0.02,
        options: dict | None = None,
        seed: int = 13,
        via_port: int | None = None,
        pool: str = "prefork",
    ):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.transport = transport
        self.server = server
        self.dir = Path(workdir) / transport
        self.records = self.dir / "records"
        self.records.mkdir(parents=True, exist_ok=True)
        self.prefix = "pqf" + uuid.uuid4().hex[:8]
        port = via_port or server.port
        if transport == "celery-pq":
            self.url = f"pq://127.0.0.1:{port}/0"
            self.options = {
                "key_prefix": self.prefix,
                "lease_seconds": lease,
                "sweep_interval": min(0.5, lease / 4),
                "fair_key": "tenant",
                **(options or {}),
            }
        else:
            self.url = f"redis://127.0.0.1:{port}/0"
            self.options = {"visibility_timeout": lease, **(options or {})}
        self.concurrency = concurrency
        self.pool = pool  # prefork, solo, threads, gevent, eventlet (with ``concurrency``)
        self.task_seconds = task_seconds
        self.rng = random.Random(seed)
        self.env = celery_env(
            ROOT, FAULT_BROKER=self.url, FAULT_OPTIONS=json.dumps(self.options), FAULT_RECORDS=str(self.records)
        )
        self.app = Celery("faults-client", broker=self.url)
        self.app.conf.broker_transport_options = self.options
        self.app.conf.broker_connection_max_retries = None
        self.workers: dict[str, WorkerProcess] = {}
        # (process group, time) of each SIGKILL / SIGSTOP of a worker; process group 0: the broker
        self.kills: list[tuple[int, float]] = []
        self.lease = lease
        self.attempted: set[str] = set()
        self.ok: set[str] = set()
        self.ok_at: dict[str, float] = {}  # id -> when its publish returned
        self.raised: set[str] = set()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._producers: list[threading.Thread] = []
        self.started_at = self.finished_at = None
        self._serial = 0

    # -- workers ---------------------------------------------------------------------------

    def worker(self, name: str, wait_ready: bool = True, broker_port: int | None = None) -> WorkerProcess:
        """Start worker ``name``; ``broker_port`` sends it to the broker through another port
        (a proxy) on 127.0.0.1."""
        self._serial += 1
        env = self.env
        if broker_port is not None:
            env = dict(env, FAULT_BROKER=self.url.rsplit(":", 1)[0] + f":{broker_port}/0")
        proc = start_worker(
            "benchmarks.fault_app",
            cwd=ROOT,
            env=env,
            name=f"{name}.{self._serial}",
            queues=QUEUE,
            pool=self.pool,
            concurrency=self.concurrency,
            heartbeat=False,
            log=self.dir / f"{name}.{self._serial}.log",
        )
        self.workers[name] = proc
        if wait_ready:
            proc.wait_ready(60)
        return proc

    def start_workers(self, n: int = 3) -> None:
        for i in range(n):
            self.worker(f"w{i}")

    def signal_worker(self, name: str, sig: int) -> int:
        proc = self.workers[name]
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            self.kills.append((proc.pid, time.time()))
        proc.signal_group(sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)
        return proc.pid

    def kill_and_restart(self, name: str) -> None:
        self.signal_worker(name, signal.SIGKILL)
        self.worker(name, wait_ready=False)

    def worker_logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log")))

    # -- producers -------------------------------------------------------------------------

    def _produce(self, index: int, count: int, rate: float | None, seed: int) -> None:
        rng = random.Random(seed)
        begin = time.monotonic()
        try:
            with self.app.connection_for_write() as conn:
                producer = conn.Producer()
                for n in range(count):
                    if rate:
                        delay = begin + n / rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                    tid = f"p{index}-{n}"
                    with self._lock:
                        self.attempted.add(tid)
                    try:
                        self.app.send_task(
                            "faults.work",
                            args=(tid, self.task_seconds),
                            queue=QUEUE,
                            priority=rng.randint(0, 9),
                            headers={"tenant": f"t{rng.randint(0, 4)}"},
                            producer=producer,
                            retry=True,
                            retry_policy=RETRY_POLICY,
                        )
                    except Exception as exc:  # the id is "raised": it may still be stored
                        with self._lock:
                            self.raised.add(tid)
                            self.errors.append(repr(exc))
                    else:
                        with self._lock:
                            self.ok.add(tid)
                            self.ok_at[tid] = time.time()
        except Exception as exc:  # a producer that could not connect at all
            with self._lock:
                self.errors.append(f"producer {index}: {exc!r}")

    def start_producers(self, total: int, threads: int = 2, rate: float | None = None) -> None:
        self.started_at = self.started_at or time.time()
        per = total // threads
        for i in range(threads):
            t = threading.Thread(
                target=self._produce,
                name=f"producer-{i}",
                daemon=True,
                args=(len(self._producers), per, rate / threads if rate else None, self.rng.random()),
            )
            self._producers.append(t)
            t.start()

    def producing(self) -> bool:
        return any(t.is_alive() for t in self._producers)

    def join_producers(self, timeout: float = 120) -> None:
        for t in self._producers:
            t.join(timeout)
        if self.producing():
            raise AssertionError(f"producers still running after {timeout}s")

    # -- what ran --------------------------------------------------------------------------

    def runs(self) -> dict[str, list[tuple[str, int, int, float]]]:
        """id -> [(kind, pgid, pid, time)] in time order."""
        out: dict[str, list] = defaultdict(list)
        for path in self.records.glob("*.log"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5:
                    out[parts[1]].append((parts[0], int(parts[2]), int(parts[3]), float(parts[4])))
        for rows in out.values():
            rows.sort(key=lambda r: r[3])
        return out

    def done_ids(self) -> set[str]:
        return {tid for tid, rows in self.runs().items() if any(r[0] == "done" for r in rows)}

    def wait_all_done(self, timeout: float) -> bool:
        """True when every id whose publish returned has run to its end within ``timeout``."""
        deadline = time.monotonic() + timeout
        empty_since = None
        while time.monotonic() < deadline:
            if self.ok <= self.done_ids():
                self.finished_at = time.time()
                return True
            # some are lost: stop once the broker has had nothing waiting or leased for 3 s
            try:
                empty = not any(self.residue().values())
            except redis.RedisError:
                empty = False
            empty_since = (empty_since or time.monotonic()) if empty else None
            if empty_since and time.monotonic() - empty_since > 3.0:
                break
            if self.workers and all(p.poll() is not None for p in self.workers.values()):
                break  # every worker has exited: nothing more will run
            time.sleep(0.25)
        self.finished_at = time.time()
        return False

    def under_way(self) -> int:
        """Task ids started and not yet done."""
        return sum(
            1
            for rows in self.runs().values()
            if any(r[0] == "start" for r in rows) and not any(r[0] == "done" for r in rows)
        )

    def wait_empty(self, timeout: float) -> bool:
        """True once nothing is waiting or leased in the broker (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not any(self.residue().values()):
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.25)
        return False

    def residue(self) -> dict:
        """What stays in the broker: waiting and leased (celery-pq) or unacked (kombu)."""
        r = self.server.client()
        try:
            if self.transport == "celery-pq":
                q = open_queue(r, QUEUE, QueueSettings(key_prefix=self.prefix), declare=False)
                stats = q.stats()
                return {"waiting": q.size(), "leased": stats["leased"]}
            waiting = sum(r.llen(k) for k in r.scan_iter(match=f"{QUEUE}*") if r.type(k) == b"list")
            return {"waiting": waiting, "leased": r.hlen("unacked")}
        finally:
            r.close()

    def classify(self) -> dict:
        runs = self.runs()
        started = {tid for tid, rows in runs.items() if any(r[0] == "start" for r in rows)}
        done = {tid for tid, rows in runs.items() if any(r[0] == "done" for r in rows)}
        starts = {tid: [r for r in rows if r[0] == "start"] for tid, rows in runs.items()}
        duplicated = sorted(tid for tid, rows in starts.items() if len(rows) > 1)
        elapsed = (self.finished_at or time.time()) - (self.started_at or time.time())
        return {
            "transport": self.transport,
            "published": len(self.attempted),
            "returned": len(self.ok),
            "raised": len(self.raised),
            "done": len(done & self.attempted),
            "lost": sorted(self.ok - done),
            "recovered": sorted(self.raised & done),
            "duplicated": duplicated,
            "unexpected": sorted(started - self.attempted),
            "max_runs": max((len(rows) for rows in starts.values()), default=0),
            "unexplained_duplicates": sorted(self.unexplained(duplicated, starts)),
            "unexplained_detail": self.detail(self.unexplained(duplicated, starts)[:5], runs),
            "kills": len(self.kills),
            "seconds": round(elapsed, 2),
            "per_second": round(len(done) / elapsed, 1) if elapsed > 0 else 0.0,
        }

    def finish(self, drain: float, settle: float = 1.0) -> dict:
        """Wait up to ``drain`` seconds for every returned publish to run, ``settle`` more for the
        last acks; the classification, with what stays in the broker and the workers alive."""
        self.wait_all_done(drain)
        time.sleep(settle)
        result = self.classify()
        result["residue"] = self.residue()
        result["workers_alive"] = sum(p.poll() is None for p in self.workers.values())
        return result

    def unexplained(self, duplicated, starts) -> list[str]:
        """Duplicates whose first run was not under way (or just done, its ack not yet applied:
        within one lease) on a worker when it was killed or stopped, or when the broker was."""
        runs = self.runs()
        out = []
        for tid in duplicated:
            _, pgid, pid, t0 = starts[tid][0]
            done = [r[3] for r in runs[tid] if r[0] == "done" and r[2] == pid and r[3] >= t0]
            t1 = min(done) if done else float("inf")
            if not any(k_pgid in (0, pgid) and t0 <= k_t <= t1 + self.lease for k_pgid, k_t in self.kills):
                out.append(tid)
        return out

    def detail(self, ids, runs) -> dict:
        """For a few ids: their runs (kind, process group, time) and the faults' times, relative
        to the start of the run, to see why they ran twice."""
        t0 = self.started_at or 0.0
        return {
            tid: {
                "runs": [(kind, pgid, round(t - t0, 3)) for kind, pgid, _, t in runs[tid]],
                "faults": [(pgid, round(t - t0, 3)) for pgid, t in self.kills],
            }
            for tid in ids
        }

    def loss_window(self, lost) -> float:
        """The longest time between a lost publish's return and the broker's next kill."""
        kills = sorted(t for pgid, t in self.kills if pgid == 0)
        window = 0.0
        for tid in lost:
            at = self.ok_at.get(tid)
            after = [k for k in kills if at is not None and k >= at]
            if after:
                window = max(window, after[0] - at)
        return round(window, 3)

    def close(self) -> None:
        stop_workers(self.workers.values(), timeout=15)


def summary(result: dict) -> dict:
    """A result with its id lists replaced by their counts (and the first few ids kept)."""
    out = {}
    for key, value in result.items():
        if isinstance(value, list):
            out[key] = len(value)
            if value:
                out[f"{key}_sample"] = value[:5]
        else:
            out[key] = value
    return out
