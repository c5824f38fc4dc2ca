"""What the event log costs: publish and consume + ack throughput through kombu, the log off vs on.

One redis-server for the run; within each repetition the two settings alternate (each on a key
prefix of its own, so the switch one records does not reach the other); medians of the
repetitions and the ratio on / off (goal: at least 0.85, i.e. under 15% slower). Messages carry
Celery's ``id`` and ``task`` headers, so the log's ``enqueue`` events hold the task name.

1. publish: messages/s through ``kombu.Producer.publish``, one process, 256-byte bodies;
2. consume: messages/s received and acked through ``kombu.Consumer`` + ``drain_events``,
   prefetch 1 and prefetch 10, from a pre-filled queue.

Beside each rate, the time Redis spent per script call in that run (``INFO commandstats``,
EVALSHA), which other load on the machine changes less than the rates.

    python -m benchmarks.events_cost [--messages 5000] [--repeat 3] [--smoke] [--out DIR]
"""

from __future__ import annotations

import time
import uuid

import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

import celery_pq  # noqa: F401

from .common import cli, median, redis_server, table

BODY = "x" * 256
#: The event log's cap in the "on" runs (the README's example value).
CAP = 100_000
TARGET = 0.85


def _settings(port: int) -> dict:
    url = f"pq://127.0.0.1:{port}/0"
    return {
        "log off": (url, {"key_prefix": "bench-evoff"}),
        "log on": (url, {"key_prefix": "bench-evon", "event_log": CAP}),
    }


def _queue():
    return Queue("evc", Exchange("evc"), routing_key="evc")


def _publish(producer, q, n):
    for _ in range(n):
        producer.publish(
            BODY,
            exchange=q.exchange,
            routing_key="evc",
            priority=5,
            headers={"id": str(uuid.uuid4()), "task": "bench.tasks.noop"},
        )


def _script_usec(client) -> float:
    """Microseconds Redis spent per script call (FCALL, or EVALSHA where the server has no
    functions) since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    calls = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("fcall", "evalsha"))
    usec = sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("fcall", "evalsha"))
    return usec / calls if calls else 0.0


def publish_rate(url, options, n, client) -> tuple[float, float]:
    q = _queue()
    with Connection(url, transport_options=options) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        producer = Producer(conn.default_channel)
        client.config_resetstat()
        start = time.perf_counter()
        _publish(producer, q, n)
        rate = n / (time.perf_counter() - start)
        usec = _script_usec(client)
        q(conn.default_channel).purge()
    return rate, usec


def consume_rate(url, options, n, prefetch, client) -> tuple[float, float]:
    q = _queue()
    with Connection(url, transport_options=options) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        _publish(Producer(conn.default_channel), q, n)
    got = [0]

    def on_message(body, message):
        got[0] += 1
        message.ack()

    with Connection(url, transport_options=options) as conn:
        with Consumer(conn, [q], callbacks=[on_message], prefetch_count=prefetch):
            client.config_resetstat()
            start = time.perf_counter()
            while got[0] < n:
                try:
                    conn.drain_events(timeout=5)
                except TimeoutError:
                    break
            elapsed = time.perf_counter() - start
            usec = _script_usec(client)
    return got[0] / elapsed, usec


def run(messages=5000, repeat=3) -> dict:
    figures = {"publish": {}, "consume_prefetch_1": {}, "consume_prefetch_10": {}}
    usec = {fig: {} for fig in figures}
    with redis_server() as port:
        settings = _settings(port)
        client = redis.Redis(port=port)
        for _ in range(repeat):
            for name, (url, options) in settings.items():
                runs = {"publish": publish_rate(url, options, messages, client)}
                for pf in (1, 10):
                    runs[f"consume_prefetch_{pf}"] = consume_rate(url, options, messages, pf, client)
                for fig, (rate, us) in runs.items():
                    figures[fig].setdefault(name, []).append(rate)
                    usec[fig].setdefault(name, []).append(us)
        stream = "bench-evon:{evc}:ev"
        logged = {"entries": client.xlen(stream), "memory_bytes": client.memory_usage(stream) or 0}
        client.close()
    summary = {}
    for fig, rows in figures.items():
        med = {name: median(v) for name, v in rows.items()}
        summary[fig] = {
            "per_second": med,
            "ratio": med["log on"] / med["log off"],
            "runs": rows,
            "script_usec": {name: median(v) for name, v in usec[fig].items()},
        }
    return {"messages": messages, "repeat": repeat, "cap": CAP, "stream": logged, "results": summary}


def markdown(data) -> list[str]:
    rows = [
        [
            fig,
            f"{r['per_second']['log off']:,.0f}",
            f"{r['per_second']['log on']:,.0f}",
            f"{r['ratio']:.2f}",
            "yes" if r["ratio"] >= TARGET else "no",
            f"{r['script_usec']['log off']:.1f}",
            f"{r['script_usec']['log on']:.1f}",
        ]
        for fig, r in data["results"].items()
    ]
    return [
        f"# The event log's cost through kombu ({data['messages']} messages, median of {data['repeat']} runs)",
        "",
        *table(
            [
                "figure",
                "log off msg/s",
                "log on msg/s",
                "on / off",
                f"within {1 - TARGET:.0%}",
                "log off: Redis µs per script call",
                "log on: Redis µs per script call",
            ],
            rows,
        ),
        "",
        f"The stream after the run: {data['stream']['entries']:,} entries (cap ~{data['cap']:,}), "
        f"{data['stream']['memory_bytes']:,} bytes.",
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "events_cost",
        run,
        markdown,
        options=[("--messages", int, 5000), ("--repeat", int, 3)],
        smoke={"messages": 50, "repeat": 1},
    )


if __name__ == "__main__":
    main()
