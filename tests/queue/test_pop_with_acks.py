"""The queue batches a consumer's acks with its next pop: PriorityQueue.pop(acks=...),
queue.pop_with_acks (several queues' acks, one pop, one round trip) and queue.ack_all."""

import pytest

from celery_pq import Item
from celery_pq import queue as queue_module
from celery_pq.queue import running as queue_running
from celery_pq.storage.errors import ErrorCode


def test_pop_carries_its_own_queues_acks(make_pq):
    q = make_pq("pa")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(3)])
    first = q.pop(2)
    popped = q.pop(1, acks=[(first[0].id, first[0].token), (first[1].id, "stale-token")])
    assert [lease.id for lease in popped] == ["e2"]
    assert popped.acked == [1, ErrorCode.TOKEN_MISMATCH]
    assert q.pop(1).acked == []


def test_a_pops_acks_answer_as_acks_one_after_the_other(redis_client, make_pq):
    # Given three leases, one of a duplicate id (its duplicate record goes with its ack)
    q = make_pq("pb")
    q.insert_many([Item(b"x", 1, "a"), Item(b"x", 1, "b"), Item(b"x", 1, "a")])
    a, b, dup = q.pop(3)
    assert dup.id.startswith("a~")
    # When one pop acks them with a repeat, a wrong token before the right one, and a stranger
    pairs = [(a.id, a.token), (a.id, a.token), (b.id, "wrong"), (b.id, b.token), ("nobody", "t"), (dup.id, dup.token)]
    popped = q.pop(1, acks=pairs)
    # Then each pair has the code it would have had alone, in order, and all three are gone
    nl, tm = ErrorCode.NOT_LEASED, ErrorCode.TOKEN_MISMATCH
    assert popped.acked == [1, nl, tm, 1, nl, 1] and list(popped) == []
    stats = q.stats()
    assert stats["leased"] == 0 and stats["waiting"] == 0
    assert redis_client.zcard(q.keys.lease_deadlines) == 0 and redis_client.hlen(q.keys.entries) == 0
    assert redis_client.zcard(q.keys.duplicate_index) == 0
    assert q.counters()["acked"] == 3


def test_acks_of_several_queues_ride_with_one_pop_in_one_round_trip(make_pq, monkeypatch):
    # Given two queues, each with a lease held, and one more entry waiting in the second
    a = make_pq("pa")
    b = make_pq("pb")
    a.insert(b"x", 1, id="a1")
    b.insert_many([Item(b"x", 1, "b1"), Item(b"x", 1, "b2")])
    [held_a], [held_b] = a.pop(1), b.pop(1)
    trips = []
    run_waiting = queue_running.run_waiting
    spy = lambda client, calls, *queues: trips.append(len(calls)) or run_waiting(client, calls, *queues)  # noqa: E731
    monkeypatch.setattr(queue_running, "run_waiting", spy)  # (a pop, alone or with acks: run_acks)
    # When the second queue pops with both leases acked
    leases, codes = queue_module.pop_with_acks(
        b, 1, acks={a: [(held_a.id, held_a.token)], b: [(held_b.id, held_b.token)]}
    )
    # Then both acks and the pop went in one round trip (b's ack inside its pop script)
    assert trips == [2]
    assert [lease.id for lease in leases] == ["b2"]
    assert codes == {a: [1], b: [1]}
    assert a.stats()["leased"] == 0 and a.size() == 0
    assert queue_module.ack_all({b: [(leases[0].id, leases[0].token)], a: []}) == {b: [1]}
    assert trips == [2, 1]


# -- more than Lua's unpack takes at once (8,000 values in Redis's Lua) ---------------------------
def _leased(q, n):
    """``n`` leases of ``q``, taken 1,000 at a time."""
    leases = []
    while len(leases) < n:
        leases += q.pop(min(1000, n - len(leases)))
    return leases


@pytest.mark.parametrize("fair", [False, True])
def test_a_pop_carries_20000_acks(redis_client, make_pq, fair):
    # Given 20,000 leases held and one more entry waiting
    q = make_pq("many", fair=fair)
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(20_001)])
    held = _leased(q, 20_000)
    # When one pop carries all their acks (a consumer's acks kept through a long outage)
    popped = q.pop(1, acks=[(lease.id, lease.token) for lease in held])
    # Then every ack is done and the waiting entry is delivered
    assert popped.acked == [1] * 20_000
    assert [lease.id for lease in popped] == ["e20000"]
    stats = q.stats()
    assert stats["leased"] == 1 and stats["waiting"] == 0
    assert redis_client.hlen(q.keys.entries) == 1 and redis_client.zcard(q.keys.lease_deadlines) == 1


def test_pop_with_acks_carries_20000_acks_of_two_queues(make_pq):
    # Given 10,000 leases held in each of two queues
    a = make_pq("many-a")
    b = make_pq("many-b")
    for q in (a, b):
        q.insert_many([Item(b"x", 1, f"e{i}") for i in range(10_000)])
    held = {q: [(lease.id, lease.token) for lease in _leased(q, 10_000)] for q in (a, b)}
    # When one pop of the second queue carries them all
    leases, codes = queue_module.pop_with_acks(b, 1, acks=held)
    # Then every ack is done, in both queues
    assert list(leases) == []
    assert codes == {a: [1] * 10_000, b: [1] * 10_000}
    assert a.stats()["leased"] == 0 and b.stats()["leased"] == 0


def test_one_pop_leases_9000_entries(redis_client, make_pq):
    # Given 9,000 entries waiting
    q = make_pq("wide")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(9_000)])
    # When one pop takes them all: more leases than one unpack writes
    popped = q.pop(9_000)
    # Then each is leased, with its deadline, and none waits
    assert len(popped) == 9_000
    assert redis_client.hlen(q.keys.leases) == 9_000 and redis_client.zcard(q.keys.lease_deadlines) == 9_000
    assert q.stats()["waiting"] == 0
    assert q.ack(popped) == [True] * 9_000
