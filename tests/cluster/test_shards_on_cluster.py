"""A sharded queue (the relaxed priority queue) on the local Redis Cluster: its shards land on
every master; a kombu consumer blocks once per shard tag, each wait on its tag's master, and is
woken by a publish to a shard on any master; kombu and a real Celery worker lose and double
nothing; and a master failover brings the shards it served back through its replica, with
at-least-once intact."""

from __future__ import annotations

import threading
import uuid

import pytest
from kombu import Connection, Consumer, Producer

from celery_pq import Item
from celery_pq.queue import open_queue
from celery_pq.transport.options import Options
from tests.support.consume import drain, make_queue

pytestmark = pytest.mark.cluster


def sharded(cluster_client, prefix, n, **options):
    return open_queue(
        cluster_client, "kq", Options(key_prefix=prefix, shards=n, peek=2, **options).queue_settings("kq")
    )


def masters_of(cluster, queue) -> dict:
    """{shard name: port of the master serving it now}."""
    return {s.name: cluster.master_of(s.keys.entries).port for s in queue.shards}


@pytest.fixture
def prefix():
    return f"sc{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("n", [4, 16])
def test_shards_spread_over_every_master_and_kombu_loses_and_doubles_nothing(cluster, cluster_client, prefix, n):
    # Given a queue of n shards on a cluster of three masters
    queue = sharded(cluster_client, prefix, n)
    placed = masters_of(cluster, queue)
    # Then its shards are on all three masters, none holding more than half of them
    per_master = {port: sum(1 for p in placed.values() if p == port) for port in set(placed.values())}
    assert set(per_master) == {m.port for m in cluster.masters()}
    assert max(per_master.values()) <= n // 2 + 1, per_master

    # When a kombu producer publishes 150 messages and a consumer (peek 2) takes them all
    opts = {"cluster": True, "key_prefix": prefix, "shards": n, "peek": 2}
    with Connection(cluster.pq_url, transport_options=opts) as conn:
        q = make_queue()
        producer = Producer(conn.default_channel)
        for i in range(150):
            producer.publish({"i": i}, exchange=q.exchange, routing_key="kq", declare=[q], priority=i % 9)
        got = drain(conn, q, 150, timeout=60, prefetch=8)
    # Then each was delivered once, every master's shards served, nothing left or leased
    assert sorted(b["i"] for b, _ in got) == list(range(150))
    served = {placed[s.name] for s in queue.shards if s.counters()["delivered"]}
    assert served == set(per_master)
    s = queue.stats()
    assert (s["waiting"], s["leased"], queue.counters()["acked"]) == (0, 0, 150)


def test_a_consumer_blocks_once_per_shard_tag_and_is_woken_from_each_master(cluster, cluster_client, prefix):
    # block_seconds far beyond the test's patience: only a wake token can end a wait in time
    opts = {"cluster": True, "key_prefix": prefix, "shards": 4, "peek": 2, "block_seconds": 60}
    queue = sharded(cluster_client, prefix, 4)
    placed = masters_of(cluster, queue)
    # one shard on each master, to publish into
    one_per_master = {
        port: next(s.name for s in queue.shards if placed[s.name] == port) for port in set(placed.values())
    }
    got: list = []
    with (
        Connection(cluster.pq_url, transport_options=opts) as conn,
        Connection(cluster.pq_url, transport_options=opts) as other,
    ):
        q = make_queue()
        channel = conn.channel()
        consumer = Consumer(channel, [q], callbacks=[lambda body, m: (got.append(body), m.ack())])
        consumer.consume()
        producer = Producer(other.channel())
        target = producer.channel.queue("kq")
        with pytest.raises(TimeoutError):  # nothing waiting: it blocks
            conn.drain_events(timeout=0.3)
        # Then it waits once per shard tag, each on the master serving that shard
        blocks = list(channel.waits._blocks.values())
        assert len(blocks) == 4
        assert sorted(b.conn.port for b in blocks) == sorted(placed.values())
        for port, name in one_per_master.items():
            # When a publish lands in a shard on one master while the consumer waits on all of them
            shard = target._by_name[name]
            target.shard_for = lambda **_: shard
            timer = threading.Timer(
                0.3, producer.publish, ({"to": port},), {"exchange": q.exchange, "routing_key": "kq"}
            )
            timer.start()
            conn.drain_events(timeout=20)
            timer.join()
            # Then it is delivered at once, woken by that shard's wake list
            assert got[-1] == {"to": port}
        assert channel.waits.counters["timeouts"] == 0 and channel.waits.counters["wakeups"] >= 3


def test_every_operation_of_a_sharded_queue_runs_on_the_cluster(cluster_client, prefix):
    # Given 16 shards over three masters, an entry in each of many shards: no call of the
    # sharded queue may name keys of two shards (a cluster would refuse it: CROSSSLOT)
    queue = sharded(cluster_client, prefix, 16)
    ids = queue.insert_many([Item(f"m{i}".encode(), i % 4, None, publish_id=f"pid{i}") for i in range(64)])
    assert queue.size() == 64 and len([s for s in queue.shards if s.size()]) > 8
    assert [e.priority for e in queue.peek(4)] == [3, 3, 3, 3]
    queue.change_priority(ids[0], 200)
    assert queue.peek(1)[0].id == ids[0] and queue.exists(ids[0])
    assert queue.remove(ids[1]) == 1
    # pops (peek rounds over several masters), renewals, acks, a requeue and a dead letter
    leases = [lease for _ in range(6) for lease in queue.pop(2, lease_seconds=30)]
    assert leases and all(queue.extend(leases, 30))
    assert queue.leases(id=leases[0].id) and len(queue.leases()) == len(leases)
    assert queue.requeue(leases[0]) == "waiting"
    assert queue.dead_letter(leases[1], "bad") is not None
    assert all(queue.ack(leases[2:]))
    assert queue.reclaim()["returned"] == 0
    dead = queue.dead.peek(5)
    assert [e.id for e in dead] and queue.replay([e.id for e in dead])["replayed"]
    queue.pause()
    assert queue.recorded()["paused"] and not queue.pop(1)
    queue.resume()
    s = queue.stats()
    # 64 in, 1 removed, the leased ones out but the requeued and the replayed one
    assert (s["waiting"], s["leased"], s["dead"]) == (64 - 1 - len(leases) + 2, 0, 0)
    assert s["waiting"] == queue.backlog() and len(s["shards"]) == 16
    assert queue.purge() == s["waiting"] and queue.size() == 0
