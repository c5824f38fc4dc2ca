"""replay.lua on a real redis-server: dead letters back to the live queue, checked on the raw keys."""

import pytest

from celery_pq import Item, ModeMismatch, PriorityQueue
from celery_pq.queue.unique import UniqueKey
from celery_pq.storage.ids import decode_id
from celery_pq.storage.records import split_entry, split_pointer
from tests.support.tenants import tenant_counts


@pytest.fixture(params=["T", "S"])
def q(make_pq, request):
    return make_pq("jobs", technique=request.param, max_deliveries=2)


def kill(q, n=1, reason="boom"):
    for lease in q.pop(n):
        q.dead_letter(lease, reason)


def level(client, q, priority):
    return [
        (seq, decode_id(eid)) for seq, eid in map(split_pointer, client.lrange(q.keys.level(q.rank(priority)), 0, -1))
    ]


def test_replay_moves_the_entry_back_with_deliveries_reset(q, redis_client):
    # Given a dead letter delivered twice, at priority 200, and a live entry waiting at 200
    q.insert(b"payload-a", 200, id="a")
    q.pop(1, consumer="c:1:x")
    q.reclaim(consumer="c:1:x")  # back once: its delivery count is 1
    kill(q)
    q.insert(b"payload-b", 200, id="b")
    [dead] = q.dead.peek(5)
    assert (dead.id, dead.dead_deliveries, dead.dead_reason) == ("a", 2, "boom")
    # When it is replayed
    assert q.replay(["a"]) == {"replayed": {"a": "a"}, "missing": [], "leased": [], "refused": []}
    # Then the dead-letter queue holds nothing, not even a pointer
    assert redis_client.hlen(q.dead.keys.entries) == 0
    assert level(redis_client, q.dead, 200) == []
    # and the live entry has no deliveries and no note, its payload and priority kept, behind b
    header, payload = split_entry(redis_client.hget(q.keys.entries, b"a"))
    assert (header.deliveries, header.dead_note, payload) == (0, b"", b"payload-a")
    assert [e.id for e in q.peek(5)] == ["b", "a"]
    assert [eid for _, eid in level(redis_client, q, 200)][-1] == "a"
    # and it is delivered as a first delivery
    q.pop(1)
    [lease] = q.pop(1)
    assert (lease.id, lease.deliveries, lease.priority) == ("a", 1, 200)


def test_replay_of_an_id_the_live_queue_holds_makes_a_duplicate(q, redis_client):
    q.insert(b"old", 5, id="t")
    kill(q)
    q.insert(b"new", 5, id="t")  # the task was published again meanwhile
    out = q.replay(["t"])
    new_id = out["replayed"]["t"]
    assert new_id.startswith("t~")
    assert sorted(e.payload for e in q.peek(5)) == [b"new", b"old"]
    assert q.remove("t") == 2  # REMOVE BY ID finds the duplicate too


def test_missing_and_leased_dead_letters_are_left_alone(q, redis_client):
    q.insert(b"x", 1, id="x")
    q.insert(b"y", 1, id="y")
    kill(q, 2)
    q.dead.pop(1)  # a consumer of jobs.dead holds x
    out = q.replay(["x", "y", "nope"])
    assert out == {"replayed": {"y": "y"}, "missing": ["nope"], "leased": ["x"], "refused": []}
    assert redis_client.hexists(q.dead.keys.entries, b"x")


def test_replay_respects_max_length(make_pq):
    q = make_pq("jobs", max_length=2)
    for i in range(2):
        q.insert(b"p", 1, id=f"d{i}")
    kill(q, 2)
    q.insert(b"p", 1, id="live")
    out = q.replay(["d0", "d1"])
    assert out["replayed"] == {"d0": "d0"} and out["refused"] == ["d1"]
    assert q.dead.size() == 1 and q.size() == 2


def test_replay_on_a_fair_queue_keeps_the_tenant(make_pq):
    q = make_pq("fj", fair=True)
    q.insert(b"p", 9, id="a", tenant="acme")
    kill(q)
    assert tenant_counts(q) == {}
    q.replay(["a"])
    assert tenant_counts(q) == {"acme": {"waiting": 1, "leased": 0}}
    [lease] = q.pop(1)
    assert (lease.id, lease.tenant, lease.priority) == ("a", "acme", 9)


def test_replay_with_another_mode_changes_nothing(redis_client, make_pq, key_prefix):
    q = make_pq("mm")
    q.insert(b"p", 1, id="a")
    kill(q)
    # (made directly: open_queue would take the recorded mode)
    wrong = PriorityQueue(redis_client, "mm", key_prefix=key_prefix, priority_order="lower_first")
    with pytest.raises(ModeMismatch):
        wrong.replay(["a"])
    assert q.dead.size() == 1


def test_replay_refuses_a_dead_letter_queue_and_bad_ids(make_pq):
    q = make_pq("rq")
    with pytest.raises(ValueError, match="dead-letter queue"):
        q.dead.replay(["a"])
    with pytest.raises(ValueError, match="non-empty string"):
        q.replay([""])


def test_replay_is_an_ordinary_enqueue_to_counters_and_the_event_log(make_pq):
    q = make_pq("ev", event_log=100)
    q.insert(b"p", 42, id="a", task="proj.resize")
    kill(q)
    before = q.counters()
    q.replay(["a"])
    after = q.counters()
    assert after["enqueued"] == before["enqueued"] + 1
    assert {k: v for k, v in after.items() if k != "enqueued"} == {k: v for k, v in before.items() if k != "enqueued"}
    last = q.events()[-1]
    assert (last["e"], last["id"], last["p"], last["r"]) == ("enqueue", "a", 42, "replay")


def test_a_replayed_dead_letter_holds_its_unique_key_again(q, redis_client):
    # Given an entry holding a unique key (while_active), dead-lettered: its key is free meanwhile
    q.insert(Item(b"x", 1, id="u1"), unique=UniqueKey("report:7", "while_active"))
    kill(q)
    assert q.insert(Item(b"x", 1, id="u2"), unique=UniqueKey("report:7", "while_active")).kind == "stored"
    q.ack(q.pop(1)[0])
    # When it is replayed, the key free again
    assert q.replay(["u1"])["replayed"] == {"u1": "u1"}
    # Then it holds its key: a publish of the key merges into it, while it waits and while it runs
    out = q.insert(Item(b"x", 1, id="u3"), unique=UniqueKey("report:7", "while_active"))
    assert (out.kind, out.task_id) == ("merged", "u1")
    [lease] = q.pop(1)
    assert q.insert(Item(b"x", 1, id="u4"), unique=UniqueKey("report:7", "while_active")).task_id == "u1"
    q.ack(lease)  # and its ack frees the key
    assert q.insert(Item(b"x", 1, id="u5"), unique=UniqueKey("report:7", "while_active")).kind == "stored"
    assert redis_client.hlen(q.dead.keys.unique_holders) == 0


def test_a_dead_letter_whose_key_is_held_again_is_merged_into_the_holder_not_replayed_beside_it(q, redis_client):
    # Given a dead letter that held key k, and a new entry holding k now
    q.insert(Item(b"old", 1, id="k1"), unique=UniqueKey("k"))
    kill(q)
    assert q.insert(Item(b"new", 1, id="k2"), unique=UniqueKey("k")).kind == "stored"
    # When the dead letter is replayed
    got = q.replay(["k1"])
    # Then it is merged into the entry holding k (as a publish of k would be): no second entry of
    # the key, and the dead letter is gone
    assert got["replayed"] == {"k1": "k2"}
    assert [e.id for e in q.peek(5)] == ["k2"] and q.dead.peek(5) == []
    assert redis_client.hlen(q.dead.keys.unique_holders) == 0
    assert q.counters()["unique_merged"] == 1


def test_a_dead_letter_dropped_for_room_takes_its_kept_key_and_no_live_one(redis_client, make_pq):
    # Given a dead-letter queue of one, holding x (key a), then y (key b) and again x (key c) live
    q = make_pq("room", max_dead_length=1)
    q.insert(Item(b"x", 1, id="x"), unique=UniqueKey("a"))
    kill(q)
    q.insert(Item(b"y", 1, id="y"), unique=UniqueKey("b"))
    q.insert(Item(b"x", 1, id="x"), unique=UniqueKey("c"))
    # When y is dead-lettered, the dead x making room for it
    kill(q)
    # Then the dead-letter queue keeps y's key only, and the live x still holds c
    assert {k.decode(): v.decode() for k, v in redis_client.hgetall(q.dead.keys.unique_holders).items()} == {"y": "b"}
    assert [e.id for e in q.dead.peek(5)] == ["y"]
    assert q.insert(Item(b"z", 1, id="z"), unique=UniqueKey("c")).task_id == "x"
