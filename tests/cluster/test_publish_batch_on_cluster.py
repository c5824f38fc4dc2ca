"""kombu's ``Producer.batch()`` on a Redis Cluster: queues on three masters, and a sharded queue
whose shards spread over them, each message stored once."""

from __future__ import annotations

import pytest
from kombu import Connection, Exchange, Producer, Queue

pytestmark = pytest.mark.cluster


def test_a_batch_over_three_masters_and_a_sharded_queue_stores_each_message_once(cluster, cluster_client, spread):
    options = {"cluster": True}
    sharded_options = {"cluster": True, "shards": 6}
    queues = [Queue(name, Exchange(name), routing_key=name) for name in spread]
    with Connection(cluster.pq_url, transport_options=options) as conn:
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=5000):
            for i in range(300):
                for q in queues:
                    producer.publish({"i": i}, exchange=q.exchange, routing_key=q.routing_key, declare=[q])
        channel = conn.default_channel
        assert [channel.queue(q.name).size() for q in queues] == [300, 300, 300]
    name = f"{spread[0]}-sharded"
    sq = Queue(name, Exchange(name), routing_key=name)
    with Connection(cluster.pq_url, transport_options=sharded_options) as conn:
        producer = Producer(conn.default_channel)
        with producer.batch(max_size=5000):
            for i in range(1200):
                producer.publish({"i": i}, exchange=sq.exchange, routing_key=name, declare=[sq])
        sharded = conn.default_channel.queue(name)
        assert sharded.size() == 1200
        masters = {cluster_client.get_node_from_key(s.keys.entries).name for s in sharded.shards}
        assert len(masters) > 1  # one flush wrote on several masters
        got = []
        with conn.Consumer(sq, callbacks=[lambda body, m: (got.append(body["i"]), m.ack())], prefetch_count=50):
            while len(got) < 1200:
                conn.drain_events(timeout=10)
        assert sorted(got) == list(range(1200))
