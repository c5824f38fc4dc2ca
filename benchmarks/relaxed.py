"""The relaxed priority queue measured: rank error (PEI) and throughput of a sharded queue, on one
private redis-server (the queue itself, no Celery).

PEI of a delivery: how many entries waiting at that moment outranked the one delivered (a better
priority, or the same priority published earlier: publish order breaks ties, as in a plain
queue). A plain queue (one shard) gives 0 with one consumer. The run is the hold model of the
relaxed-queue literature: the queue is filled with ``--size`` entries of uniform random priority
0..255, then each consumer repeats pop one, publish one new (uniform random priority), ack, for
``--ops`` pops in all, so the queue holds about ``--size`` entries throughout (the paper's
consumer lag). Every publish and delivery is stamped with the system-wide monotonic clock; the
PEI of each delivery is counted afterwards from the merged stamps (a Fenwick tree over the
entries' total order). Consumers are threads of one process, each with its own connection.

For each shard count N in {1, 4, 16}, peek count k in {1, 2, 4} (k <= N) and consumer count
in {1, 4, 16}: the PEI distribution (``histogram``: PEI -> deliveries), mean, percentiles,
P(PEI = 0), and the share of pops that took the second-best peeked shard or had to look beyond
the k peeked; with the most consumers, also without the second-best check for a beaten shard. The JSON keeps N, k, consumers, size and the whole distribution, for the
simulator (``celery_pq.sim``) to predict the same cases. For k = 2 and one consumer it also
gives the closed form of the MultiQueue's expected rank error, (5/6)N - 1 + 1/(6N) (Walzer and
Williams, ESA 2025), for reference.

Throughput against N: pop+ack (and publish) per second with 4 consumers and k = 2.

Beside each measured PEI, the simulator's prediction for the same N, k, consumer count and
lag = ``--size`` (``celery_pq.sim.predict``, with the second-best check on or off as measured).

``--cluster``: the same on a local Redis Cluster of 3 masters and 3 replicas
(``celery_pq.testing.RedisCluster``), each consumer thread with its own cluster client; the
shards of each N spread over the masters (the placement is recorded). Results go to
``relaxed-cluster.json`` and ``.md`` instead.

    python -m benchmarks.relaxed [--cluster] [--size 1000] [--ops 2000] [--smoke] [--out DIR]
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager

import redis

from celery_pq import Item
from celery_pq.queue import open_queue
from celery_pq.queue.sharded import ShardedQueue
from celery_pq.sim import predict
from celery_pq.testing import RedisCluster
from celery_pq.transport.options import Options

from .common import cli, now_ns, percentile, redis_server, table

PREFIX = "benchrelaxed"
SHARDS = (1, 4, 16)
PEEKS = (1, 2, 4)
CONSUMERS = (1, 4, 16)


def _open(client, name, shards, peek, seed):
    q = open_queue(client, name, Options(key_prefix=PREFIX, shards=shards, peek=peek).queue_settings(name))
    if shards > 1:  # a stream of its own: drawn from the priorities' seed, shards would follow priorities
        q = ShardedQueue(q.shards, name, peek=peek, rng=random.Random(f"shards-{seed}"))
    return q


def _consume(connect, name, shards, peek, seed, budget, out):
    """One consumer thread: pop one, publish one, ack, until the shared budget runs out."""
    client = connect()
    q = _open(client, name, shards, peek, seed)
    rng = random.Random(seed)
    pops, pubs = [], []
    while budget.take():
        got = q.pop(1)
        t = now_ns()
        if not got:
            continue
        lease = got[0]
        pops.append((t, lease.priority, lease.payload))
        priority = rng.randrange(256)
        stamp = f"{now_ns()}:{seed}".encode()
        q.insert(stamp, priority)
        pubs.append((now_ns(), priority, stamp))
        q.ack(lease)
    client.close()
    out.append((pops, pubs))


class Budget:
    def __init__(self, n):
        self.left = n
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            self.left -= 1
            return self.left >= 0


def pei_values(prefill, pops, pubs) -> list[int]:
    """PEI of each delivery, from the stamps: prefill [(priority, payload)], pops and pubs
    [(t_ns, priority, payload)]. An entry's place in the total order: higher priority first,
    then earlier publish (its stamp)."""

    def order(priority, payload):
        return (-priority, int(payload.split(b":")[0]), payload)

    keys = sorted({order(p, s) for p, s in prefill} | {order(p, s) for _, p, s in pubs})
    index = {k: i + 1 for i, k in enumerate(keys)}
    tree = [0] * (len(keys) + 1)

    def add(i, d):
        while i <= len(keys):
            tree[i] += d
            i += i & -i

    def below(i):  # entries waiting with a place before i
        s = 0
        i -= 1
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    for p, s in prefill:
        add(index[order(p, s)], 1)
    events = sorted([(t, 1, p, s) for t, p, s in pops] + [(t, 0, p, s) for t, p, s in pubs])
    out = []
    for _, is_pop, p, s in events:
        i = index[order(p, s)]
        if is_pop:
            out.append(below(i))
            add(i, -1)
        else:
            add(i, 1)
    return out


def one_case(connect, shards, peek, consumers, size, ops, seed) -> dict:
    client = connect()
    name = f"r{shards}-{peek}-{consumers}-{time.monotonic_ns()}"
    q = _open(client, name, shards, peek, seed)
    rng = random.Random(seed)
    base = now_ns() - 10**12  # prefill stamps come before every publish of the run
    prefill = [(rng.randrange(256), f"{base + i}:p".encode()) for i in range(size)]
    for start in range(0, size, 500):
        q.insert_many([Item(payload, priority) for priority, payload in prefill[start : start + 500]])
    budget, out = Budget(ops), []
    threads = [
        threading.Thread(target=_consume, args=(connect, name, shards, peek, seed * 100 + c, budget, out))
        for c in range(consumers)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    pops = [x for o in out for x in o[0]]
    pubs = [x for o in out for x in o[1]]
    values = pei_values(prefill, pops, pubs)
    q.purge()
    q.delete()
    client.close()
    hist = Counter(values)
    n = len(values)
    predicted = predict(shards, peek, consumers, size, second_best=True, seed=seed)
    return {
        "shards": shards,
        "peek": peek,
        "consumers": consumers,
        "size": size,
        "deliveries": n,
        "mean": sum(values) / n,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "p_zero": hist[0] / n,
        "pops_per_second": n / elapsed,
        "multiqueue_closed_form": (5 / 6) * shards - 1 + 1 / (6 * shards) if peek == 2 and shards > 1 else None,
        "predicted": {k: predicted[k] for k in ("mean", "p50", "p90", "p99", "p_zero")},
        "histogram": {str(k): hist[k] for k in sorted(hist)},
    }


@contextmanager
def servers(cluster: bool):
    """(connect, placement): ``connect()`` gives a new client of one private redis-server, or of
    a local Redis Cluster; ``placement(n)``: how many of the n shards each master serves."""
    if not cluster:
        with redis_server() as port:
            yield (lambda: redis.Redis(port=port)), (lambda n: {str(port): n})
        return
    with RedisCluster() as c:

        def placement(n):
            client = c.client()
            q = open_queue(client, "placement", Options(key_prefix=PREFIX, shards=n).queue_settings("placement"))
            ports = Counter(str(c.master_of(s.keys.entries).port) for s in q.shards)
            client.close()
            return dict(sorted(ports.items()))

        yield c.client, placement


def run(size: int, ops: int, consumers: str, seed: int = 14, cluster: bool = False) -> dict:
    counts = [int(c) for c in consumers.split(",")]
    cases = []
    with servers(cluster) as (connect, placement):
        for shards in SHARDS:
            for peek in PEEKS:
                if peek > shards or (shards == 1 and peek != PEEKS[0]):
                    continue  # k is capped at N; one shard has nothing to peek
                for c in counts:
                    cases.append(one_case(connect, shards, peek, c, size, ops, seed))
        tput = {}
        for shards in SHARDS:
            row = one_case(connect, shards, min(2, shards), 4, size, ops, seed)
            tput[str(shards)] = row["pops_per_second"]
        shards_per_master = {str(n): placement(n) for n in SHARDS}
    machine = (
        "a local Redis Cluster (3 masters, 3 replicas: six redis-servers) on the same machine, consumers "
        "as threads of one process with a cluster client each"
        if cluster
        else "one redis-server (no cluster: every shard on the same node), consumers as threads of one "
        "process with a connection each"
    )
    return {
        "size": size,
        "ops": ops,
        "consumers": counts,
        "seed": seed,
        "cluster": cluster,
        "cases": cases,
        "shards_per_master": shards_per_master,
        "throughput_pops_per_second_by_shards": tput,
        "throughput_ratio_16_to_1": tput["16"] / tput["1"],
        "machine": machine + ", a 2-core machine shared with other work",
    }


def markdown(data) -> list[str]:
    lines = [
        "# Relaxed priority queue: rank error (PEI) and throughput",
        "",
        f"Hold model: {data['size']} entries waiting, {data['ops']} pop-publish-ack rounds per case, "
        f"{data['machine']}.",
        "",
    ]
    if data.get("cluster"):
        lines += [
            "Shards per master (by port): "
            + "; ".join(
                f"N = {n}: {', '.join(f'{port}: {k}' for port, k in per.items())}"
                for n, per in data["shards_per_master"].items()
            )
            + ".",
            "",
        ]
    lines += ["## PEI (entries waiting that outranked the one delivered)", ""]
    rows = []
    for c in data["cases"]:
        closed = f"{c['multiqueue_closed_form']:.2f}" if c["multiqueue_closed_form"] is not None else ""
        rows.append(
            [
                str(c["shards"]),
                str(c["peek"]),
                str(c["consumers"]),
                f"{c['mean']:.2f}",
                closed,
                f"{c['p50']:.0f}",
                f"{c['p90']:.0f}",
                f"{c['p99']:.0f}",
                str(c["max"]),
                f"{100 * c['p_zero']:.0f}%",
                _predicted(c, "mean", "{:.2f}"),
                _predicted(c, "p90", "{:.0f}"),
                _predicted(c, "p_zero", "{:.0%}"),
            ]
        )
    lines += table(
        [
            "N",
            "k",
            "consumers",
            "mean",
            "MultiQueue (5/6)N-1+1/(6N)",
            "p50",
            "p90",
            "p99",
            "max",
            "P(PEI=0)",
            "predicted mean",
            "predicted p90",
            "predicted P(PEI=0)",
        ],
        rows,
        left=3,
    )
    lines += [
        "",
        '"predicted": the simulator (celery_pq.sim.predict) for the same N, k, consumers and lag = the queue\'s size.',
    ]
    lines += ["", "## Throughput against the number of shards (4 consumers, k = 2)", ""]
    t = data["throughput_pops_per_second_by_shards"]
    base = t["1"]
    lines += table(
        ["N", "pop+publish+ack per s", "ratio to N = 1"], [[n, f"{v:.0f}", f"{v / base:.2f}"] for n, v in t.items()]
    )
    return lines


def _predicted(case, key, form) -> str:
    got = case.get("predicted")
    return form.format(got[key]) if got else ""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cluster = "--cluster" in argv
    argv = [a for a in argv if a != "--cluster"]

    def run_on(**kw):
        return run(**kw, cluster=cluster)

    return cli(
        argv,
        __doc__,
        "relaxed-cluster" if cluster else "relaxed",
        run_on,
        markdown,
        options=(("--size", int, 1000), ("--ops", int, 2000), ("--consumers", str, "1,4,16"), ("--seed", int, 14)),
        smoke={"size": 60, "ops": 60, "consumers": "1,4"},
    )


if __name__ == "__main__":
    main()
