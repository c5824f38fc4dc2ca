"""The queue itself (no Celery): cost growth with queue size, and Redis memory per entry.

1. cost growth: ``PriorityQueue`` insert and pop+ack time per operation with 1,000 vs 1,000,000
   entries waiting (``--large``: 10,000,000, about 3 GB of Redis memory), both queues on one
   server, filled by a script of the benchmark's own (the queue's helpers, a minute for
   10M); then 1,000 single inserts and 1,000 pop+acks at each size in turn, 15 times (many
   short alternations: the machine's speed drifts within a run). Timed at the client and in
   Redis (the server's own time in the script calls, INFO commandstats). Target: big / 1k <= 1.3
   per operation, as the ratio of the medians and as the median of each repetition's ratio.
   Also the fill's time and Redis memory per entry at the big size.
2. memory: Redis memory per waiting entry beyond its payload (INFO used_memory less client
   buffers, ``common.data_memory``, before and after publishing N messages through kombu, minus
   the bytes of the stored message, divided by N), for celery-pq (technique T and S) and kombu's
   Redis transport, with Celery-like 36-character task ids. Target: <= 200 bytes.

    python -m benchmarks.queue_api [--large] [--smoke] [--out DIR]
"""

from __future__ import annotations

import sys
import time
import uuid

import redis
from kombu import Connection, Exchange, Producer, Queue

import celery_pq  # noqa: F401
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.scripts import compose

from .common import RedisTime, cli, data_memory, median, redis_server, table

FILL_PIECE = 10_000  # entries per call of the fill script (about 30 ms of Redis time each here)

# The benchmark's fill: entries written by the queue's own helpers (includes/index.lua, records.lua), as an
# insert with a generated id and no publish id writes them, without the per-call work of an
# insert: a 10,000,000-entry queue fills in a minute instead of six (insert_many: ~28,000/s).
_FILL = """--!include index.lua
local ii, pi, sq = KEYS[1], KEYS[2], KEYS[3]
local n, payload, ts = tonumber(ARGV[1]), ARGV[2], fmt(now_ms())
local first = redis.call('INCRBY', sq, n) - n
for seq = first + 1, first + n do
  local rank, eid = seq % 256, fmt(seq)
  redis.call('HSET', ii, eid, make_entry(0, fmt(rank * SEQ_SPAN + seq), '', '', '', ts, '|', payload))
  pi_push(pi, rank, seq, eid)
end
return n
"""


def fill(q, size) -> float:
    """Fill queue ``q`` with ``size`` more 64-byte entries over all 256 ranks; seconds it took.
    The first goes in by ``insert`` (it records the queue's mode), the rest by the fill script."""
    t = time.perf_counter()
    q.insert(b"x" * 64, 0)
    script = q.client.register_script(compose(_FILL))
    for start in range(1, size, FILL_PIECE):
        script(
            keys=[q.keys.entries, q.keys.priority_index, q.keys.sequence],
            args=[min(FILL_PIECE, size - start), b"x" * 64],
        )
    return time.perf_counter() - t


def measure(client, q, ops) -> dict:
    """``ops`` single inserts, then ``ops`` pop+acks (the queue ends at the size it had): time
    per operation at the client and in Redis (INFO commandstats: the script calls alone)."""
    redis_time = RedisTime(client)
    redis_time.start()
    t = time.perf_counter()
    for i in range(ops):
        q.insert(b"x" * 64, i % 256)
    insert = (time.perf_counter() - t) / ops
    insert_redis = redis_time.per_call(ops)
    redis_time.start()
    t = time.perf_counter()
    for _ in range(ops):
        q.ack(q.pop(1)[0])
    pop_ack = (time.perf_counter() - t) / ops
    return {
        "insert_us": insert * 1e6,
        "pop_ack_us": pop_ack * 1e6,
        "insert_redis_us": insert_redis,
        "pop_ack_redis_us": redis_time.per_call(ops),
    }


def _progress(line: str) -> None:
    print(f"queue_api: {line}", file=sys.stderr, flush=True)


def growth(client, small, big, ops, reps) -> dict:
    """Queues of ``small`` and ``big`` waiting entries side by side on one server, measured in
    turn ``reps`` times (medians), with the big one's fill time and Redis memory per entry."""
    queues = {}
    for size in (small, big):
        queues[size] = open_queue(client, f"growth-{size}", QueueSettings(key_prefix="benchq"))
        queues[size].delete()
    client.execute_command("MEMORY", "PURGE")
    before = data_memory(client)
    fill_s = fill(queues[big], big)
    used = data_memory(client) - before
    _progress(f"filled {big:,} entries in {fill_s:.0f} s, {used / big:.0f} B per entry")
    fill(queues[small], small)
    runs = {small: [], big: []}
    for _ in range(reps):
        for size in (small, big):
            runs[size].append(measure(client, queues[size], ops))
            _progress(f"{size:,} entries: {runs[size][-1]}")
    med = {size: {k: median([r[k] for r in runs[size]]) for k in runs[size][0]} for size in runs}
    return {
        "sizes": [small, big],
        "ops": ops,
        "reps": reps,
        "runs": {str(s): r for s, r in runs.items()},
        "cost_small": med[small],
        "cost_big": med[big],
        "growth": {k: med[big][k] / med[small][k] for k in med[small]},
        # each repetition's big against the small measured just before it: what drifts over
        # the run (the machine's speed) moves both alike
        "paired_growth": {k: median([b[k] / a[k] for a, b in zip(runs[small], runs[big])]) for k in med[small]},
        "fill_seconds": fill_s,
        "fill_per_second": big / fill_s,
        "memory_per_entry": used / big,
        "memory_per_entry_beyond_payload": used / big - 64,
        "used_memory_filled": used,
    }


def memory(port, url, options, n) -> float:
    client = redis.Redis(port=port)
    q = Queue("memq", Exchange("memq"), routing_key="memq")
    with Connection(url, transport_options=options) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        client.execute_command("MEMORY", "PURGE")
        before = data_memory(client)
        producer = Producer(conn.default_channel)
        headers = {"id": None}
        for _ in range(n):
            headers["id"] = str(uuid.uuid4())
            producer.publish("x" * 256, exchange=q.exchange, routing_key="memq", headers=headers)
        after = data_memory(client)
        if url.startswith("pq"):
            pq = open_queue(client, "memq", QueueSettings(key_prefix=options["key_prefix"]), declare=False)
            stored = len(pq.peek(1)[0].payload)
        else:
            stored = len(client.lindex("memq", 0))
        q(conn.default_channel).purge()
    return (after - before) / n - stored


def run(smoke=False, large=False) -> dict:
    """``large``: 10,000,000 entries against 1,000 (else 1,000,000): about 3 GB of Redis memory."""
    big = 10_000 if smoke else 10_000_000 if large else 1_000_000
    # many short alternations rather than a few long ones: the machine's speed drifts within a run
    ops, n, reps = (200, 2_000, 1) if smoke else (1_000, 100_000, 15)
    with redis_server() as port:  # a server of its own: the big queue goes with it
        data = growth(redis.Redis(port=port), 1_000, big, ops, reps)
    with redis_server() as port:
        data["memory_bytes_beyond_payload"] = {
            "celery-pq T": memory(port, f"pq://127.0.0.1:{port}/0", {"key_prefix": "memT"}, n),
            "celery-pq S": memory(port, f"pq://127.0.0.1:{port}/0", {"key_prefix": "memS", "technique": "S"}, n),
            "kombu-redis": memory(port, f"redis://127.0.0.1:{port}/0", {}, n),
        }
    data["entries_for_memory"] = n
    return data


def markdown(d) -> list[str]:
    small, big = d["sizes"]
    cs, cb, g, pg = d["cost_small"], d["cost_big"], d["growth"], d["paired_growth"]
    rows = [
        [label, f"{cs[k]:.1f} us", f"{cb[k]:.1f} us", f"{g[k]:.2f}", f"{pg[k]:.2f}"]
        for label, k in (
            ("insert (client)", "insert_us"),
            ("insert (Redis)", "insert_redis_us"),
            ("pop+ack (client)", "pop_ack_us"),
            ("pop+ack (Redis)", "pop_ack_redis_us"),
        )
    ]
    spread = [
        [
            f"{int(size):,}",
            "; ".join(f"{r['insert_us']:.0f}/{r['insert_redis_us']:.1f}" for r in runs),
            "; ".join(f"{r['pop_ack_us']:.0f}/{r['pop_ack_redis_us']:.1f}" for r in runs),
        ]
        for size, runs in d["runs"].items()
    ]
    return [
        "# The queue API",
        "",
        f"Cost per operation with {small:,} vs {big:,} entries waiting "
        f"({d['ops']:,} operations timed per repetition, one client, medians of {d['reps']}; client: wall "
        "time per call; Redis: the server's own time in the script calls, INFO commandstats):",
        "",
        *table(
            [
                "operation",
                f"{small:,} entries",
                f"{big:,} entries",
                "ratio (target <= 1.3)",
                "median of the repetitions' ratios",
            ],
            rows,
        ),
        "",
        "Each repetition (client us / Redis us):",
        "",
        *table(["entries", "insert", "pop+ack"], spread),
        "",
        f"Filling {big:,} entries (the benchmark's fill script, 64-byte payloads) took {d['fill_seconds']:.0f} s "
        f"({d['fill_per_second']:,.0f} entries/s); Redis memory {d['used_memory_filled'] / 2**20:,.0f} MiB, "
        f"{d['memory_per_entry']:.0f} B per entry, {d['memory_per_entry_beyond_payload']:.0f} B beyond the payload.",
        "",
        f"Redis memory per waiting entry beyond its payload ({d['entries_for_memory']:,} messages "
        "published through kombu, 36-character task ids):",
        "",
        *table(
            ["transport", "bytes (target <= 200)"],
            [[name, f"{v:.0f}"] for name, v in d["memory_bytes_beyond_payload"].items()],
        ),
    ]


def main(argv=None):
    return cli(argv, __doc__, "queue_api", run, markdown, options=[("--large", bool, False)], smoke={"smoke": True})


if __name__ == "__main__":
    main()
