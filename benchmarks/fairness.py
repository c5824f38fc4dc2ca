"""Fairness figures of the queue itself (no Celery), on a private redis-server.

1. Quiet-tenant dwell (the measure of SQS fair queues): tenant Q sends one entry every 50 ms
   while tenant F floods 20,000 at once; consumers pop one at a time (prefetch 1), work for
   ``--service-ms`` on each, and ack. Q's wait (sent -> popped) p50/p99 with the flood and
   without it, same consumers, same pace.
2. Pop cost with many tenants: pop+ack time per entry on a fair queue holding 50,000 entries
   spread over 5,000 tenants (10 each) vs over 5 tenants (10,000 each); ``--large``: 200,000
   entries over 100,000 tenants (2 each) vs 5. Both queues on one server, measured in turn
   three times, at the client and in Redis (INFO commandstats). Target: ratio <= 1.5.
3. Fair by cost (``fair_cost``): tenants A (200 ms tasks) and B (20 ms tasks), both with a
   backlog, on 4 worker processes (pop 1, work, ack): each tenant's share of the worker time,
   with equal weights (target 50/50 within 5 points) and weights 3:1 (target 75/25), under
   "time" and "declared" (A's tasks declare 10, B's 1), with "tasks" beside them; halfway, a
   tenant C (20 ms tasks) arrives: the time to its first delivery (target: within one task's
   time, 200 ms).

    python -m benchmarks.fairness [--large] [--smoke] [--out DIR]
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter

import redis

from celery_pq import Item
from celery_pq.queue import QueueSettings, open_queue

from .common import RedisTime, cli, median, now_ns, percentile, redis_server, table

PREFIX = "benchfair"


def _consumer(port, name, service_ms, stop, out):
    client = redis.Redis(port=port)
    q = open_queue(client, name, QueueSettings(key_prefix=PREFIX, fair=True))
    waits = []
    while not stop.is_set():
        got = q.pop(1)
        if not got:
            client.blpop([q.keys.wake], timeout=0.1)
            continue
        lease = got[0]
        if lease.tenant == "Q":
            waits.append((now_ns() - int(lease.payload)) / 1e6)
        if service_ms:
            time.sleep(service_ms / 1000)
        q.ack(lease)
    out.put(waits)


def dwell(port, flood: bool, quiet_sends: int, flood_size: int, consumers: int, service_ms: float) -> list[float]:
    name = f"dwell-{'flood' if flood else 'calm'}-{time.monotonic_ns()}"
    client = redis.Redis(port=port)
    q = open_queue(client, name, QueueSettings(key_prefix=PREFIX, fair=True))
    if flood:
        q.insert_many([Item(b"0", 5, None, tenant="F") for _ in range(flood_size)])
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_consumer, args=(port, name, service_ms, stop, out)) for _ in range(consumers)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    for _ in range(quiet_sends):
        q.insert(str(now_ns()).encode(), 5, tenant="Q")
        time.sleep(0.05)
    time.sleep(0.5)
    stop.set()
    waits = []
    for _ in procs:
        waits += out.get(timeout=60)
    for p in procs:
        p.join(30)
    q.purge()
    return waits


def tenant_cost(port, tenants: tuple[int, int], entries: int, ops: int, reps: int) -> dict:
    """Pop+ack cost on two fair queues of ``entries`` entries each, spread over ``tenants[0]``
    and ``tenants[1]`` tenants, side by side on one server, measured in turn ``reps`` times
    (``ops`` pop+acks each): microseconds per pop+ack at the client and in Redis."""
    client = redis.Redis(port=port)
    queues = {}
    for n in tenants:
        queues[n] = open_queue(client, f"cost-{n}-{time.monotonic_ns()}", QueueSettings(key_prefix=PREFIX, fair=True))
        for start in range(0, entries, 100_000):
            queues[n].insert_many(
                [Item(b"x" * 64, 5, None, tenant=f"t{i % n}") for i in range(start, min(entries, start + 100_000))]
            )
    runs = {str(n): [] for n in tenants}
    redis_time = RedisTime(client)
    for _ in range(reps):
        for n, q in queues.items():
            redis_time.start()
            start = time.perf_counter()
            for _ in range(ops):
                q.ack(q.pop(1)[0])
            runs[str(n)].append({"us": (time.perf_counter() - start) / ops * 1e6, "redis_us": redis_time.per_call(ops)})
    for q in queues.values():
        q.purge()
    return runs


#: Seconds of work of a task of each tenant (benchmark 3), and the cost it declares.
WORK = {"A": 0.2, "B": 0.02, "C": 0.02}
DECLARED = {"A": 10, "B": 1, "C": 1}
COST_CASES = [(cost, w) for w in (1, 3) for cost in ("tasks", "time", "declared")]


def _cost_worker(port, jobs, out):
    """A worker process of benchmark 3: for each job (queue, fair_cost, measured from, until),
    pop one at a time, work (sleep) and ack; its work per tenant inside the measured span and
    the time of its first delivery of each tenant."""
    client = redis.Redis(port=port)
    out.put("ready")
    while (job := jobs.get()) is not None:
        name, cost, begin, until = job
        q = open_queue(client, name, QueueSettings(key_prefix=PREFIX, fair=True, fair_cost=cost))
        busy, first = Counter(), {}
        while time.time() < until:
            got = q.pop(1)
            if not got:
                time.sleep(0.002)
                continue
            lease, start = got[0], time.time()
            first.setdefault(lease.tenant, start)
            time.sleep(WORK[lease.tenant])
            q.ack(lease)
            busy[lease.tenant] += max(0.0, min(time.time(), until) - max(start, begin))
        out.put((dict(busy), first))


def cost_shares(port, procs, jobs, out, cost: str, weight_a: int, seconds: float, warm: float) -> dict:
    """One case of benchmark 3: A's share of the worker time A and B used, and C's wait."""
    client = redis.Redis(port=port)
    name = f"cost-{cost}-{weight_a}-{time.monotonic_ns()}"
    q = open_queue(client, name, QueueSettings(key_prefix=PREFIX, fair=True, fair_cost=cost), declare=True)
    q.configure_tenants(weights={"A": weight_a})
    n = {t: int(seconds * len(procs) / WORK[t]) + 10 for t in ("A", "B")}
    for t in ("A", "B"):
        q.insert_many([Item(b"x", 5, None, tenant=t, cost=DECLARED[t]) for _ in range(n[t])])
    t0 = time.time()
    for _ in procs:
        jobs.put((name, cost, t0 + warm, t0 + seconds))
    time.sleep(warm + (seconds - warm) / 2)
    c_sent = time.time()
    q.insert_many([Item(b"x", 5, None, tenant="C", cost=DECLARED["C"]) for _ in range(50)])
    busy, first = Counter(), []
    for _ in procs:
        b, f = out.get(timeout=seconds + 60)
        busy.update(b)
        first.append(f.get("C"))
    left = {t: row["waiting"] for t, row in q.tenants().items()}
    q.purge()
    c_first = min((x for x in first if x is not None), default=None)
    return {
        "fair_cost": cost,
        "weights": f"{weight_a}:1",
        "worker_seconds": {t: round(busy[t], 3) for t in ("A", "B", "C")},
        "share_a": busy["A"] / (busy["A"] + busy["B"]) if busy["A"] + busy["B"] else None,
        "target_a": weight_a / (weight_a + 1),
        "c_first_ms": None if c_first is None else (c_first - c_sent) * 1000,
        "backlog_left": {t: left.get(t, 0) for t in ("A", "B")},
    }


def by_cost(port, smoke: bool) -> list[dict]:
    seconds, warm = (1.0, 0.2) if smoke else (14.0, 2.0)
    ctx = mp.get_context("spawn")
    jobs, out = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_cost_worker, args=(port, jobs, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for _ in procs:
        assert out.get(timeout=120) == "ready"
    try:
        return [cost_shares(port, procs, jobs, out, cost, w, seconds, warm) for cost, w in COST_CASES]
    finally:
        for _ in procs:
            jobs.put(None)
        for p in procs:
            p.join(30)


def run(smoke=False, large=False) -> dict:
    """``large``: 100,000 tenants (200,000 entries) against 5, instead of 5,000 (50,000 entries)."""
    quiet, flood_size, reps = (10, 500, 1) if smoke else (100, 20_000, 3)
    many, entries, ops = (
        (5_000, 10_000, 200) if smoke else (100_000, 200_000, 5_000) if large else (5_000, 50_000, 5_000)
    )
    consumers, service_ms = 2, 1.0
    data = {
        "dwell": {"calm": [], "flood": []},
        "params": {
            "quiet_sends": quiet,
            "flood": flood_size,
            "consumers": consumers,
            "service_ms": service_ms,
            "entries": entries,
            "ops": ops,
            "tenants": [5, many],
            "reps": reps,
        },
    }
    with redis_server() as port:
        for _ in range(reps):
            for label, flood in (("calm", False), ("flood", True)):
                w = dwell(port, flood, quiet, flood_size, consumers, service_ms)
                data["dwell"][label].append({"p50_ms": percentile(w, 50), "p99_ms": percentile(w, 99), "n": len(w)})
        data["pop_cost"] = tenant_cost(port, (5, many), entries, ops, reps)
        data["by_cost"] = by_cost(port, smoke)
    d, c = data["dwell"], data["pop_cost"]
    data["summary"] = {
        "quiet_p99_calm_ms": median([r["p99_ms"] for r in d["calm"]]),
        "quiet_p99_flood_ms": median([r["p99_ms"] for r in d["flood"]]),
        "pop_ack_us_5_tenants": median([r["us"] for r in c["5"]]),
        "pop_ack_us_many_tenants": median([r["us"] for r in c[str(many)]]),
        "pop_ack_redis_us_5_tenants": median([r["redis_us"] for r in c["5"]]),
        "pop_ack_redis_us_many_tenants": median([r["redis_us"] for r in c[str(many)]]),
    }
    s = data["summary"]
    s["dwell_ratio"] = s["quiet_p99_flood_ms"] / s["quiet_p99_calm_ms"]
    s["tenant_cost_ratio"] = s["pop_ack_us_many_tenants"] / s["pop_ack_us_5_tenants"]
    s["tenant_cost_ratio_redis"] = s["pop_ack_redis_us_many_tenants"] / s["pop_ack_redis_us_5_tenants"]
    for case in data["by_cost"]:
        key = f"share_a_{case['fair_cost']}_{case['weights'].replace(':', 'to')}"
        s[key] = case["share_a"]
    return data


def markdown(data) -> list[str]:
    s, p = data["summary"], data["params"]
    many = p["tenants"][1]
    return [
        "# Fairness figures",
        "",
        f"Quiet tenant Q sends {p['quiet_sends']} entries, one every 50 ms; {p['consumers']} consumers, "
        f"{p['service_ms']} ms of work per entry, prefetch 1. Flood: tenant F queues {p['flood']} entries first.",
        "",
        *table(
            ["", "Q's p99 wait, no flood", "Q's p99 wait, flood", "ratio (target <= 2)"],
            [
                [
                    "celery-pq fair queue",
                    f"{s['quiet_p99_calm_ms']:.2f} ms",
                    f"{s['quiet_p99_flood_ms']:.2f} ms",
                    f"{s['dwell_ratio']:.2f}",
                ]
            ],
        ),
        "",
        f"Pop+ack cost, fair queue of {p['entries']:,} entries ({p['ops']:,} operations timed per repetition, "
        f"one client, medians of {p['reps']}; client: wall time; Redis: the server's own time in the script calls):",
        "",
        *table(
            ["", "5 tenants", f"{many:,} tenants", "ratio (target <= 1.5)"],
            [
                [
                    "client",
                    f"{s['pop_ack_us_5_tenants']:.1f} us",
                    f"{s['pop_ack_us_many_tenants']:.1f} us",
                    f"{s['tenant_cost_ratio']:.2f}",
                ],
                [
                    "Redis",
                    f"{s['pop_ack_redis_us_5_tenants']:.1f} us",
                    f"{s['pop_ack_redis_us_many_tenants']:.1f} us",
                    f"{s['tenant_cost_ratio_redis']:.2f}",
                ],
            ],
        ),
        "",
        "Each repetition (client us / Redis us): "
        + "; ".join(
            f"{int(n):,} tenants " + ", ".join(f"{r['us']:.0f}/{r['redis_us']:.1f}" for r in runs)
            for n, runs in data["pop_cost"].items()
        ),
        "",
        "Fair by cost: A's tasks take 200 ms, B's 20 ms, both backlogged, 4 worker processes (pop 1, work, "
        "ack); A's share of the worker time A and B used (target: 50% within 5 points at 1:1, 75% at 3:1; "
        "declared: A's tasks declare 10, B's 1); tenant C (20 ms tasks) arrives halfway: ms to its first delivery "
        "(target: within one task's time, 200 ms).",
        "",
        *table(
            ["fair_cost", "weights A:B", "A's share of worker time", "target", "C's first delivery"],
            [
                [
                    c["fair_cost"],
                    c["weights"],
                    "-" if c["share_a"] is None else f"{100 * c['share_a']:.1f}%",
                    f"{100 * c['target_a']:.0f}%",
                    "-" if c["c_first_ms"] is None else f"{c['c_first_ms']:.0f} ms",
                ]
                for c in data.get("by_cost", [])
            ],
        ),
    ]


def main(argv=None):
    return cli(argv, __doc__, "fairness", run, markdown, options=[("--large", bool, False)], smoke={"smoke": True})


if __name__ == "__main__":
    main()
