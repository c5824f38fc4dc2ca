"""Idle-to-delivery latency: publish into an empty queue that an idle consumer is blocked on.

For each transport, a consumer process waits on an empty queue; the producer publishes one
message at a time (a pause between them, so the consumer is idle each time) stamped with the
system-wide monotonic clock, and the consumer records arrival minus stamp. Reported: p50/p99/max
in milliseconds, per transport, measured in one run on one redis-server.

    python -m benchmarks.latency [--messages 200] [--repeat 3]
"""

from __future__ import annotations

import multiprocessing as mp
import time

from kombu import Connection, Consumer, Exchange, Producer, Queue

from .common import cli, median, now_ns, percentile, redis_server, table, transports

QUEUE = "latency"


def _consumer(url, kwargs, n, ready, out):
    import celery_pq  # noqa: F401  (pq:// scheme)

    q = Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE)
    got = []

    def on_message(body, message):
        got.append(now_ns() - body["t"])
        message.ack()

    with Connection(url, **kwargs) as conn:
        with Consumer(conn, [q], callbacks=[on_message], prefetch_count=1):
            ready.set()
            deadline = time.monotonic() + 60 + n
            while len(got) < n and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=1)
                except TimeoutError:
                    pass
    out.put(got)


def measure(url, kwargs, n, gap=0.02) -> list[float]:
    import celery_pq  # noqa: F401

    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    q = Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE)
    with Connection(url, **kwargs) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        proc = ctx.Process(target=_consumer, args=(url, kwargs, n, ready, out))
        proc.start()
        ready.wait(30)
        time.sleep(0.5)  # let the consumer settle into its blocking wait
        producer = Producer(conn.default_channel)
        for _ in range(n):
            time.sleep(gap)
            producer.publish({"t": now_ns()}, exchange=q.exchange, routing_key=QUEUE)
        got = out.get(timeout=120)
        proc.join(30)
    return [ns / 1e6 for ns in got]


def measure_celery(port, url, kwargs, n, gap=0.02) -> list[float]:
    """The same through a real Celery worker (solo pool, prefetch 1) that is idle each time."""
    import json
    from pathlib import Path

    import redis
    from celery import Celery

    from celery_pq.testing import celery_env, start_worker

    root = Path(__file__).resolve().parent.parent
    options = kwargs.get("transport_options", {})
    env = celery_env(
        root, BENCH_BROKER=url, BENCH_OPTIONS=json.dumps(options), BENCH_RECORD=f"redis://127.0.0.1:{port}/0"
    )
    rec = redis.Redis(port=port)
    rec.delete("bench:latency")
    app = Celery("bench-client", broker=url)
    app.conf.broker_transport_options = options
    worker = start_worker(
        "benchmarks.celery_app", cwd=root, env=env, queues="bench", prefetch_multiplier=None, loglevel="warning"
    )
    try:
        app.send_task("bench.stamp", args=(now_ns(),), queue="bench")  # warm-up: the worker is up
        deadline = time.monotonic() + 60
        while rec.llen("bench:latency") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        rec.delete("bench:latency")
        time.sleep(0.5)
        for _ in range(n):
            time.sleep(gap)
            app.send_task("bench.stamp", args=(now_ns(),), queue="bench")
        deadline = time.monotonic() + 30 + n * gap
        while rec.llen("bench:latency") < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return [int(x) / 1e6 for x in rec.lrange("bench:latency", 0, -1)]
    finally:
        worker.stop(timeout=20)


def run(messages=200, repeat=3) -> dict:
    results = {}
    with redis_server() as port:
        for rep in range(repeat):
            cases = []
            for name, (url, kwargs) in transports(port).items():  # alternately, one server
                cases.append((name, lambda url=url, kwargs=kwargs: measure(url, kwargs, messages)))
                cases.append(
                    (
                        f"{name} (Celery worker)",
                        lambda url=url, kwargs=kwargs: measure_celery(port, url, kwargs, messages),
                    )
                )
            for name, fn in cases:
                lat = fn()
                row = results.setdefault(name, {"p50_ms": [], "p99_ms": [], "max_ms": [], "received": []})
                row["p50_ms"].append(percentile(lat, 50))
                row["p99_ms"].append(percentile(lat, 99))
                row["max_ms"].append(max(lat) if lat else float("nan"))
                row["received"].append(len(lat))
    summary = {name: {k: median(v) for k, v in row.items()} | {"runs": row} for name, row in results.items()}
    return {"messages": messages, "repeat": repeat, "results": summary}


def markdown(data) -> list[str]:
    r = data["results"]
    lines = [
        f"# Idle-to-delivery latency ({data['messages']} messages, median of {data['repeat']} runs)",
        "",
        *table(
            ["transport", "p50 ms", "p99 ms", "max ms", "received"],
            [
                [name, f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", f"{row['max_ms']:.2f}", f"{row['received']:.0f}"]
                for name, row in r.items()
            ],
        ),
        "",
    ]
    for suffix in ("", " (Celery worker)"):
        pq, kr = r.get("celery-pq" + suffix), r.get("kombu-redis" + suffix)
        if pq and kr:
            lines.append(
                f"p99 ratio celery-pq / kombu-redis{suffix}: {pq['p99_ms'] / kr['p99_ms']:.2f} (lower is better)  "
            )
    return lines


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "latency",
        run,
        markdown,
        options=[("--messages", int, 200), ("--repeat", int, 3)],
        smoke={"messages": 5, "repeat": 1},
    )


if __name__ == "__main__":
    main()
