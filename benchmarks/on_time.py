"""On time: how late delayed tasks start, and how fast a mass of them comes due.

(a) lateness: countdown tasks (countdowns spread over 1..5 s, all sent at once) through a real
Celery worker (prefork, 2 processes), start time minus eta, per transport on one redis-server:
p50/p99/max ms. kombu's Redis transport holds eta tasks in the worker's memory; celery-pq holds
them in Redis until due (docs/views-and-delays.md, "When a delayed task starts").
(b) volume: ``--volume`` entries due at one moment in a plain, a fair (3 tenants) and a sharded
(4 shards, peek 2) queue through the queue API, consumed by two consumers that wait as a worker
does (until the next due time a pop reports) and a sweep once a second: the time from the due
moment until every one is deliverable (none left delayed), until every one was delivered, and
the slowest script call from the end of the inserts on (SLOWLOG, every call over 1 ms logged;
"< 1" when none was).

    python -m benchmarks.on_time [--tasks 300] [--volume 50000] [--repeat 1]
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import redis

from .common import cli, median, percentile, redis_server, table, transports

ROOT = Path(__file__).resolve().parent.parent
LATE_KEY = "bench:late"


def lateness(port: int, url: str, kwargs: dict, tasks: int, spread: tuple[float, float]) -> list[float]:
    """ms each of ``tasks`` countdown tasks started after its eta, through a prefork worker."""
    from celery import Celery

    from celery_pq.testing import celery_env, start_worker

    options = kwargs.get("transport_options", {})
    env = celery_env(
        ROOT, BENCH_BROKER=url, BENCH_OPTIONS=json.dumps(options), BENCH_RECORD=f"redis://127.0.0.1:{port}/0"
    )
    rec = redis.Redis(port=port)
    rec.delete(LATE_KEY)
    app = Celery("bench-client", broker=url)
    app.conf.broker_transport_options = options
    worker = start_worker(
        "benchmarks.celery_app", cwd=ROOT, env=env, queues="bench", pool="prefork", concurrency=2, loglevel="warning"
    )
    try:
        app.send_task("bench.late", args=(time.time(),), queue="bench")  # warm-up: the worker is up
        _wait(lambda: rec.llen(LATE_KEY) >= 1, 60)
        rec.delete(LATE_KEY)
        time.sleep(1.0)  # idle
        rng = random.Random(5)
        with app.producer_or_acquire() as producer:
            for _ in range(tasks):
                countdown = rng.uniform(*spread)
                eta = time.time() + countdown
                app.send_task("bench.late", args=(eta,), queue="bench", countdown=countdown, producer=producer)
        _wait(lambda: rec.llen(LATE_KEY) >= tasks, spread[1] + 60)
        return [float(x) for x in rec.lrange(LATE_KEY, 0, -1)]
    finally:
        worker.stop(timeout=20)


def _wait(cond, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)


def _open(client, kind: str, prefix: str):
    from celery_pq.queue import QueueSettings, open_queue
    from celery_pq.transport.options import Options

    if kind == "sharded":
        return open_queue(client, "due", Options(key_prefix=prefix, shards=4, peek=2).queue_settings("due"))
    return open_queue(client, "due", QueueSettings(key_prefix=prefix, fair=kind == "fair"))


def volume(port: int, kind: str, n: int) -> dict:
    """``n`` entries due at one moment: seconds until all are deliverable and all delivered, and
    the slowest script call (ms) from their insert to the end."""
    from celery_pq import Item

    client = redis.Redis(port=port)
    prefix = f"vol{kind}{random.randrange(1 << 30)}"
    q = _open(client, kind, prefix)
    shards = getattr(q, "shards", [q])
    tenants = ["a", "b", "c"] if kind == "fair" else [None]
    s, us = client.time()
    due = s * 1000 + us // 1000 + 3000 + n // 20  # (time to insert them all first)
    for start in range(0, n, 10_000):
        chunk = range(start, min(n, start + 10_000))
        q.insert_many([Item(b"x" * 100, i % 10, due_ms=due, tenant=tenants[i % len(tenants)]) for i in chunk])
    s, us = client.time()
    ahead = due - (s * 1000 + us // 1000)
    delayed = lambda: sum(client.zcard(sh.keys.delayed) for sh in shards)  # noqa: E731
    assert delayed() == n and ahead > 0, (delayed(), ahead)
    client.config_set("slowlog-log-slower-than", 1000)  # (from here: the inserts are not measured)
    client.config_set("slowlog-max-len", 10000)
    client.slowlog_reset()
    stop = threading.Event()
    delivered = [0, 0]

    def consumer(i):
        c = redis.Redis(port=port)
        mine = _open(c, kind, prefix)
        while not stop.is_set():
            popped = mine.pop(50)
            if popped:
                mine.ack(list(popped))
                delivered[i] += len(popped)
            else:  # idle: wait as a worker does, until the next due time (or a wake-up)
                wait = 0.2 if popped.due_in is None else popped.due_in / 1000
                stop.wait(min(0.2, wait))

    def sweeper():
        mine = _open(redis.Redis(port=port), kind, prefix)
        while not stop.wait(1.0):
            while mine.reclaim()["more"]:
                pass

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(2)] + [threading.Thread(target=sweeper)]
    for t in threads:
        t.start()
    all_due = all_done = None
    try:
        while True:
            s, us = client.time()
            now = s * 1000 + us // 1000
            if now >= due:
                if all_due is None and delayed() == 0:
                    all_due = (now - due) / 1000
                if sum(delivered) >= n:
                    all_done = (now - due) / 1000
                    break
                if now - due > 120_000:
                    break
            time.sleep(0.002)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    slow = [e for e in client.slowlog_get(10000) if e["command"].split(b" ")[0].upper() in (b"FCALL", b"EVALSHA")]
    client.config_set("slowlog-log-slower-than", 10000)
    by_script: dict = {}
    for e in slow:
        name = e["command"].split(b" ")[1].decode(errors="replace").rsplit("_", 1)[-1]
        by_script[name] = max(by_script.get(name, 0), e["duration"] / 1000)
    return {
        "entries": n,
        "all_deliverable_s": all_due,
        "all_delivered_s": all_done,
        "slowest_script_ms": max((e["duration"] for e in slow), default=0) / 1000,
        "script_calls_over_1ms": len(slow),
        "slowest_by_script_ms": by_script,
    }


def run(tasks=300, volume_entries=50_000, repeat=1, spread=(1.0, 5.0)) -> dict:
    late: dict = {}
    vol: dict = {}
    with redis_server() as port:
        for _ in range(repeat):
            for name, (url, kwargs) in transports(port).items():
                got = lateness(port, url, kwargs, tasks, tuple(spread))
                row = late.setdefault(name, {"p50_ms": [], "p99_ms": [], "max_ms": [], "started": []})
                row["p50_ms"].append(percentile(got, 50))
                row["p99_ms"].append(percentile(got, 99))
                row["max_ms"].append(max(got) if got else float("nan"))
                row["started"].append(len(got))
            for kind in ("plain", "fair", "sharded"):
                vol.setdefault(kind, []).append(volume(port, kind, volume_entries))
    late_summary = {name: {k: median(v) for k, v in row.items()} | {"runs": row} for name, row in late.items()}
    vol_summary = {
        kind: {
            "entries": volume_entries,
            "all_deliverable_s": max(
                r["all_deliverable_s"] if r["all_deliverable_s"] is not None else float("inf") for r in rows
            ),
            "all_delivered_s": max(
                r["all_delivered_s"] if r["all_delivered_s"] is not None else float("inf") for r in rows
            ),
            "slowest_script_ms": max(r["slowest_script_ms"] for r in rows),
            "runs": rows,
        }
        for kind, rows in vol.items()
    }
    return {"tasks": tasks, "spread_s": list(spread), "repeat": repeat, "lateness": late_summary, "volume": vol_summary}


def markdown(data) -> list[str]:
    late, vol = data["lateness"], data["volume"]
    lo, hi = data["spread_s"]
    n = next(iter(vol.values()))["entries"] if vol else 0
    return [
        f"# On time: lateness of {data['tasks']} countdown tasks ({lo:g}..{hi:g} s) through a prefork worker",
        "",
        "start time minus eta, ms (median of the runs' figures)",
        "",
        *table(
            ["transport", "p50 ms", "p99 ms", "max ms", "started"],
            [
                [name, f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['started']:.0f}"]
                for name, r in late.items()
            ],
        ),
        "",
        f"# {n:,} entries due at one moment",
        "",
        "seconds from the due moment (the worst of the runs); two consumers and a sweep a second",
        "",
        *table(
            ["queue", "all deliverable s", "all delivered s", "slowest script call ms"],
            [
                [
                    kind,
                    f"{r['all_deliverable_s']:.2f}",
                    f"{r['all_delivered_s']:.2f}",
                    f"{r['slowest_script_ms']:.2f}" if r["slowest_script_ms"] else "< 1",
                ]
                for kind, r in vol.items()
            ],
        ),
        "",
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "on_time",
        lambda tasks, volume, repeat: run(tasks, volume, repeat, (1.0, 5.0) if tasks > 20 else (0.3, 0.8)),
        markdown,
        options=[("--tasks", int, 300), ("--volume", int, 50_000), ("--repeat", int, 1)],
        smoke={"tasks": 5, "volume": 2_000, "repeat": 1},
    )


if __name__ == "__main__":
    main()
