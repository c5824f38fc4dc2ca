"""The queue API without Celery against BullMQ, at equal concurrency.

celery-pq: ``PriorityQueue`` insert/s from 1 and 8 client processes, and pop+ack/s from 1 and 8
consumer processes working one entry at a time (each ack rides in the next pop's script call:
one round trip, one script). BullMQ (Node.js, from the npm registry, in ``benchmarks/bullmq``):
no-op jobs processed by one Worker at concurrency 1 and 8, against the same redis-server in the
same run. Without Node.js or BullMQ the peer column says so.

    python -m benchmarks.peers [--jobs 20000] [--repeat 3] [--smoke] [--out DIR]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import subprocess
import time
from pathlib import Path

import redis

from celery_pq.queue import QueueSettings, open_queue

from .common import cli, median, redis_server, table

BULLMQ = Path(__file__).resolve().parent / "bullmq"


def _inserter(port, name, n, start, out):
    q = open_queue(redis.Redis(port=port), name, QueueSettings(key_prefix="peers"))
    start.wait()
    t = time.perf_counter()
    for i in range(n):
        q.insert(b"{}", i % 256)
    out.put((t, time.perf_counter()))


def _consumer(port, name, start, out):
    client = redis.Redis(port=port)
    q = open_queue(client, name, QueueSettings(key_prefix="peers"))
    start.wait()
    t = time.perf_counter()
    done, held = 0, None
    while True:
        got = q.pop(1, acks=[(held.id, held.token)] if held else ())  # the last one acked in the same call
        if not got:
            break
        held = got[0]
        done += 1
    out.put((t, time.perf_counter(), done))


def _spawn(target, args_for, procs):
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args_for(i), start, out)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(0.3)
    start.set()
    rows = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(30)
    return rows


def ours(port, jobs, procs) -> dict:
    name = f"api-{procs}-{time.monotonic_ns()}"
    rows = _spawn(_inserter, lambda i: (port, name, jobs // procs), procs)
    insert_rate = (jobs // procs * procs) / (max(r[1] for r in rows) - min(r[0] for r in rows))
    rows = _spawn(_consumer, lambda i: (port, name), procs)
    done = sum(r[2] for r in rows)
    pop_rate = done / (max(r[1] for r in rows) - min(r[0] for r in rows))
    open_queue(redis.Redis(port=port), name, QueueSettings(key_prefix="peers")).delete()
    return {"insert_per_second": insert_rate, "pop_ack_per_second": pop_rate}


def bullmq(port, jobs, concurrency) -> float | None:
    node = shutil.which("node")
    if not node or not (BULLMQ / "node_modules" / "bullmq").exists():
        if node and shutil.which("npm"):
            subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=BULLMQ, capture_output=True, timeout=300)
        if not node or not (BULLMQ / "node_modules" / "bullmq").exists():
            return None
    out = subprocess.run(
        [node, "process.js", str(port), str(jobs), str(concurrency)],
        cwd=BULLMQ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["jobs_per_second"]


def run(jobs=20_000, repeat=3) -> dict:
    runs: dict = {}
    with redis_server() as port:
        for _ in range(repeat):
            for c in (1, 8):
                row = ours(port, jobs, c)
                runs.setdefault(f"pq insert x{c}", []).append(row["insert_per_second"])
                runs.setdefault(f"pq pop+ack x{c}", []).append(row["pop_ack_per_second"])
                b = bullmq(port, jobs, c)
                if b is not None:
                    runs.setdefault(f"bullmq x{c}", []).append(b)
    med = {k: median(v) for k, v in runs.items()}
    ratios = {f"x{c}": med[f"pq pop+ack x{c}"] / med[f"bullmq x{c}"] for c in (1, 8) if f"bullmq x{c}" in med}
    return {"jobs": jobs, "repeat": repeat, "per_second": med, "ratio_vs_bullmq": ratios, "runs": runs}


def markdown(d) -> list[str]:
    m = d["per_second"]
    rows = []
    for c in (1, 8):
        b = m.get(f"bullmq x{c}")
        ratio = d["ratio_vs_bullmq"].get(f"x{c}")
        rows.append(
            [
                str(c),
                f"{m[f'pq insert x{c}']:.0f}",
                f"{m[f'pq pop+ack x{c}']:.0f}",
                "not available" if b is None else f"{b:.0f}",
                "-" if ratio is None else f"{ratio:.2f}",
            ]
        )
    return [
        f"# The queue API vs BullMQ ({d['jobs']:,} jobs per run, median of {d['repeat']} runs)",
        "",
        *table(
            ["concurrency", "pq insert/s", "pq pop+ack/s", "BullMQ jobs/s", "pop+ack / BullMQ (target >= 1.0)"],
            rows,
            left=0,
        ),
        "",
        "celery-pq concurrency is client processes; BullMQ's is one Worker's concurrency.",
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "peers",
        run,
        markdown,
        options=[("--jobs", int, 20_000), ("--repeat", int, 3)],
        smoke={"jobs": 200, "repeat": 1},
    )


if __name__ == "__main__":
    main()
