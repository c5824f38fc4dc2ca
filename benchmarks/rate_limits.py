"""A global rate limit across workers: the transport option ``task_rate`` beside Celery's own
``rate_limit`` (a token bucket in each worker, celery issue #5732), the same 3 worker processes
(prefork pool of one process each, Celery's default prefetch multiplier 4: a rate-limited task
waits in the worker for its token, so with prefetch 1 a worker holds one and fetches the next only
after it ran) on the same Redis. Under the solo pool Celery's rate_limit let through far less
than its rate here, on kombu's Redis transport as on this one (about 2/s of 10/s per worker),
so the comparison uses prefork.

Each run starts the workers, waits until all are ready, then publishes a backlog large enough
for the whole run (the limited task only) and measures for ``--seconds`` from the first
execution. Every execution records Redis time (``TIME``) in a list, so the counts of all workers
are on one clock; for ``task_rate`` the deliveries (the queue's event log, stamped with Redis time
by the pop script) are counted as well. Reported per run: the rate delivered, the most
executions (deliveries) in any 1-second window (sliding), and the per-second counts' spread over
the consecutive seconds of the run. The bound of ``task_rate`` is a full bucket plus the rate:
at most max(N, 1) + N in any second (docs/rate-limits.md). The load average of the machine is
noted before and after.

    python -m benchmarks.rate_limits [--rate 20] [--seconds 30] [--workers 3] [--prefetch 4] [--smoke] [--out DIR]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from bisect import bisect_right
from pathlib import Path

import redis
from celery import Celery

import celery_pq  # noqa: F401  (pq://)
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import celery_env, start_worker, stop_workers
from celery_pq.transport.task_rates import task_tenant

from .common import cli, redis_server, table

ROOT = Path(__file__).resolve().parent.parent
LIMITED, WORKER_LIMITED = "bench.limited", "bench.worker_limited"


def most_in_window(times_us: list[int], seconds: float = 1.0) -> int:
    """The most of ``times_us`` inside any closed window [t, t + seconds]."""
    times = sorted(times_us)
    span = seconds * 1_000_000
    return max((bisect_right(times, t + span) - i for i, t in enumerate(times)), default=0)


def figures(times_us: list[int], start_us: int, seconds: int) -> dict:
    """Rate, sliding 1-second maximum and per-second spread of the times within the run."""
    inside = sorted(t for t in times_us if start_us <= t < start_us + seconds * 1_000_000)
    per_second = [0] * seconds
    for t in inside:
        per_second[(t - start_us) // 1_000_000] += 1
    return {
        "count": len(inside),
        "rate": len(inside) / seconds,
        "max_in_1s_window": most_in_window(inside),
        "per_second": per_second,
        "per_second_min": min(per_second),
        "per_second_max": max(per_second),
        "per_second_stdev": statistics.pstdev(per_second),
    }


def one_run(port: int, case: str, rate: float, seconds: int, workers: int, prefetch: int, logdir: Path) -> dict:
    """One run: ``case`` "task_rate" (the broker's limit) or "rate_limit" (Celery's, per worker)."""
    prefix = f"bench-rate-{case}"
    options: dict = {"key_prefix": prefix}
    if case == "task_rate":
        options.update(task_rate={LIMITED: rate}, event_log=1_000_000)
    task = LIMITED if case == "task_rate" else WORKER_LIMITED
    url = f"pq://127.0.0.1:{port}/0"
    rec = redis.Redis(port=port)
    rec.delete("bench:ran")
    env = celery_env(
        ROOT,
        BENCH_BROKER=url,
        BENCH_OPTIONS=json.dumps(options),
        BENCH_RECORD=f"redis://127.0.0.1:{port}/0",
        BENCH_RATE_LIMIT=f"{rate:g}/s",
    )
    procs = [
        start_worker(
            "benchmarks.celery_app",
            cwd=ROOT,
            env=env,
            name=f"{case}{i}",
            queues="bench",
            pool="prefork",
            concurrency=1,
            prefetch_multiplier=prefetch,
            log=logdir / f"{case}{i}.log",
        )
        for i in range(workers)
    ]
    app = Celery("bench-rate", broker=url)
    app.conf.broker_transport_options = options
    try:
        for p in procs:
            p.wait_ready(60)
        backlog = int(rate * workers * seconds * 1.2) + 100  # more than even the per-worker limit takes
        with app.connection_for_write() as conn:
            producer = conn.Producer()
            for _ in range(backlog):
                app.send_task(task, queue="bench", producer=producer)
        deadline = time.monotonic() + 60
        while not rec.llen("bench:ran") and time.monotonic() < deadline:
            time.sleep(0.01)
        first = int(rec.lindex("bench:ran", 0) or 0)
        end_s, end_us = rec.time()
        while (end_s * 1_000_000 + end_us) < first + (seconds + 0.5) * 1_000_000:
            time.sleep(0.2)
            end_s, end_us = rec.time()
    finally:
        stop_workers(procs)
        app.close()
    ran = [int(x) for x in rec.lrange("bench:ran", 0, -1)]
    out = {"backlog": backlog, "executions": figures(ran, first, seconds)}
    if case == "task_rate":
        q = open_queue(rec, "bench", QueueSettings(key_prefix=prefix), declare=False)
        tenant = task_tenant(LIMITED)
        delivered = [e["ms"] * 1000 for e in q.events() if e["e"] == "deliver" and e["t"] == tenant]
        out["deliveries"] = figures(delivered, min(delivered), seconds) if delivered else None
        out["bound_1s"] = max(rate, 1) + rate
        q.purge()
    else:
        open_queue(rec, "bench", QueueSettings(key_prefix=prefix), declare=False).purge()
    rec.close()
    return out


def run(rate=20.0, seconds=30, workers=3, prefetch=4) -> dict:
    load_before = os.getloadavg()
    with redis_server() as port, tempfile.TemporaryDirectory() as logs:
        results = {
            case: one_run(port, case, rate, seconds, workers, prefetch, Path(logs))
            for case in ("task_rate", "rate_limit")
        }
    return {
        "rate": rate,
        "seconds": seconds,
        "workers": workers,
        "prefetch_multiplier": prefetch,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }


def markdown(data) -> list[str]:
    r, rate, n = data["results"], data["rate"], data["workers"]
    columns = {
        f"task_rate={{task: {rate:g}}}, executions": r["task_rate"]["executions"],
        "task_rate, deliveries (broker clock)": r["task_rate"]["deliveries"],
        f'Celery rate_limit="{rate:g}/s", executions': r["rate_limit"]["executions"],
    }
    rows = [
        [
            name,
            f"{f['rate']:.1f}",
            str(f["max_in_1s_window"]),
            f"{f['per_second_min']}..{f['per_second_max']}",
            f"{f['per_second_stdev']:.1f}",
        ]
        for name, f in columns.items()
        if f
    ]
    before, after = data["load_before"], data["load_after"]
    return [
        f"# A global rate limit: {rate:g} tasks/s across {n} workers, {data['seconds']} s",
        "",
        *table(["limit", "tasks/s", "most in any 1 s window", "per second, min..max", "per second, stdev"], rows),
        "",
        f"{n} Celery worker processes (prefork pool of one process each, prefetch multiplier {data['prefetch_multiplier']}) on one queue of one Redis, "
        f"a backlog of the limited task only. The bound of task_rate in any 1 s window: a full "
        f"bucket and the rate, {r['task_rate']['bound_1s']:g}. Celery's rate_limit is a bucket in "
        f"each worker: {n} workers let about {n} x {rate:g} through. Where its per-second counts "
        "fall far below its rate after the first seconds, that is Celery's own (celery issues "
        "#3166, #6845; with the same workers on kombu's Redis transport it fell alike here).",
        "",
        f"Machine: {data['cpus']} CPUs, load average (1, 5, 15 min) {before[0]}, {before[1]}, {before[2]} "
        f"before and {after[0]}, {after[1]}, {after[2]} after (other work ran beside it).",
        "",
        "Per second (consecutive seconds from the first execution):",
        "",
        *(f"- {name}: {' '.join(str(x) for x in f['per_second'])}" for name, f in columns.items() if f),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "rate_limits",
        run,
        markdown,
        options=[("--rate", float, 20.0), ("--seconds", int, 30), ("--workers", int, 3), ("--prefetch", int, 4)],
        smoke={"rate": 10.0, "seconds": 3, "workers": 2},
    )


if __name__ == "__main__":
    main()
