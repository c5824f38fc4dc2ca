"""Unique keys on the cluster: the key records are keys of the queue's hash tag, so the insert
that decides a key runs on the queue's master as on one Redis (a sharded queue places each key
on the shard of its hash)."""

from __future__ import annotations

import pytest
from kombu import Connection, Exchange, Producer, Queue

from celery_pq import publish_outcome

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("shards", [1, 3])
def test_unique_keys_on_a_cluster(cluster, spread, shards):
    options = {"cluster": True, "shards": shards}
    name = spread[0]
    q = Queue(name, Exchange(name), routing_key=name)
    with Connection(cluster.pq_url, transport_options=options) as conn:
        producer = Producer(conn.default_channel)
        for i in range(6):
            headers = {"id": f"{name}-{shards}-{i}", "pq_unique": f"k{i % 2}", "pq_unique_mode": "replace"}
            producer.publish({"i": i}, exchange=q.exchange, routing_key=name, declare=[q], headers=headers)
        kinds = [publish_outcome(f"{name}-{shards}-{i}").kind for i in range(6)]
        assert kinds == ["stored", "stored", "replaced", "replaced", "replaced", "replaced"]
        assert conn.default_channel.queue(name).size() == 2
