"""Celery end to end: no-op tasks per second through a real worker, celery-pq beside kombu's Redis
transport and beside kombu's in-process ``memory://`` transport, the ceiling: a broker that costs
nothing but kombu's and Celery's own code. Where RabbitMQ answers on localhost:5672, Celery on
RabbitMQ with a priority queue (x-max-priority 255) is a further column.

Every column is measured alike (memory:// needs its producer and its worker in one process): a
child process (benchmarks/celery_inproc.py) sends N no-op tasks, then runs a Celery worker in its
main thread on them; each task increments a counter in Redis (one INCR per task in every column).
This process watches the counter: the clock starts when the first task is done (so start-up and
filling are excluded) and stops when the last is done. The rows: the solo pool and prefork with 2
processes at prefetch multiplier 1 with early acks; the solo pool with late acks at prefetch 1
(``task_acks_late=True``, ``worker_prefetch_multiplier=1``: one broker round trip per task is the
floor); and the solo pool with Celery's defaults (early acks, prefetch multiplier 4). Each row's
"of ceiling" is celery-pq's (and kombu-redis's) rate over memory://'s in the same run. The
prefork row has no memory:// column: kombu's memory transport has no event loop, so the worker
polls it (``drain_events``), sleeping a second whenever the prefetch window is full, which a pool
of processes makes it be (a few tasks per second); the solo pool runs each task inside the
delivery, so its window never stays full.

    python -m benchmarks.celery_e2e [--tasks 3000] [--repeat 3] [--without-rabbitmq] [--smoke] [--out DIR]

``--without-rabbitmq`` leaves the RabbitMQ column out where one answers (its solo rows run into
the 120-second limit of a run: some 20 tasks/s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from celery_pq.testing import celery_env

from .common import cli, median, rabbitmq_url, redis_server, table, transports

ROOT = Path(__file__).resolve().parent.parent
#: row -> (celery's -P, -c, prefetch multiplier, task_acks_late)
ROWS = {
    "solo": ("solo", 1, 1, False),
    "prefork-2": ("prefork", 2, 1, False),
    "solo, late acks": ("solo", 1, 1, True),
    "solo, Celery defaults": ("solo", 1, 4, False),
}
#: the rows without the memory:// column (see above)
NO_CEILING = {"prefork-2"}
CEILING = "memory"


def tasks_per_second(port, url, kwargs, row, n) -> float:
    pool, concurrency, prefetch, acks_late = ROWS[row]
    rec = redis.Redis(port=port)
    rec.delete("bench:done")
    env = celery_env(
        ROOT,
        BENCH_BROKER=url,
        BENCH_OPTIONS=json.dumps(kwargs.get("transport_options", {})),
        BENCH_RECORD=f"redis://127.0.0.1:{port}/0",
        BENCH_TASKS=str(n),
        BENCH_POOL=pool,
        BENCH_CONCURRENCY=str(concurrency),
        BENCH_PREFETCH=str(prefetch),
        BENCH_ACKS_LATE="1" if acks_late else "0",
    )
    log = tempfile.TemporaryFile()  # the child's stderr, shown when it fails
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.celery_inproc"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,  # its own process group: its pool's processes end with it
    )
    try:
        deadline = time.monotonic() + 120
        while int(rec.get("bench:done") or 0) < 1 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.001)
        start, first = time.perf_counter(), int(rec.get("bench:done") or 0)
        while int(rec.get("bench:done") or 0) < n and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.01)
        done = int(rec.get("bench:done") or 0)
        if done < n and child.poll() is not None:  # (past the deadline, the rate of what was done)
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(
                f"{url} {row}: {done} of {n} tasks done, the child exited (code {child.poll()}):\n{tail}"
            )
        return (done - first) / (time.perf_counter() - start)
    finally:
        _stop(child)
        rec.close()
        log.close()


def _stop(child: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if child.poll() is not None:
            return
        try:
            os.killpg(child.pid, sig)
            child.wait(wait)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def run(tasks=3000, repeat=3, without_rabbitmq=False) -> dict:
    runs: dict = {row: {} for row in ROWS}
    rabbit = None if without_rabbitmq else rabbitmq_url()
    with redis_server() as port:
        columns = {**transports(port), CEILING: ("memory://", {})}
        if rabbit:
            columns["rabbitmq"] = (rabbit, {})
        for _ in range(repeat):
            for row in ROWS:
                for name, (url, kwargs) in columns.items():
                    if name == CEILING and row in NO_CEILING:
                        continue
                    runs[row].setdefault(name, []).append(tasks_per_second(port, url, kwargs, row, tasks))
    results = {}
    for row, rates in runs.items():
        med = {name: median(v) for name, v in rates.items()}
        # ratios of each repetition's rates (the columns of one repetition ran back to back), their median
        of = {
            name: median([a / c for a, c in zip(rates[name], rates[CEILING])])
            for name in ("celery-pq", "kombu-redis")
            if CEILING in rates
        }
        results[row] = {
            "tasks_per_second": med,
            "ratio": med["celery-pq"] / med["kombu-redis"],
            "of_ceiling": of,
            "settings": dict(zip(("pool", "concurrency", "prefetch_multiplier", "acks_late"), ROWS[row])),
            "runs": rates,
        }
    return {
        "tasks": tasks,
        "repeat": repeat,
        "rabbitmq": bool(rabbit),
        "rabbitmq_left_out": without_rabbitmq,
        "results": results,
    }


def markdown(data) -> list[str]:
    rows = []
    rabbit = "left out" if data.get("rabbitmq_left_out") else "not reachable"
    for name, r in data["results"].items():
        rate, of = r["tasks_per_second"], r["of_ceiling"]
        rows.append(
            [
                name,
                f"{rate[CEILING]:.0f}" if of else "-",
                f"{rate['celery-pq']:.0f}",
                f"{of['celery-pq']:.0%}" if of else "-",
                f"{rate['kombu-redis']:.0f}",
                f"{of['kombu-redis']:.0%}" if of else "-",
                f"{r['ratio']:.2f}",
                f"{rate['rabbitmq']:.0f}" if "rabbitmq" in rate else rabbit,
            ]
        )
    return [
        f"# Celery end to end, no-op tasks ({data['tasks']} per run, median of {data['repeat']} runs)",
        "",
        "Each run: one process fills the queue, then runs the worker; the clock runs from the first "
        "task done to the last. memory:// (kombu's in-process transport) is the ceiling; "
        '"of ceiling" is the median over the repetitions of a rate over memory://\'s in the same '
        "repetition. Rows: solo and prefork-2 at prefetch 1, early acks; solo with late acks at "
        "prefetch 1; solo with Celery's defaults (early acks, prefetch multiplier 4). No memory:// "
        "in the prefork row: the worker polls that transport, a second's sleep whenever a pool's "
        "prefetch window is full.",
        "",
        *table(
            [
                "row",
                "memory:// tasks/s",
                "celery-pq tasks/s",
                "of ceiling",
                "kombu-redis tasks/s",
                "of ceiling",
                "celery-pq / kombu-redis",
                "RabbitMQ (priority queue) tasks/s",
            ],
            rows,
        ),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "celery_e2e",
        run,
        markdown,
        options=[("--tasks", int, 3000), ("--repeat", int, 3), ("--without-rabbitmq", bool, False)],
        smoke={"tasks": 30, "repeat": 1},
    )


if __name__ == "__main__":
    main()
