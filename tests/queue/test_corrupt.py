"""Corrupt stored data strands nothing: a malformed entry goes to the dead-letter queue (reason
``malformed``) and the rest of its batch is delivered; corrupt leases, pointers and fair state
are skipped."""

from __future__ import annotations

import time

import pytest

from celery_pq import Item, PriorityQueue
from celery_pq.storage.ids import encode_id


def _all_ids(q: PriorityQueue) -> dict:
    """Every entry id of a queue and its dead-letter queue, by state."""
    r = q.client
    leased = set(r.hkeys(q.keys.leases))
    delayed = set(r.zrange(q.keys.delayed, 0, -1))
    ids = set(r.hkeys(q.keys.entries))
    return {
        "waiting": ids - leased - delayed,
        "leased": leased,
        "delayed": delayed,
        "dead": set(r.hkeys(q.dead.keys.entries)),
    }


def _corrupt(q: PriorityQueue, id: str, value: bytes = b"nobar") -> None:
    q.client.hset(q.keys.entries, encode_id(id), value)


@pytest.mark.parametrize("fair", [False, True])
def test_a_corrupt_entry_goes_to_the_dead_letter_queue_and_the_batch_is_delivered(make_pq, fair):
    q = make_pq("m2", fair=fair)
    q.insert_many([Item(b"p%d" % i, 3, f"e{i}", tenant="A") for i in range(5)])
    _corrupt(q, "e0")
    got = q.pop(5)
    assert [e.id for e in got] == ["e1", "e2", "e3", "e4"]
    [dead] = q.dead.peek(5)
    assert dead.id == "e0" and dead.dead_reason == "malformed" and dead.payload == b"nobar"
    state = _all_ids(q)
    assert len(state["leased"]) == 4 and not state["waiting"]


@pytest.mark.parametrize("value", [b"nobar", b"1,2|x", b"a,b,c,d,e,f|x", b"", b"\xff" * 40 + b"|"])
def test_corrupt_entries_of_every_shape_are_set_aside(make_pq, value):
    q = make_pq("m2")
    q.insert(b"ok", 3, id="a")
    q.insert(b"ok", 3, id="b")
    _corrupt(q, "a", value)
    assert [e.id for e in q.pop(5)] == ["b"]
    assert [e.dead_reason for e in q.dead.peek(5)] == ["malformed"]


def test_a_corrupt_leased_entry_is_set_aside_by_requeue_and_by_the_sweep(redis_client, make_pq):
    q = make_pq("m2")
    q.insert_many([Item(b"x", 3, "a"), Item(b"y", 3, "b")])
    la, lb = q.pop(2)
    _corrupt(q, "a")
    _corrupt(q, "b")
    assert q.requeue(la) == "dead"
    q.extend([lb], 0.001)
    time.sleep(0.01)
    assert q.reclaim()["dead"] == 1
    assert sorted(e.id for e in q.dead.peek(5)) == ["a", "b"]
    assert not redis_client.hlen(q.keys.leases) and not redis_client.hlen(q.keys.entries)


def test_a_corrupt_lease_record_does_not_strand_its_entry(redis_client, make_pq):
    q = make_pq("m2")
    q.insert(b"x", 3, id="a")
    q.pop()
    redis_client.hset(q.keys.leases, encode_id("a"), b"garbage")
    redis_client.zadd(q.keys.lease_deadlines, {encode_id("a"): 0})
    q.reclaim()
    assert [e.id for e in q.pop()] == ["a"]


def test_corrupt_pointers_and_fair_state_are_skipped(redis_client, make_pq):
    q = make_pq("m2", fair=True, tenant_rate=5.0)
    q.insert(b"x", 3, id="a", tenant="A")
    redis_client.rpush(q.keys.level(q.rank(3)), b"\x01")
    redis_client.hset(q.keys.token_buckets, "A", b"junk")
    assert [e.id for e in q.pop()] == ["a"]
