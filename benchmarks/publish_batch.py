"""Publish batches through kombu's ``Producer.batch()``: celery-pq vs kombu's Redis transport.

One redis-server for the run; in each repetition, on the same server and in turn: kombu's Redis
transport's own batches (a pipeline of LPUSH per flush), celery-pq's batches (an insert script
call per 200 messages of a queue, sent as the batch fills, every reply read at the flush,
``celery_pq/transport/batches.py``), and celery-pq publishing one by one (one round trip per message). Messages of 256 bytes at priority 5, ``--batch`` per batch (1,000),
``--batches`` batches per measurement; medians of ``--repeat`` runs.

Two ways to publish:

- ``direct``: to the queue by name (the default exchange): kombu's best case, one LPUSH per
  message and nothing else.
- ``exchange``: through the queue's direct exchange, as Celery publishes a task: kombu's Redis
  transport looks the exchange's bindings up in Redis for every message (a round trip each,
  also inside a batch); celery-pq keeps them cached.

Goals: celery-pq's batches at least kombu's batch rate (ratio >= 1), and at least 5x celery-pq's
one-by-one publish.

    python -m benchmarks.publish_batch [--batch 1000] [--batches 10] [--repeat 3] [--smoke] [--out DIR]
"""

from __future__ import annotations

import time

from kombu import Connection, Exchange, Producer, Queue

import celery_pq  # noqa: F401

from .common import cli, median, redis_server, table, transports

BODY = "x" * 256
WAYS = ("direct", "exchange")


def _rate(url, kwargs, way: str, batch: int, batches: int, batched: bool) -> float:
    """Messages per second published ``batches`` x ``batch`` (in producer batches or not)."""
    q = Queue("pbatch", Exchange("pbatch"), routing_key="pbatch")
    target = {"routing_key": "pbatch"} if way == "direct" else {"exchange": q.exchange, "routing_key": "pbatch"}
    with Connection(url, **kwargs) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        producer = Producer(conn.default_channel)
        start = time.perf_counter()
        for _ in range(batches):
            if batched:
                with producer.batch(max_size=batch):
                    for _ in range(batch):
                        producer.publish(BODY, priority=5, **target)
            else:
                for _ in range(batch):
                    producer.publish(BODY, priority=5, **target)
        rate = batch * batches / (time.perf_counter() - start)
        stored = q(conn.default_channel).purge()
        assert stored == batch * batches, f"{url}: {stored} stored of {batch * batches}"
    return rate


def run(batch=1000, batches=10, repeat=3) -> dict:
    runs: dict = {way: {"kombu-redis batch": [], "celery-pq batch": [], "celery-pq one by one": []} for way in WAYS}
    with redis_server() as port:
        urls = transports(port)
        for _ in range(repeat):
            for way in WAYS:
                row = runs[way]
                row["kombu-redis batch"].append(_rate(*urls["kombu-redis"], way, batch, batches, True))
                row["celery-pq batch"].append(_rate(*urls["celery-pq"], way, batch, batches, True))
                row["celery-pq one by one"].append(_rate(*urls["celery-pq"], way, batch, batches, False))
    results = {}
    for way, row in runs.items():
        med = {name: median(v) for name, v in row.items()}
        results[way] = {
            "per_second": med,
            "vs_kombu_batch": med["celery-pq batch"] / med["kombu-redis batch"],
            "vs_one_by_one": med["celery-pq batch"] / med["celery-pq one by one"],
            "runs": row,
        }
    return {"batch": batch, "batches": batches, "repeat": repeat, "results": results}


TARGETS = {"vs_kombu_batch": 1.0, "vs_one_by_one": 5.0}


def markdown(data) -> list[str]:
    rows = []
    for way, r in data["results"].items():
        rate = r["per_second"]
        rows.append(
            [
                way,
                f"{rate['celery-pq batch']:.0f}",
                f"{rate['kombu-redis batch']:.0f}",
                f"{rate['celery-pq one by one']:.0f}",
                f"{r['vs_kombu_batch']:.2f} (>= {TARGETS['vs_kombu_batch']})",
                f"{r['vs_one_by_one']:.1f} (>= {TARGETS['vs_one_by_one']})",
            ]
        )
    return [
        f"# Publish batches ({data['batch']} messages a batch, {data['batches']} batches, "
        f"median of {data['repeat']} runs)",
        "",
        *table(
            [
                "publish",
                "celery-pq batch msg/s",
                "kombu-redis batch msg/s",
                "celery-pq one by one msg/s",
                "ratio to kombu's batch",
                "ratio to one by one",
            ],
            rows,
        ),
        "",
        "`direct`: to the queue by name; `exchange`: through the queue's exchange, as Celery publishes.",
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "publish_batch",
        run,
        markdown,
        options=[("--batch", int, 1000), ("--batches", int, 10), ("--repeat", int, 3)],
        smoke={"batch": 100, "batches": 1, "repeat": 1},
    )


if __name__ == "__main__":
    main()
