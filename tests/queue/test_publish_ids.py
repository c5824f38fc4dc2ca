"""A retried publish is stored once: publish ids and their dedupe windows (``dedupe_seconds``), a
first send and a send again, ``insert_many``'s chunks sent again, and the memory the window costs."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_pq import Item, QueueFull
from celery_pq.queue import open_queue
from celery_pq.storage import constants as C
from celery_pq.testing import RedisServer


def test_a_publish_retried_after_a_lost_reply_is_stored_once():
    with RedisServer("--enable-debug-command", "yes") as server:
        admin = server.client()
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        q = open_queue(client, "m3")
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
        ids = sorted(x.id for x in open_queue(admin, "m3").peek(10))
        assert ids == ["t1", "w"], ids
        assert eid == "t1"
        client.close()
        admin.close()


def test_a_first_send_skips_the_window_and_any_send_again_finds_it(redis_client, make_pq):
    from celery_pq.queue import run_calls
    from celery_pq.scripts import FIRST_SEND, resent

    q = make_pq("m3f")
    item = (Item(b"x", 1, "t1"), b"made-1")
    call = q._scripts.insert_call([item], (), FIRST_SEND)
    script, keys, args = call
    assert FIRST_SEND in args and FIRST_SEND == "F"
    [first] = run_calls(redis_client, [(script, keys, args)])
    # the same call sent again (as every retry path sends it) is found by its publish id
    again = resent(args)
    assert not any(a is FIRST_SEND for a in again) and again.count("1") >= 1
    assert run_calls(redis_client, [(script, keys, again)]) == [first]
    assert script.words(redis_client, keys, args)[3:] == (*keys, *again)
    # in a pipeline too (redis-py may send a pipeline again by itself)
    assert run_calls(redis_client, [(script, keys, args), (script, keys, args)]) == [first, first]
    assert [e.id for e in q.peek(10)] == ["t1"]
    # a call of several entries under one made publish id gives all of them back
    items = [(Item(b"y", 1, "m1"), b"made-2"), (Item(b"y", 1), b"made-3")]
    call = q._scripts.insert_call(items, (), FIRST_SEND)
    [ids] = run_calls(redis_client, [call])
    assert run_calls(redis_client, [call._replace(args=resent(call.args))]) == [ids] and len(ids) == 2
    assert q.size() == 3


def test_a_publish_id_seen_within_the_window_stores_nothing(make_pq):
    q = make_pq("m3", dedupe_seconds=60)
    assert q.insert(b"x", 1, id="t", publish_id=b"p1") == "t"
    assert q.insert(b"x", 1, id="t", publish_id=b"p1") == "t"
    assert q.insert(b"x", 1, publish_id="p2") == q.insert(b"x", 1, publish_id="p2")
    # a task id published twice on purpose (Celery's retry) gets its own entry
    assert q.insert(b"x", 1, id="t", publish_id=b"p3") == "t~3"
    assert q.size() == 3


@pytest.mark.parametrize("max_length", [None, 10])
def test_a_repeated_publish_finds_its_entry_id_in_this_window_and_the_last(make_pq, max_length):
    # (without a length limit an insert looks up and records its publish id in one command)
    q = make_pq("m3r", dedupe_seconds=1, max_length=max_length)
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


def test_publish_ids_are_forgotten_after_the_window(make_pq):
    q = make_pq("m3", dedupe_seconds=0.05)
    q.insert(b"x", 1, id="t", publish_id=b"p1")
    time.sleep(0.12)
    q.insert(b"y", 1, publish_id=b"p-other")  # rotates the window
    time.sleep(0.06)
    q.insert(b"x", 1, id="t", publish_id=b"p1")
    assert q.size() == 3


def test_the_longest_window_a_producer_asked_for_holds(redis_client, make_pq):
    # Given a producer that asked for a 3600 s window and one that asked for 0.05 s, on one queue
    long = make_pq("m3w", dedupe_seconds=3600)
    short = make_pq("m3w", dedupe_seconds=0.05)
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


def test_a_long_window_lapses_when_its_producer_has_gone(redis_client, make_pq):
    # Given a 0.1 s producer gone quiet, and a 0.02 s one that goes on
    gone = make_pq("m3x", dedupe_seconds=0.1)
    short = make_pq("m3x", dedupe_seconds=0.02)
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


def test_dedupe_off_stores_every_publish(make_pq):
    q = make_pq("m3", dedupe_seconds=0)
    q.insert(b"x", 1, publish_id=b"p1")
    q.insert(b"x", 1, publish_id=b"p1")
    assert q.size() == 2


def test_insert_many_retried_chunks_are_stored_once(make_pq):
    q = make_pq("m3")
    items = [Item(b"x", 1, f"t{i}", publish_id=f"pub{i}") for i in range(25)]
    first = q.insert_many(items, chunk=10)
    assert q.insert_many(items, chunk=7) == first
    assert q.size() == 25


def test_insert_many_tells_repeats_apart_from_new_entries_when_asked(make_pq):
    # Given 5 items with publish ids of their own, 2 of them stored before, one publish id twice
    q = make_pq("m3t", max_length=100)
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


def test_insert_many_says_which_items_were_stored_when_a_chunk_fails(make_pq):
    q = make_pq("m3", max_length=15)
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


def test_answered_publish_ids_are_forgotten_so_the_window_costs_no_memory_per_entry(redis_client, make_pq):
    q = make_pq("m3")
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
