"""Publish and consume throughput through kombu, celery-pq vs kombu's Redis transport.

One redis-server for the run; transports alternate within each repetition; medians of the
repetitions and the ratio celery-pq / kombu-redis. Where RabbitMQ answers on localhost:5672,
kombu on RabbitMQ with a priority queue (x-max-priority 255) is a third column.

1. publish: messages/s through ``kombu.Producer.publish``, one process, 256-byte bodies;
2. consume: messages/s received and acked through ``kombu.Consumer`` + ``drain_events``,
   prefetch 1 and prefetch 10, from a pre-filled queue.

    python -m benchmarks.throughput [--messages 5000] [--repeat 3] [--smoke] [--out DIR]
"""

from __future__ import annotations

import time

from kombu import Connection, Consumer, Exchange, Producer, Queue

import celery_pq  # noqa: F401

from .common import cli, median, rabbitmq_url, redis_server, transports, versus_table

BODY = "x" * 256


def _queue(url=""):
    if url.startswith("amqp"):  # a priority queue, as Celery users on RabbitMQ declare it
        return Queue("tput-pri", Exchange("tput-pri"), routing_key="tput", queue_arguments={"x-max-priority": 255})
    return Queue("tput", Exchange("tput"), routing_key="tput")


def publish_rate(url, kwargs, n) -> float:
    q = _queue(url)
    with Connection(url, **kwargs) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        producer = Producer(conn.default_channel)
        start = time.perf_counter()
        for _ in range(n):
            producer.publish(BODY, exchange=q.exchange, routing_key="tput", priority=5)
        rate = n / (time.perf_counter() - start)
        q(conn.default_channel).purge()
    return rate


def consume_rate(url, kwargs, n, prefetch) -> float:
    q = _queue(url)
    with Connection(url, **kwargs) as conn:
        q(conn.default_channel).declare()
        q(conn.default_channel).purge()
        producer = Producer(conn.default_channel)
        for _ in range(n):
            producer.publish(BODY, exchange=q.exchange, routing_key="tput", priority=5)
    got = [0]

    def on_message(body, message):
        got[0] += 1
        message.ack()

    with Connection(url, **kwargs) as conn:
        with Consumer(conn, [q], callbacks=[on_message], prefetch_count=prefetch):
            start = time.perf_counter()
            while got[0] < n:
                try:
                    conn.drain_events(timeout=5)
                except TimeoutError:
                    break
            elapsed = time.perf_counter() - start
    return got[0] / elapsed


def run(messages=5000, repeat=3) -> dict:
    figures = {"publish": {}, "consume_prefetch_1": {}, "consume_prefetch_10": {}}
    rabbit = rabbitmq_url()
    with redis_server() as port:
        columns = dict(transports(port))
        if rabbit:
            columns["rabbitmq"] = (rabbit, {})
        for _ in range(repeat):
            for name, (url, kwargs) in columns.items():
                figures["publish"].setdefault(name, []).append(publish_rate(url, kwargs, messages))
                for pf in (1, 10):
                    figures[f"consume_prefetch_{pf}"].setdefault(name, []).append(
                        consume_rate(url, kwargs, messages, pf)
                    )
    summary = {}
    for fig, rows in figures.items():
        med = {name: median(v) for name, v in rows.items()}
        summary[fig] = {"per_second": med, "ratio": med["celery-pq"] / med["kombu-redis"], "runs": rows}
    return {"messages": messages, "repeat": repeat, "rabbitmq": bool(rabbit), "results": summary}


TARGETS = {"publish": 2.0, "consume_prefetch_1": 1.5, "consume_prefetch_10": 2.0}


def markdown(data) -> list[str]:
    return [
        f"# Throughput through kombu ({data['messages']} messages, median of {data['repeat']} runs)",
        "",
        *versus_table("figure", "msg/s", data["results"], "per_second", TARGETS.__getitem__),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "throughput",
        run,
        markdown,
        options=[("--messages", int, 5000), ("--repeat", int, 3)],
        smoke={"messages": 50, "repeat": 1},
    )


if __name__ == "__main__":
    main()
