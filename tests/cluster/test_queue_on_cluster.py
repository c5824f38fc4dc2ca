"""The queue contract on a Redis Cluster, with queues whose hash tags land on different masters:
insert, pop, ack, requeue, remove by id, leases, fairness, priority views, delays; batches that
span masters; the script library on each master; the command line with the cluster option."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from kombu import Connection

from celery_pq import ConfigError, Item
from celery_pq.queue import QueueSettings, ack_all, open_queue, pop_with_acks
from celery_pq.scripts import library
from celery_pq.storage.connections import node_client

pytestmark = pytest.mark.cluster


def test_queues_on_three_masters_insert_pop_ack_requeue_remove(cluster, cluster_client, spread):
    # Given three queues, each on its own master
    queues = [open_queue(cluster_client, name, QueueSettings(lease_seconds=30)) for name in spread]
    assert len({cluster.master_of(q.keys.entries).port for q in queues}) == 3
    for q in queues:
        # When entries of several priorities go in
        q.insert(b"low", 1, id="low")
        q.insert(b"high", 200, id="high")
        q.insert(b"mid", 50, id="mid")
        q.insert(b"gone", 50, id="gone")
        assert q.remove("gone") == 1
        # Then they come out by priority, under lease
        first = q.pop()
        assert [x.payload for x in first] == [b"high"]
        assert q.leases(id="high")[0]["seconds_left"] > 20
        assert q.requeue(first[0]) == "waiting"
        again = q.pop(3)
        assert [x.payload for x in again] == [b"high", b"mid", b"low"]
        assert again[0].deliveries == 2
        assert q.extend(again, 60) == [True, True, True]
        assert q.ack(again) == [True, True, True]
        assert q.stats()["waiting"] == 0 and q.stats()["leased"] == 0
        # and every key of the queue is on its own master (all keys share its hash tag)
        owner = node_client(cluster_client, q.keys.entries)
        assert owner.exists(q.keys.counters) == 1


def test_batches_that_span_masters_run_as_one_pipeline_per_master(cluster_client, spread):
    queues = [open_queue(cluster_client, name) for name in spread]
    for q in queues:
        q.insert_many([Item(b"a", 5), Item(b"b", 6)])
    held = {q: [(x.id, x.token) for x in q.pop(2)] for q in queues}
    # an ack of three queues on three masters in one call
    assert ack_all(held) == {q: [1, 1] for q in queues}
    # a pop of one queue carrying the acks of the others
    for q in queues:
        q.insert(b"c", 1)
    held = {q: [(x.id, x.token) for x in q.pop()] for q in queues[1:]}
    popped, codes = pop_with_acks(queues[0], 1, acks=held)
    assert [x.payload for x in popped] == [b"c"]
    assert codes == {q: [1] for q in queues[1:]}


def test_leases_run_out_and_come_back_on_each_master(cluster_client, spread):
    queues = [open_queue(cluster_client, name, QueueSettings(lease_seconds=0.2)) for name in spread]
    for q in queues:
        q.insert(b"x", 3, id="x")
        [lease] = q.pop()
    time.sleep(0.4)
    for q in queues:
        assert q.reclaim()["returned"] == 1
        [again] = q.pop()
        assert again.id == "x" and again.deliveries == 2
        assert q.ack(again)


def test_fairness_views_and_delays_on_the_cluster(cluster_client, spread):
    fair = open_queue(cluster_client, spread[0], QueueSettings(fair=True))
    for tenant, n in (("A", 6), ("B", 2), ("C", 2)):
        for i in range(n):
            fair.insert(f"{tenant}{i}".encode(), 5, tenant=tenant)
    order = [x.tenant for x in fair.pop(6)]
    assert order == ["A", "B", "C", "A", "B", "C"]

    viewed = open_queue(cluster_client, spread[1])
    viewed.register_view(0, 55)  # ranks 0..55: priorities 200..255
    viewed.insert(b"bulk", 1)
    viewed.insert(b"urgent", 250)
    assert cluster_client.llen(viewed.keys.view_wake(0, 55)) == 1  # only "urgent" woke the view's consumers
    assert [x.payload for x in viewed.pop(5, view=(0, 55))] == [b"urgent"]

    delayed = open_queue(cluster_client, spread[2], QueueSettings(dedupe_seconds=0))
    delayed.insert(b"later", 9, delay=0.3)
    assert delayed.pop() == [] and delayed.stats()["delayed"] == 1
    time.sleep(0.4)
    assert delayed.reclaim()["promoted"] == 1
    assert [x.payload for x in delayed.pop()] == [b"later"]


def test_library_is_loaded_on_each_master_and_again_after_a_flush(cluster, cluster_client, spread):
    queues = [open_queue(cluster_client, name) for name in spread]
    for q in queues:
        q.insert(b"x", 1)
    for master in cluster.masters():
        with master.client() as c:
            names = [dict(zip(lib[::2], lib[1::2]))[b"library_name"] for lib in c.function_list()]
        assert library().name.encode() in names
    # Given a master that lost the library (as a server restarted without persistence would)
    with cluster.master_of(queues[1].keys.entries).client() as c:
        c.function_flush()
    # the next call loads it there again ("Function not found") and runs
    assert [x.payload for x in queues[1].pop()] == [b"x"]


def test_cluster_option_errors_are_clear(cluster):
    with Connection(cluster.pq_url + "/1", transport_options={"cluster": True}) as conn:
        with pytest.raises(ConfigError, match="only database 0"):
            conn.channel()
    with Connection(cluster.pq_url, transport_options={"cluster": True, "master_name": "m"}) as conn:
        with pytest.raises(ConfigError, match="cluster and master_name"):
            conn.channel()
    with Connection(cluster.pq_url, transport_options={"cluster": "yes"}) as conn:
        with pytest.raises(ConfigError, match="cluster must be True or False"):
            conn.channel()
    # a cluster node named without the option, and the option with a single Redis
    with Connection(f"pq://127.0.0.1:{cluster.seed.port}") as conn:
        with pytest.raises(ConfigError, match="names a node of a Redis Cluster"):
            conn.channel()


def test_cluster_option_with_a_single_redis_is_a_clear_error(redis_server):
    with Connection(f"pq://127.0.0.1:{redis_server.port}", transport_options={"cluster": True}) as conn:
        with pytest.raises(ConfigError, match="not a cluster node"):
            conn.channel()


def test_stats_command_on_the_cluster(cluster, cluster_client, spread):
    for n, name in enumerate(spread):
        q = open_queue(cluster_client, name)
        q.insert(b"x", 7)
        q.insert(b"y", 9 + n)
    with Connection(cluster.pq_url, transport_options={"cluster": True}) as conn:
        ch = conn.channel()
        for name in spread:
            ch.queue_declare(name)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_pq",
            "--broker",
            cluster.pq_url,
            "--transport-options",
            json.dumps({"cluster": True}),
            "stats",
            "--json",
            *spread,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {row["queue"]: row for row in json.loads(out.stdout)}
    assert sorted(rows) == sorted(spread)
    assert all(row["waiting"] == 2 for row in rows.values())
    assert rows[spread[2]]["per_priority"] == {"11": 1, "7": 1}


def test_metrics_collector_on_the_cluster(cluster, cluster_client, spread):
    from celery_pq.ops.metrics import PQCollector

    for n, name in enumerate(spread):
        q = open_queue(cluster_client, name)
        for i in range(n + 1):
            q.insert(b"x", 3)
    fams = {
        f.name: f
        for f in PQCollector(cluster.pq_url, transport_options={"cluster": True}, queues=list(spread)).collect()
    }
    waiting = {s.labels["queue"]: s.value for s in fams["celery_pq_waiting_messages"].samples}
    assert waiting == {name: n + 1 for n, name in enumerate(spread)}
