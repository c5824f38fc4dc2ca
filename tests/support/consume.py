"""kombu helpers shared by the transport tests."""

import time

from kombu import Consumer, Exchange, Producer, Queue


def make_queue(name="kq"):
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def publish_numbers(conn, queue, numbers):
    """Declare ``queue`` and publish ``{"i": i}`` for each number; returns the producer."""
    producer = Producer(conn.default_channel)
    queue(conn.default_channel).declare()
    for i in numbers:
        producer.publish({"i": i}, exchange=queue.exchange, routing_key=queue.routing_key)
    return producer


def drain(conn, queue, n, timeout=5, ack=True, prefetch=1, on_message=None):
    """Consume until ``n`` messages came (or ``timeout``); [(body, message)]. ``on_message(body)``
    runs first for each (it may raise)."""
    got = []

    def cb(body, message):
        if on_message is not None:
            on_message(body)
        got.append((body, message))
        if ack:
            message.ack()

    with Consumer(conn, [queue], callbacks=[cb], prefetch_count=prefetch):
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.3)
            except TimeoutError:
                pass
    return got


def pop_all(q, count=10):
    """Pop and ack everything ``q`` (a PriorityQueue) delivers, ``count`` a call; the entry ids in
    delivery order."""
    got = []
    while True:
        leases = q.pop(count)
        if not leases:
            return got
        got += [lease.id for lease in leases]
        q.ack(leases)
