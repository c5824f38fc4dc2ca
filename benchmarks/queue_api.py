"""The queue itself (no Celery): cost growth with queue size, and Redis memory per entry.

1. cost growth: ``PriorityQueue`` insert and pop+ack time per operation with 1,000 vs 1,000,000
   entries waiting (filled with ``insert_many``; then --ops single inserts and --ops pop+acks
   timed at each size). Target: 1M / 1k <= 1.3 per operation.
2. memory: Redis memory per waiting entry beyond its payload (INFO used_memory before and after
   publishing N messages through kombu, minus the bytes of the stored message, divided by N),
   for celery-pq (technique T and S) and kombu's Redis transport, with Celery-like 36-character
   task ids. Target: <= 200 bytes.

    python -m benchmarks.queue_api [--smoke] [--out DIR]
"""

from __future__ import annotations

import time
import uuid

import redis
from kombu import Connection, Exchange, Producer, Queue

import celery_pq  # noqa: F401
from celery_pq import PriorityQueue

from .common import cli, redis_server, table


def cost(client, size, ops) -> dict:
    q = PriorityQueue(client, f"growth-{size}", key_prefix="benchq")
    q.delete()
    for start in range(0, size, 100_000):
        q.insert_many([(b"x" * 64, i % 256, None) for i in range(start, min(size, start + 100_000))])
    t = time.perf_counter()
    for i in range(ops):
        q.insert(b"x" * 64, i % 256)
    insert = (time.perf_counter() - t) / ops
    t = time.perf_counter()
    for _ in range(ops):
        q.ack(q.pop(1)[0])
    pop_ack = (time.perf_counter() - t) / ops
    q.delete()
    return {"insert_us": insert * 1e6, "pop_ack_us": pop_ack * 1e6}


def memory(port, url, options, n) -> float:
    client = redis.Redis(port=port)
    q = Queue("memq", Exchange("memq"), routing_key="memq")
    with Connection(url, transport_options=options) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        client.execute_command("MEMORY", "PURGE")
        before = client.info("memory")["used_memory"]
        producer = Producer(conn.default_channel)
        headers = {"id": None}
        for _ in range(n):
            headers["id"] = str(uuid.uuid4())
            producer.publish("x" * 256, exchange=q.exchange, routing_key="memq", headers=headers)
        after = client.info("memory")["used_memory"]
        if url.startswith("pq"):
            pq = PriorityQueue.open(client, "memq", key_prefix=options["key_prefix"])
            stored = len(pq.peek(1)[0].payload)
        else:
            stored = len(client.lindex("memq", 0))
        q(conn.default_channel).purge()
    return (after - before) / n - stored


def run(smoke=False) -> dict:
    big, ops, n = (10_000, 200, 2_000) if smoke else (1_000_000, 5_000, 100_000)
    with redis_server() as port:
        client = redis.Redis(port=port)
        small_cost = cost(client, 1_000, ops)
        big_cost = cost(client, big, ops)
        mem = {
            "celery-pq T": memory(port, f"pq://127.0.0.1:{port}/0", {"key_prefix": "memT"}, n),
            "celery-pq S": memory(port, f"pq://127.0.0.1:{port}/0", {"key_prefix": "memS", "technique": "S"}, n),
            "kombu-redis": memory(port, f"redis://127.0.0.1:{port}/0", {}, n),
        }
    growth = {op: big_cost[op] / small_cost[op] for op in small_cost}
    return {"sizes": [1_000, big], "ops": ops, "entries_for_memory": n, "cost_1k": small_cost,
            "cost_big": big_cost, "growth": growth, "memory_bytes_beyond_payload": mem}


def markdown(d) -> list[str]:
    c1, cb, g = d["cost_1k"], d["cost_big"], d["growth"]
    return ["# The queue API", "", f"Cost per operation with {d['sizes'][0]:,} vs {d['sizes'][1]:,} entries waiting "
            f"({d['ops']} operations timed, one client):", "",
            *table(["operation", "1k entries", "big", "ratio (target <= 1.3)"],
                   [[op[:-3], f"{c1[op]:.1f} us", f"{cb[op]:.1f} us", f"{g[op]:.2f}"] for op in ("insert_us", "pop_ack_us")]),
            "", f"Redis memory per waiting entry beyond its payload ({d['entries_for_memory']:,} messages "
            "published through kombu, 36-character task ids):", "",
            *table(["transport", "bytes (target <= 200)"],
                   [[name, f"{v:.0f}"] for name, v in d["memory_bytes_beyond_payload"].items()])]


def main(argv=None):
    return cli(argv, __doc__, "queue_api", run, markdown, smoke={"smoke": True})


if __name__ == "__main__":
    main()
