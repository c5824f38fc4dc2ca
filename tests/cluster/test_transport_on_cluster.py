"""The kombu transport on the cluster: a consumer of queues on three masters blocks on all three
at once and is woken by a publish to any of them; fanout goes by sharded pub/sub."""

from __future__ import annotations

import threading
import time

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

pytestmark = pytest.mark.cluster


def test_a_consumer_of_three_masters_is_woken_by_each(cluster, spread):
    # block_seconds far beyond the test's patience: only a wake token can end a wait in time
    options = {"cluster": True, "block_seconds": 60}
    got: list = []
    with (
        Connection(cluster.pq_url, transport_options=options) as conn,
        Connection(cluster.pq_url, transport_options=options) as other,
    ):
        queues = [Queue(name, Exchange(name), routing_key=name) for name in spread]
        fanout = Exchange(f"{spread[0]}-fx", type="fanout")
        fan = Queue(f"{spread[0]}-fan", fanout)
        channel = conn.channel()
        consumer = Consumer(channel, [*queues, fan], callbacks=[lambda body, m: (got.append(body), m.ack())])
        consumer.consume()
        producer = Producer(other.channel())
        with pytest.raises(TimeoutError):  # nothing waiting: it blocks (once per master)
            conn.drain_events(timeout=0.3)
        for name in reversed(spread):
            # When a publish lands on one master while the consumer waits on all three
            timer = threading.Timer(0.3, producer.publish, ({"to": name},), {"exchange": name, "routing_key": name})
            timer.start()
            conn.drain_events(timeout=20)
            timer.join()
            # Then it is delivered at once, woken by that master's wake list
            assert got[-1] == {"to": name}
        assert channel.waits.counters["wakeups"] >= 3 and channel.waits.counters["timeouts"] == 0
        producer.publish({"fan": 1}, exchange=fanout, declare=[fanout])
        deadline = time.monotonic() + 20
        while got[-1] != {"fan": 1} and time.monotonic() < deadline:
            conn.drain_events(timeout=20)
        assert got[-1] == {"fan": 1}
