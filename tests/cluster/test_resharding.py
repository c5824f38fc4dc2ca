"""A queue whose hash slot migrates to another master (a resharding, as ``redis-cli --cluster
reshard`` makes one: SETSLOT IMPORTING/MIGRATING, the slot's keys moved one by one with
MIGRATE, SETSLOT NODE) under producers and consumers: what Redis does to a script meanwhile,
the scripts' slot guard, the calls that wait for the slot to settle, and a queue consistent
after the slot moved away and back."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from celery_pq import PriorityQueue
from celery_pq.storage import connections
from celery_pq.storage.connections import set_cluster_retry
from celery_pq.storage.errors import ClusterUnsettled

pytestmark = pytest.mark.cluster

GUARD = "redis.call('EXISTS', KEYS[1] .. '~1', KEYS[1] .. '~2') "


def _other_master(cluster, node):
    return next(m for m in cluster.masters() if m.port != node.port)


def _run(conn, script, *keys, asking=False):
    """EVAL ``script`` on one node's connection: ("ok", reply) or (error class, text)."""
    try:
        if asking:
            conn.execute_command("ASKING")
        return "ok", conn.eval(script, len(keys), *keys)
    except redis.RedisError as exc:
        return type(exc).__name__, str(exc)


def test_redis_refuses_the_slot_guard_before_any_write_while_the_slot_migrates(cluster, cluster_client):
    # The behaviour of Redis 7 the scripts' slot guard rests on, checked on a real migration.
    tag = f"{{g{uuid.uuid4().hex[:8]}}}"
    a, b = f"x:{tag}:a", f"x:{tag}:b"
    cluster_client.set(a, "1")
    cluster_client.set(b, "2")
    slot = cluster.slot_of(a)
    source = cluster.master_of(a)
    target = _other_master(cluster, source)
    back = source
    with source.client(decode_responses=True) as s, target.client(decode_responses=True) as t:
        # On a stable slot the guard is one cheap read and the script runs
        assert _run(s, GUARD + "return redis.call('INCR', KEYS[1] .. ':n')", b) == ("ok", 1)
        t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id())
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id())
        try:
            # Slot MIGRATING, nothing moved yet: every declared key is here, the guard is refused
            kind, text = _run(s, GUARD + "return redis.call('INCR', KEYS[1] .. ':n')", b)
            assert kind == "ResponseError" and "non local key" in text
            # One key moved: the guard is refused at the source, and at the target (ASKING)
            s.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", a)
            kind, text = _run(s, GUARD + "return redis.call('INCR', KEYS[1] .. ':n')", b)
            assert kind == "ResponseError" and "non local key" in text
            kind, text = _run(t, GUARD + "return redis.call('INCR', KEYS[1] .. ':n')", a, asking=True)
            assert kind == "ResponseError" and "non local key" in text
            # The same through a function (FCALL), as the library runs the scripts
            lib = (
                "#!lua name=pqguardprobe\nredis.register_function('pqguardprobe', function(keys, args) "
                "redis.call('EXISTS', keys[1] .. '~1', keys[1] .. '~2') "
                "return redis.call('INCR', keys[1] .. ':n') end)"
            )
            for node in (s, t):
                node.execute_command("FUNCTION", "LOAD", "REPLACE", lib)
            with pytest.raises(redis.ResponseError, match="non local key"):
                s.execute_command("FCALL", "pqguardprobe", 1, b)
            t.execute_command("ASKING")
            with pytest.raises(redis.ResponseError, match="non local key"):
                t.execute_command("FCALL", "pqguardprobe", 1, a)
            # Without the guard, a script whose declared key is still here writes, then fails on
            # a key that moved: half done (what the guard prevents)
            kind, _ = _run(s, "redis.call('INCR', KEYS[1] .. ':n') return redis.call('GET', KEYS[2])", b, a)
            assert kind == "TryAgainError"  # (two declared keys, one moved: refused whole)
            kind, text = _run(s, f"redis.call('INCR', KEYS[1] .. ':n') return redis.call('GET', '{a}')", b)
            assert kind == "ResponseError" and "non local key" in text
            assert s.execute_command("GET", b + ":n") == "2"  # its INCR stayed: half done
            # Then the guard's refusals wrote nothing (one INCR ran on the stable slot, one unguarded)
        finally:
            for node in (s, t):
                node.execute_command("FUNCTION", "DELETE", "pqguardprobe")
    cluster.move_slot(slot, target)
    cluster.move_slot(slot, back)
    assert cluster_client.get(b + ":n") == b"2"


def test_a_call_refused_while_the_slot_moves_writes_nothing_and_fails_as_a_connection_error(cluster, cluster_client):
    # Given a queue with entries, and a call bound to wait at most 0.3 s for its slot
    q = PriorityQueue(cluster_client, f"rs{uuid.uuid4().hex[:8]}")
    for i in range(3):
        q.insert(f"m{i}".encode(), i, id=f"m{i}")
    slot = cluster.slot_of(q.keys.entries)
    source = cluster.master_of(q.keys.entries)
    target = _other_master(cluster, source)
    client = cluster.client()
    set_cluster_retry(client, 0.3)
    q2 = PriorityQueue(client, q.name)

    def state():
        return (
            cluster_client.hlen(q.keys.entries),
            cluster_client.get(q.keys.sequence),
            cluster_client.zcard(q.keys.priority_index),
            cluster_client.hlen(q.keys.leases),
        )

    before = state()
    with source.client() as s, target.client() as t:
        # When the slot is half moved (a key the insert derives, its counters, already at the target)
        t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id())
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id())
        s.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", q.keys.counters)
        started = time.monotonic()
        with pytest.raises(ClusterUnsettled) as caught:
            q2.insert(b"new", 5, id="new")
        # Then the call waited its bound and failed as a connection error
        assert time.monotonic() - started >= 0.25
        assert isinstance(caught.value, redis.ConnectionError)
        with pytest.raises(ClusterUnsettled):
            q2.pop()
    # and wrote nothing: the queue is as it was once the slot has moved
    cluster.move_slot(slot, target)
    assert state() == before
    # And now the same calls run
    q2.insert(b"new", 5, id="new")
    assert [x.id for x in q2.pop(4)] == ["new", "m2", "m1", "m0"]
    client.close()


def test_insert_pop_ack_through_a_slot_moved_away_and_back(cluster, cluster_client):
    # Given a producer inserting and a consumer popping and acking, each in its own thread
    q = PriorityQueue(cluster_client, f"rs{uuid.uuid4().hex[:8]}", lease_seconds=30)
    slot = cluster.slot_of(q.keys.entries)
    home = cluster.master_of(q.keys.entries)
    away = _other_master(cluster, home)
    inserted, popped, errors = [], [], []
    stop = threading.Event()

    def produce():
        n = 0
        while not stop.is_set():
            try:
                q.insert(f"p{n}".encode(), n % 7, id=f"e{n}")
                inserted.append(f"e{n}")
            except Exception as exc:
                errors.append(("insert", exc))
            n += 1
            time.sleep(0.003)

    def consume():
        while not stop.is_set() or q.stats()["waiting"]:
            try:
                got = q.pop(5)
                popped.extend(x.id for x in got)
                assert all(q.ack(got))
            except Exception as exc:
                errors.append(("pop/ack", exc))
            if not got:
                time.sleep(0.005)

    met = dict(connections.settling)
    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for th in threads:
        th.start()
    moved = []
    try:
        time.sleep(0.3)
        # When the queue's slot moves to another master key by key, then back
        moved.append(cluster.move_slot(slot, away, pause=0.05))
        time.sleep(0.2)
        moved.append(cluster.move_slot(slot, home, pause=0.05))
        time.sleep(0.2)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    # Then no call failed, every inserted entry was popped exactly once, nothing is left
    met = {k: v - met[k] for k, v in connections.settling.items()}
    print(
        f"\nslot moved away and back ({moved} keys): {len(inserted)} inserted, {len(popped)} popped; "
        f"calls that met the slot moving: {met}"
    )
    assert not errors, errors[:3]
    assert met["rerouted"] + met["refused"] > 0  # calls did meet the slot half moved
    assert min(moved) >= 5  # the queue's keys really moved one by one
    assert sorted(popped) == sorted(inserted)
    assert len(set(popped)) == len(popped)
    stats = q.stats()
    assert stats["waiting"] == 0 and stats["leased"] == 0
    assert cluster.master_of(q.keys.entries).port == home.port
