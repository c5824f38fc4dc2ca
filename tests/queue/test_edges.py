"""Correctness at the edges: misuse, corrupt data and retried calls strand or double nothing.

Each test is one scenario that broke a promise of docs/leases.md before its fix.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from celery_pq import Item, ModeMismatch, PriorityQueue, QueueFull
from celery_pq.storage import constants as C
from celery_pq.storage.ids import encode_id
from celery_pq.testing import RedisServer
from tests.support.tenants import tenant_counts


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


# -- 1. a queue's mode is recorded; a process that disagrees touches nothing ----------------------


def test_fair_pop_on_a_plain_queue_is_refused_and_strands_nothing(redis_client, key_prefix):
    # Given a plain queue with ten waiting entries
    plain = PriorityQueue(redis_client, "m", key_prefix=key_prefix)
    plain.insert_many([Item(b"x", 1)] * 10)
    before = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*")}
    # When a process that thinks the queue is fair pops from it
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True)
    with pytest.raises(ModeMismatch) as err:
        fair.pop(5)
    # Then the error names the queue and both settings, and nothing was touched
    assert "'m'" in str(err.value) and "fair=" in str(err.value)
    assert err.value.stored["fair"] is False and err.value.wanted["fair"] is True
    after = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*")}
    assert after == before
    # and the plain consumer still gets all ten
    assert len(plain.pop(20)) == 10


@pytest.mark.parametrize(
    "other",
    [
        {"fair": True},
        {"priority_order": "lower_first"},
        {"technique": "S"},
    ],
)
def test_every_call_that_changes_a_queue_checks_its_mode(redis_client, key_prefix, other):
    q = PriorityQueue(redis_client, "m", key_prefix=key_prefix)
    q.insert(b"a", 5, id="a")
    [lease] = q.pop()
    q.insert(b"b", 5, id="b")
    wrong = PriorityQueue(redis_client, "m", key_prefix=key_prefix, **other)
    for call in (
        lambda: wrong.insert(b"c", 1),
        lambda: wrong.pop(),
        lambda: wrong.ack(lease),
        lambda: wrong.requeue(lease),
        lambda: wrong.remove("b"),
        lambda: wrong.change_priority("b", 9),
        lambda: wrong.purge(),
        lambda: wrong.reclaim(),
        lambda: wrong.insert_many([Item(b"d", 1)]),
    ):
        with pytest.raises(ModeMismatch):
            call()
    assert q.ack(lease) and [e.id for e in q.pop(5)] == ["b"]


def test_plain_pop_on_a_fair_queue_is_refused(redis_client, key_prefix):
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True)
    fair.insert(b"x", 1, tenant="A")
    with pytest.raises(ModeMismatch):
        PriorityQueue(redis_client, "m", key_prefix=key_prefix).pop()
    assert [e.tenant for e in fair.pop()] == ["A"]


def test_an_empty_queue_keeps_its_mode_until_a_migration_changes_it(redis_client, key_prefix):
    # Given a fair queue, drained
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True)
    fair.insert(b"x", 1, tenant="A")
    fair.purge()
    # When a process that takes it as plain inserts into it
    plain = PriorityQueue(redis_client, "m", key_prefix=key_prefix)
    with pytest.raises(ModeMismatch):
        plain.insert(b"y", 1)
    # Then it is still fair: its consumers go on, and only a migration (on purpose) changes it
    assert fair.recorded()["mode"] == fair.mode
    fair.insert(b"z", 1, tenant="B")
    assert [e.tenant for e in fair.pop()] == ["B"]
    plain.migrate_mode()
    assert plain.recorded()["mode"] == plain.mode


def test_migrate_mode_moves_a_plain_backlog_to_fair(redis_client, key_prefix):
    plain = PriorityQueue(redis_client, "m", key_prefix=key_prefix)
    plain.insert_many([Item(b"x", p) for p in (1, 9, 5)])
    [held] = plain.pop()  # priority 9, leased through the migration
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True, priority_order="lower_first")
    fair.migrate_mode()
    assert fair.recorded()["mode"] == fair.mode
    assert [e.priority for e in fair.pop(5)] == [1, 5]
    assert fair.ack(held)
    assert tenant_counts(fair) == {"": {"waiting": 0, "leased": 2}}


# -- 2. one corrupt entry does not strand its batch ---------------------------------------------


def _corrupt(q: PriorityQueue, id: str, value: bytes = b"nobar") -> None:
    q.client.hset(q.keys.entries, encode_id(id), value)


@pytest.mark.parametrize("fair", [False, True])
def test_a_corrupt_entry_goes_to_the_dead_letter_queue_and_the_batch_is_delivered(redis_client, key_prefix, fair):
    q = PriorityQueue(redis_client, "m2", key_prefix=key_prefix, fair=fair)
    q.insert_many([Item(b"p%d" % i, 3, f"e{i}", tenant="A") for i in range(5)])
    _corrupt(q, "e0")
    got = q.pop(5)
    assert [e.id for e in got] == ["e1", "e2", "e3", "e4"]
    [dead] = q.dead.peek(5)
    assert dead.id == "e0" and dead.dead_reason == "malformed" and dead.payload == b"nobar"
    state = _all_ids(q)
    assert len(state["leased"]) == 4 and not state["waiting"]


@pytest.mark.parametrize("value", [b"nobar", b"1,2|x", b"a,b,c,d,e,f|x", b"", b"\xff" * 40 + b"|"])
def test_corrupt_entries_of_every_shape_are_set_aside(redis_client, key_prefix, value):
    q = PriorityQueue(redis_client, "m2", key_prefix=key_prefix)
    q.insert(b"ok", 3, id="a")
    q.insert(b"ok", 3, id="b")
    _corrupt(q, "a", value)
    assert [e.id for e in q.pop(5)] == ["b"]
    assert [e.dead_reason for e in q.dead.peek(5)] == ["malformed"]


def test_a_corrupt_leased_entry_is_set_aside_by_requeue_and_by_the_sweep(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m2", key_prefix=key_prefix)
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


def test_a_corrupt_lease_record_does_not_strand_its_entry(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m2", key_prefix=key_prefix)
    q.insert(b"x", 3, id="a")
    q.pop()
    redis_client.hset(q.keys.leases, encode_id("a"), b"garbage")
    redis_client.zadd(q.keys.lease_deadlines, {encode_id("a"): 0})
    q.reclaim()
    assert [e.id for e in q.pop()] == ["a"]


def test_corrupt_pointers_and_fair_state_are_skipped(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m2", key_prefix=key_prefix, fair=True, tenant_rate=5.0)
    q.insert(b"x", 3, id="a", tenant="A")
    redis_client.rpush(q.keys.level(q.rank(3)), b"\x01")
    redis_client.hset(q.keys.token_buckets, "A", b"junk")
    assert [e.id for e in q.pop()] == ["a"]


# -- 3. a retried publish is stored once ----------------------------------------------------------


def test_a_publish_retried_after_a_lost_reply_is_stored_once():
    with RedisServer("--enable-debug-command", "yes") as server:
        admin = server.client()
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        q = PriorityQueue(client, "m3")
        q.insert(b"warm", 1, id="w")  # scripts loaded, connection made
        # Given Redis busy for longer than the client's socket timeout
        sleeper = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", "1.5"))
        sleeper.start()
        time.sleep(0.1)
        # When the insert's reply is lost and the client retries it (its own retry, then ours)
        try:
            eid = q.insert(b"x", 1, id="t1")
        except redis.TimeoutError:
            eid = q.insert(b"x", 1, id="t1", publish_id=q.last_publish_id)
        sleeper.join()
        time.sleep(0.2)
        # Then t1 is stored once
        ids = sorted(x.id for x in PriorityQueue(admin, "m3").peek(10))
        assert ids == ["t1", "w"], ids
        assert eid == "t1"
        client.close()
        admin.close()


def test_a_first_send_skips_the_window_and_any_send_again_finds_it(redis_client, key_prefix):
    from celery_pq.queue.calls import insert_made
    from celery_pq.scripts import FIRST_SEND, run_calls

    q = PriorityQueue(redis_client, "m3f", key_prefix=key_prefix)
    item = (Item(b"x", 1, "t1"), b"made-1")
    call = q._scripts.insert_call([item], (), insert_made(True, False))
    script, keys, args = call
    assert call.first_send and FIRST_SEND in args and FIRST_SEND == "F"
    [first] = run_calls(redis_client, [(script, keys, args)])
    # the same call sent again (as every retry path sends it) is found by its publish id
    again = call.resent().args
    assert not call.resent().first_send and again.count("1") >= 1
    assert run_calls(redis_client, [(script, keys, again)]) == [first]
    assert script.words(redis_client, keys, args)[3:] == (*keys, *again)
    # in a pipeline too (redis-py may send a pipeline again by itself)
    assert run_calls(redis_client, [(script, keys, args), (script, keys, args)]) == [first, first]
    assert [e.id for e in q.peek(10)] == ["t1"]
    # a call of several entries under one made publish id gives all of them back
    items = [(Item(b"y", 1, "m1"), b"made-2"), (Item(b"y", 1), b"made-3")]
    call = q._scripts.insert_call(items, (), insert_made(True, False))
    [ids] = run_calls(redis_client, [call])
    assert run_calls(redis_client, [call.resent()]) == [ids] and len(ids) == 2
    assert q.size() == 3


def test_a_publish_id_seen_within_the_window_stores_nothing(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix, dedupe_seconds=60)
    assert q.insert(b"x", 1, id="t", publish_id=b"p1") == "t"
    assert q.insert(b"x", 1, id="t", publish_id=b"p1") == "t"
    assert q.insert(b"x", 1, publish_id="p2") == q.insert(b"x", 1, publish_id="p2")
    # a task id published twice on purpose (Celery's retry) gets its own entry
    assert q.insert(b"x", 1, id="t", publish_id=b"p3") == "t~3"
    assert q.size() == 3


@pytest.mark.parametrize("max_length", [None, 10])
def test_a_repeated_publish_finds_its_entry_id_in_this_window_and_the_last(redis_client, key_prefix, max_length):
    # (without a length limit an insert looks up and records its publish id in one command)
    q = PriorityQueue(redis_client, "m3r", key_prefix=key_prefix, dedupe_seconds=1, max_length=max_length)
    first = [
        q.insert(b"x", 1, id="t", publish_id=b"p1"),
        q.insert(b"x", 1, id="t", publish_id=b"p2"),
        q.insert(b"x", 1, publish_id=b"p3"),
    ]
    assert first[0] == "t" and first[1].startswith("t~") and first[2] not in first[:2]
    assert [
        q.insert(b"x", 1, id="t", publish_id=b"p1"),
        q.insert(b"x", 1, id="t", publish_id=b"p2"),
        q.insert(b"x", 1, publish_id=b"p3"),
    ] == first
    time.sleep(1.05)
    q.insert(b"y", 1, publish_id=b"p-other")  # the window turns: p1..p3 are in the last one now
    assert [
        q.insert(b"x", 1, id="t", publish_id=b"p1"),
        q.insert(b"x", 1, id="t", publish_id=b"p2"),
        q.insert(b"x", 1, publish_id=b"p3"),
    ] == first
    assert q.size() == 4


def test_publish_ids_are_forgotten_after_the_window(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix, dedupe_seconds=0.05)
    q.insert(b"x", 1, id="t", publish_id=b"p1")
    time.sleep(0.12)
    q.insert(b"y", 1, publish_id=b"p-other")  # rotates the window
    time.sleep(0.06)
    q.insert(b"x", 1, id="t", publish_id=b"p1")
    assert q.size() == 3


def test_the_longest_window_a_producer_asked_for_holds(redis_client, key_prefix):
    # Given a producer that asked for a 3600 s window and one that asked for 0.05 s, on one queue
    long = PriorityQueue(redis_client, "m3w", key_prefix=key_prefix, dedupe_seconds=3600)
    short = PriorityQueue(redis_client, "m3w", key_prefix=key_prefix, dedupe_seconds=0.05)
    assert long.insert(b"x", 1, id="t", publish_id=b"p-long") == "t"
    # When the short-window producer publishes several of its windows later
    for _ in range(3):
        time.sleep(0.06)
        short.insert(b"y", 1, publish_id=b"p-other")
    # Then the long window was not cut short: a retry of the long producer's publish stores nothing
    assert long.insert(b"x", 1, id="t", publish_id=b"p-long") == "t"
    assert short.insert(b"x", 1, id="t", publish_id=b"p-long") == "t"
    assert short.size() == 2
    assert redis_client.get(long.keys.publish_window).split(b"|")[1] == b"3600000"


def test_a_long_window_lapses_when_its_producer_has_gone(redis_client, key_prefix):
    # Given a 0.1 s producer gone quiet, and a 0.02 s one that goes on
    gone = PriorityQueue(redis_client, "m3x", key_prefix=key_prefix, dedupe_seconds=0.1)
    short = PriorityQueue(redis_client, "m3x", key_prefix=key_prefix, dedupe_seconds=0.02)
    gone.insert(b"x", 1, id="t", publish_id=b"p1")
    # When more than twice the long window has passed
    time.sleep(0.25)
    short.insert(b"y", 1, publish_id=b"p-other")
    time.sleep(0.05)
    short.insert(b"y", 1, publish_id=b"p-other2")
    # Then the queue's window is the short one again, and p1 is long forgotten
    assert redis_client.get(short.keys.publish_window).split(b"|")[1] == b"20"
    assert short.insert(b"x", 1, id="t", publish_id=b"p1").startswith("t~")
    assert short.size() == 4


def test_dedupe_off_stores_every_publish(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix, dedupe_seconds=0)
    q.insert(b"x", 1, publish_id=b"p1")
    q.insert(b"x", 1, publish_id=b"p1")
    assert q.size() == 2


def test_insert_many_retried_chunks_are_stored_once(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix)
    items = [Item(b"x", 1, f"t{i}", publish_id=f"pub{i}") for i in range(25)]
    first = q.insert_many(items, chunk=10)
    assert q.insert_many(items, chunk=7) == first
    assert q.size() == 25


def test_insert_many_tells_repeats_apart_from_new_entries_when_asked(redis_client, key_prefix):
    # Given 5 items with publish ids of their own, 2 of them stored before, one publish id twice
    q = PriorityQueue(redis_client, "m3t", key_prefix=key_prefix, max_length=100)
    first = q.insert_many([Item(b"x", 1, "t1", publish_id="pub1"), Item(b"x", 1, "t3", publish_id="pub3")])
    items = [Item(b"x", 1, f"t{i}", publish_id=f"pub{i}") for i in range(5)] + [Item(b"y", 1, "t9", publish_id="pub4")]
    # When they are inserted asking for repeats
    ids, repeated = q.insert_many(items, chunk=4, repeats=True)
    # Then the ids are as without asking, and exactly the items that stored nothing are repeats
    assert ids == ["t0", "t1", "t2", "t3", "t4", "t4"] and first == ["t1", "t3"]
    assert repeated == [False, True, False, True, False, True]
    assert q.size() == 5
    # And items without a publish id of the caller's are new entries, never repeats
    ids, repeated = q.insert_many([Item(b"z", 1), Item(b"z", 2, "t0")], repeats=True)
    assert repeated == [False, False] and ids[1] != "t0" and q.size() == 7


def test_insert_many_says_which_items_were_stored_when_a_chunk_fails(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix, max_length=15)
    with pytest.raises(QueueFull) as err:
        q.insert_many([Item(b"x", 1, f"t{i}") for i in range(25)], chunk=10)
    # chunks of 10, 10, 5: the second would pass max_length, the third still fits
    assert err.value.stored == [f"t{i}" for i in range(10)] + [None] * 10 + [f"t{i}" for i in range(20, 25)]
    assert "stored 15 of 25" in " ".join(getattr(err.value, "__notes__", []))
    assert q.size() == 15
    # the items to send again are the ones not stored: sending them stores the rest
    assert [x.id for x in err.value.items] == [f"t{i}" for i in range(10, 20)]
    q.purge()
    q.insert_many(err.value.items)
    assert q.size() == 10


# -- 4. stale pointers stay bounded -----------------------------------------------------------


def test_capped_tenants_do_not_leak_pointers(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m4", key_prefix=key_prefix, fair=True, tenant_concurrency=1)
    q.insert(b"a1", 1, tenant="A")
    q.insert(b"a2", 1, tenant="A")
    [held] = q.pop()
    assert held.tenant == "A"
    for _ in range(2000):
        q.insert(b"b", 1, tenant="B")
        [lease] = q.pop()
        assert lease.tenant == "B"
        q.ack(lease)
    pointers = sum(redis_client.llen(q.keys.level(r)) for r in range(256))
    assert pointers <= 2 * q.size() + 128, pointers  # the documented bound


def test_technique_s_removals_do_not_pile_up_pointers(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m4", key_prefix=key_prefix, technique="S")
    q.insert(b"head", 1, id="head")
    for i in range(2000):
        q.insert(b"x", 1, id=f"t{i}")
        assert q.remove(f"t{i}") == 1
    pointers = sum(redis_client.llen(q.keys.level(r)) for r in range(256))
    assert pointers <= 2 * q.size() + 128, pointers  # the documented bound


def test_fairness_state_of_tenants_that_left_is_cleaned_up(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m4", key_prefix=key_prefix, fair=True, tenant_rate=1000.0)
    for i in range(300):
        q.insert(b"x", 1, tenant=f"t{i}")
        q.ack(q.pop()[0])
    time.sleep(0.01)
    for _ in range(20):
        q.reclaim()
    assert redis_client.hlen(q.keys.virtual_times) < 50
    assert redis_client.hlen(q.keys.token_buckets) < 50


# -- 5. generated ids never collide ----------------------------------------------------------


def test_dead_letters_never_overwrite_each_other(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m5", key_prefix=key_prefix)
    assert [q.insert(b"T", 1, id="T"), q.insert(b"U", 1, id="U"), q.insert(b"T2", 1, id="T")] == ["T", "U", "T~3"]
    leases = {x.id: x for x in q.pop(3)}
    q.dead_letter(leases["T"])
    q.dead_letter(leases["T~3"])
    q.insert(b"T3", 1, id="T")
    q.dead_letter(q.pop()[0])
    assert sorted(e.payload for e in q.dead.peek(10)) == [b"T", b"T2", b"T3"]


def test_generated_ids_never_take_a_stored_id(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m5", key_prefix=key_prefix)
    q.insert(b"user", 1, id="T~2")
    q.insert(b"user3", 1, id="3")
    q.insert(b"a", 1, id="T")
    dup = q.insert(b"b", 1, id="T")  # would be "T~4" or so, never a stored one
    gen = q.insert(b"c", 1)
    assert len({"T~2", "3", "T", dup, gen}) == 5
    assert sorted(e.payload for e in q.peek(10)) == [b"a", b"b", b"c", b"user", b"user3"]
    assert q.remove("T") == 2 and q.size() == 3


# -- 9. dead-letter queues have no dead-letter queue and are bounded ----------------------------


def test_a_dead_letter_queue_does_not_dead_letter_into_itself(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m9", key_prefix=key_prefix, max_deliveries=1)
    q.insert(b"x", 1, id="a")
    q.dead_letter(q.pop()[0])
    dead = q.dead
    [lease] = dead.pop()
    with pytest.raises(ValueError, match="dead-letter queue"):
        dead.dead_letter(lease)
    assert dead.requeue(lease) == "waiting"
    for _ in range(3):
        [lease] = dead.pop()
        assert dead.requeue(lease) == "waiting"
    assert [e.id for e in dead.peek(5)] == ["a"]


def test_the_dead_letter_queue_keeps_at_most_max_dead_length(redis_client, key_prefix, caplog):
    q = PriorityQueue(redis_client, "m9", key_prefix=key_prefix, max_dead_length=3)
    q.insert_many([Item(b"%d" % i, 1, f"t{i}") for i in range(5)])
    with caplog.at_level(logging.WARNING, logger="celery_pq"):
        for lease in q.pop(5):
            q.dead_letter(lease)
    assert sorted(e.id for e in q.dead.peek(10)) == ["t2", "t3", "t4"]
    assert "max_dead_length" in caplog.text


# -- 12. bad settings are refused at once ----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"name": ""}, "name"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"dedupe_seconds": -1}, "dedupe_seconds"),
        ({"max_dead_length": 0}, "max_dead_length"),
        ({"lease_seconds": float("nan")}, "lease_seconds"),
        ({"lease_seconds": "5"}, "lease_seconds"),
    ],
)
def test_bad_queue_settings_are_refused(redis_client, kwargs, word):
    args = {"name": "m12", **kwargs}
    with pytest.raises(ValueError, match=word):
        PriorityQueue(redis_client, args.pop("name"), **args)


@pytest.mark.parametrize("weight", [0, -1, 1e-9, 2e6, float("inf"), float("nan"), True, "2"])
def test_fair_weights_outside_the_range_the_tags_hold_are_refused(redis_client, key_prefix, weight):
    q = PriorityQueue(redis_client, "m12", key_prefix=key_prefix, fair=True)
    with pytest.raises(ValueError, match="weights"):
        q.configure_tenants(weights={"A": weight})
    assert not redis_client.exists(q.keys.tenant_settings)


def test_answered_publish_ids_are_forgotten_so_the_window_costs_no_memory_per_entry(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "m3", key_prefix=key_prefix)
    for i in range(50):
        q.insert(b"x", 1, id=f"t{i}")
    q.insert_many([Item(b"y", 1)] * 30)
    q.insert(b"z", 1)
    # answered publish ids are forgotten in batches: at most a batch and the last call's remain
    assert redis_client.hlen(q.keys.publish_ids) + redis_client.hlen(q.keys.publish_ids_before) <= C.FORGET_BATCH + 1
    # a publish id the caller gives is remembered for the whole window (a producer that sends
    # again after a success, as a retried Spark task does)
    q.insert(b"k", 1, id="kept", publish_id=b"given")
    q.insert(b"w", 1)
    assert q.insert(b"k", 1, id="kept", publish_id=b"given") == "kept" and q.size() == 83


# -- found by the model test -------------------------------------------------------------------


def test_technique_s_remove_of_a_delayed_entry_takes_it_out_of_the_delayed_index(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "mm", key_prefix=key_prefix, technique="S")
    q.insert(b"x", 5, id="a", delay=3600)
    assert q.remove("a") == 1
    assert q.size() == 0 and q.stats()["delayed"] == 0


def test_fair_purge_counts_a_requeued_entry_once(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "mm", key_prefix=key_prefix, fair=True)
    q.insert_many([Item(b"x", 5, "b1", tenant="B"), Item(b"x", 5, "b2", tenant="B"), Item(b"x", 5, "a1", tenant="A")])
    leases = q.pop(3)
    q.requeue(leases[-1])
    for lease in leases[:-1]:
        q.requeue(lease)
    assert q.purge() == 3


@pytest.mark.parametrize("view", [None, (0, 255), (200, 255)])
def test_a_pop_leaves_a_wake_token_while_entries_wait_and_none_once_it_took_the_last(redis_client, key_prefix, view):
    q = PriorityQueue(redis_client, "mw", key_prefix=key_prefix)
    q.insert_many([Item(b"x", 50, "a"), Item(b"x", 50, "b"), Item(b"x", 40, "c")])  # ranks 205 and 215
    wk = q.keys.wake if view is None else q.keys.view_wake(*view)
    redis_client.delete(wk)
    assert [e.id for e in q.pop(1, view=view)] == ["a"]  # b is behind it in its rank
    assert redis_client.llen(wk) == 1
    redis_client.delete(wk)
    assert [e.id for e in q.pop(1, view=view)] == ["b"]  # its rank ran empty; c waits in another
    assert redis_client.llen(wk) == 1
    assert [e.id for e in q.pop(2, view=view)] == ["c"]  # the last one
    assert redis_client.llen(wk) == 0


def test_dead_lettering_a_capped_tenants_lease_wakes_a_consumer(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "mm", key_prefix=key_prefix, fair=True, tenant_concurrency=1)
    q.insert_many([Item(b"x", 5, "a1", tenant="A"), Item(b"x", 5, "a2", tenant="A")])
    [lease] = q.pop(1)
    assert q.pop(1) == [] and not redis_client.llen(q.keys.wake)
    q.dead_letter(lease)
    assert redis_client.llen(q.keys.wake) == 1 and [e.id for e in q.pop(1)] == ["a2"]


def test_requeue_and_change_priority_wake_views_registered_elsewhere(redis_client, key_prefix):
    q = PriorityQueue(redis_client, "mm", key_prefix=key_prefix)
    q.insert(b"x", 200, id="a")
    q.insert(b"y", 5, id="b")
    other = PriorityQueue(redis_client, "mm", key_prefix=key_prefix)
    hi = other.register_view(*sorted((q.rank(200), q.rank(255))))
    lo = other.register_view(q.rank(255), q.rank(255))
    [lease] = q.pop(1)  # this object never heard of the views
    redis_client.delete(hi, lo)
    q.requeue(lease)
    assert redis_client.llen(hi) == 1 and not redis_client.llen(lo)
    q.change_priority("b", 255)
    assert redis_client.llen(lo) == 1


def test_a_redis_user_without_mget_still_publishes_and_consumes(fresh_redis):
    # an ACL line written before the insert read three keys with one MGET
    admin = fresh_redis.client()
    admin.execute_command("ACL", "SETUSER", "old", "on", ">pw", "~*", "&*", "+@all", "-mget")
    client = redis.Redis(host=fresh_redis.host, port=fresh_redis.port, username="old", password="pw")
    q = PriorityQueue(client, "nomget")
    assert q.insert(b"x", 3, id="a") == "a"
    other = q.insert(b"y", 3)
    assert [e.id for e in q.pop(2)] == ["a", other]
    with pytest.raises(redis.ResponseError):
        client.mget("k1", "k2")  # (it is refused indeed)
    client.close()
    admin.close()


def test_a_call_on_the_lean_path_keeps_the_socket_timeout_in_the_kernel_and_recovers_after_it():
    import socket
    import struct

    from celery_pq.scripts import wire

    with RedisServer("--enable-debug-command", "yes") as server:
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        q = PriorityQueue(client, "lean")
        q.insert(b"warm", 1, id="w")
        conn = wire.own_connection(client)
        lean = wire._lean_io(conn)
        if lean is None:
            pytest.skip("redis-py's own path here (no hiredis parser, or not Linux)")
        sock = lean[0]
        # the socket blocks, with the connection's timeout kept by the kernel (no poll per call)
        assert sock.gettimeout() is None
        assert struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)) == (0, 500000)
        # a reply that does not come in time: redis-py's TimeoutError, the connection dropped
        sleeper = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", "1.2"))
        sleeper.start()
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            wire._roundtrip(conn, ("PING",))
        assert 0.4 < time.monotonic() - started < 1.1 and conn._sock is None
        sleeper.join()
        # the next call connects again and goes the lean way; errors come back as redis-py's
        assert wire._roundtrip(conn, ("PING",)) in (b"PONG", "PONG")
        with pytest.raises(redis.ResponseError):
            wire._roundtrip(conn, ("NOSUCHCOMMAND",))
        assert wire._roundtrip(conn, ("ECHO", "x")) == b"x"
        # where redis-py reads with a timeout of its own it puts Python's timeout mode back: the
        # next call here undoes it
        conn._sock.settimeout(0.5)
        assert q.insert(b"x", 1, id="t") == "t" and conn._sock.gettimeout() is None
        client.close()


def test_a_call_polls_for_its_reply_and_one_that_misses_the_poll_stops_the_polling_for_a_while():
    from celery_pq.scripts import wire

    # a script that answers after 30 ms (its own busy loop on the server's clock)
    slow = (
        "EVAL",
        "local t0 = redis.call('TIME') local a = t0[1] * 1e6 + t0[2] "
        "repeat local t = redis.call('TIME') until t[1] * 1e6 + t[2] - a > 30000 return 7",
        0,
    )
    poll_long, poll_short = 50_000_000, 1_000_000  # 50 ms (a PING answers within it), 1 ms
    with RedisServer() as server:
        client = redis.Redis(host=server.host, port=server.port)
        conn = wire.own_connection(client)
        if wire._lean_io(conn) is None:
            pytest.skip("redis-py's own path here (no hiredis parser, or not Linux)")
        assert wire._roundtrip(conn, ("PING",), poll_long) in (b"PONG", "PONG")
        assert getattr(conn, "_pq_spin_misses", 0) == 0 and getattr(conn, "_pq_spin_skip", 0) == 0
        # a reply later than the poll is read all the same (the thread then sleeps in recv), and
        # the connection polls for none of the next 2 calls
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (1, 2)
        for left in (1, 0):
            assert wire._roundtrip(conn, ("ECHO", "a"), poll_long) == b"a"
            assert conn._pq_spin_skip == left and conn._pq_spin_misses == 1
        # missed again: 4 calls without polling; then a reply in time starts the count anew
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (2, 4)
        for _ in range(5):
            assert wire._roundtrip(conn, ("ECHO", "b"), poll_long) == b"b"
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (0, 0)
        # the wait between polls is bounded, however many misses
        conn._pq_spin_misses = 40
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert conn._pq_spin_skip == C.SPIN_BACKOFF_MAX
        conn._pq_spin_skip = conn._pq_spin_misses = 0
        # a reply that comes while polling is in time, however long it took (a slow script:
        # polling on costs less than a sleep and a wake-up): the count starts anew
        conn._pq_spin_misses = 3
        assert wire._roundtrip(conn, slow, poll_long) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (0, 0)
        # a connection the server closed while it is polled: redis-py's ConnectionError at once
        my_id = wire._roundtrip(conn, ("CLIENT", "ID"), poll_long)
        server.client().client_kill_filter(_id=my_id)
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            wire._roundtrip(conn, ("PING",), poll_long)
        assert time.monotonic() - started < 1.0
        client.close()
