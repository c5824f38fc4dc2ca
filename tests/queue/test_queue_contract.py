"""Lua contract tests: each script called through PriorityQueue on a real redis-server, with
assertions on the raw keys. Every behavioural test runs under both patent techniques."""

import time

import pytest
import redis

from celery_pq import EntryNotFound, Item, LeaseLost, NotWaiting, QueueFull
from celery_pq.queue import QueueSettings, calls, open_queue
from celery_pq.storage.constants import SEQ_SPAN
from celery_pq.storage.ids import decode_id
from celery_pq.storage.records import split_entry, split_lease, split_pointer
from tests.support.tenants import tenant_counts


@pytest.fixture(params=["T", "S"])
def technique(request):
    return request.param


@pytest.fixture
def q(make_pq, technique):
    return make_pq("jobs", technique=technique, lease_seconds=30)


def pointers(client, q):
    """The priority index as (rank, seq, entry id), in delivery order, stale pointers too (a
    compaction pass's front list before the rank's list)."""
    out = []
    for rank in client.zrange(q.keys.priority_index, 0, -1):
        for p in client.lrange(q.keys.front(int(rank)), 0, -1) + client.lrange(q.keys.level(int(rank)), 0, -1):
            seq, eid = split_pointer(p)
            out.append((int(rank), seq, decode_id(eid)))
    return out


def ids(entries):
    return [e.id for e in entries]


def test_all_keys_share_one_hash_tag(q, redis_client):
    # Given a queue with waiting, leased and dead entries
    q.insert(b"a", 1, id="a")
    q.insert(b"b", 2, id="b")
    lease = q.pop()[0]
    q.dead_letter(lease, "rejected")
    q.pop()
    keys = [k.decode() for k in redis_client.keys(q.settings.key_prefix + ":*")]
    # Then every key of the queue and its dead-letter queue carries the tag {jobs}
    assert keys and all("{jobs}" in k for k in keys), keys


def test_insert_writes_both_tables_and_encodes_priority_then_fifo(q, redis_client, technique):
    q.insert(b"low", 1, id="l1")
    q.insert(b"high", 250, id="h1")
    q.insert(b"low2", 1, id="l2")
    k = q.keys
    assert redis_client.hlen(k.entries) == 3
    index = pointers(redis_client, q)
    assert [eid for _, _, eid in index] == ["h1", "l1", "l2"]
    assert [rank for rank, _, _ in index] == [255 - 250, 254, 254]  # a list per rank, best first
    rank, seq, _ = index[0]
    header, _ = split_entry(redis_client.hget(k.entries, "h1"))
    # the entry keeps its score (rank in the high bits, then the sequence): a pointer is
    # current only while the two agree
    assert header.score == rank * SEQ_SPAN + seq


def test_order_is_strict_priority_fifo_within_level(q):
    import random

    rng = random.Random(7)
    sent = [(f"t{i}", rng.randint(0, 255)) for i in range(300)]
    q.insert_many([Item(b"x", p, i) for i, p in sent])
    got = []
    while True:
        leases = q.pop(7)
        if not leases:
            break
        got += [(x.id, x.priority) for x in leases]
        q.ack(leases)
    expected = sorted(sent, key=lambda t: (-t[1], int(t[0][1:])))
    assert got == expected


def test_lower_first_order(make_pq, technique):
    q = make_pq("lf", technique=technique, priority_order="lower_first")
    for i, p in enumerate([5, 0, 255, 0]):
        q.insert(b"x", p, id=f"e{i}")
    assert [(e.id, e.priority) for e in q.peek(10)] == [("e1", 0), ("e3", 0), ("e0", 5), ("e2", 255)]


@pytest.mark.parametrize("bad", [-1, 256, 1.5, "7", None, True])
def test_bad_priority_is_rejected_and_nothing_written(q, redis_client, bad):
    with pytest.raises(ValueError, match="priority"):
        q.insert(b"x", bad, id="x")
    assert redis_client.exists(*q.keys.all()) == 0


def test_pop_leases_in_the_same_script(q, redis_client):
    q.insert(b"p", 3, id="a")
    [lease] = q.pop(consumer="c1")
    k = q.keys
    assert lease.id == "a" and lease.deliveries == 1 and lease.payload == b"p" and lease.priority == 3
    assert redis_client.zcard(k.priority_index) == 0
    assert redis_client.hexists(k.entries, "a")  # the entry stays in the identifier-indexed table
    record = split_lease(redis_client.hget(k.leases, "a"))
    assert (record.token, record.consumer, record.deliveries) == (lease.token, "c1", 1)
    deadline = redis_client.zscore(k.lease_deadlines, "a")
    now_s, now_us = redis_client.time()
    assert 29_000 < deadline - (now_s * 1000 + now_us // 1000) <= 30_000


def test_a_lease_by_id_shows_the_holder_and_the_time_left_on_the_redis_clock(q):
    task_id = "0b8f5c9e-3a1d-4f6e-9c2b-7d4e5f6a8b9c"  # stored in its compact form
    q.insert(b"p", 3, id=task_id)
    assert not q.leases(id=task_id)  # waiting, not leased
    [lease] = q.pop(consumer="host:123:ab", lease_seconds=20)
    [held] = q.leases(id=task_id)
    assert held["consumer"] == "host:123:ab" and held["deliveries"] == 1
    assert 19 < held["seconds_left"] <= 20 and "token" not in held
    q.extend([lease], lease_seconds=60)
    assert q.leases(id=task_id)[0]["deadline_ms"] > held["deadline_ms"]
    q.ack(lease)
    assert not q.leases(id=task_id) and not q.leases(id="no-such-id")


def test_leases_lists_the_leases_in_flight_soonest_deadline_first_without_tokens(make_pq):
    q = make_pq("jobs", fair=True)
    task_id = "0b8f5c9e-3a1d-4f6e-9c2b-7d4e5f6a8b9c"  # stored in its compact form
    q.insert(b"p", 200, id=task_id, tenant="acme")
    q.insert(b"p", 7, id="b", tenant="zed")
    q.insert(b"p", 3, id="waits")
    assert q.leases() == []
    [first] = q.pop(consumer="host:1:aa", lease_seconds=50)
    [second] = q.pop(consumer="host:2:bb", lease_seconds=20)
    listed = q.leases()
    assert [x["id"] for x in listed] == ["b", task_id]  # the 20 s lease ends first
    b, t = listed
    assert (b["consumer"], b["priority"], b["tenant"], b["deliveries"]) == ("host:2:bb", 7, "zed", 1)
    assert (t["consumer"], t["priority"], t["tenant"]) == ("host:1:aa", 200, "acme")
    assert 19 < b["seconds_left"] <= 20 and 49 < t["seconds_left"] <= 50
    assert t["deadline_ms"] == q.leases(id=task_id)[0]["deadline_ms"]
    assert 0 <= t["age_seconds"] < 5
    assert all(first.token not in repr(x) and second.token not in repr(x) for x in listed)
    assert [x["id"] for x in q.leases(1)] == ["b"]
    q.ack(second)
    assert [x["id"] for x in q.leases()] == [task_id]
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="limit must be an integer >= 1"):
            q.leases(bad)


def test_ack_deletes_and_checks_token(q, redis_client):
    q.insert(b"p", 3, id="a")
    [lease] = q.pop()
    assert q.ack(("a", "not-the-token")) is False
    with pytest.raises(LeaseLost):
        q.ack(("a", "not-the-token"), strict=True)
    assert q.ack(lease) is True
    assert redis_client.exists(q.keys.entries, q.keys.leases, q.keys.lease_deadlines, q.keys.priority_index) == 0
    assert q.ack(lease) is False  # a second ack finds no lease


def test_late_ack_after_expiry_does_not_touch_the_new_delivery(q):
    q.insert(b"p", 3, id="a")
    [first] = q.pop(lease_seconds=0.05)
    time.sleep(0.1)
    assert q.reclaim()["returned"] == 1
    [second] = q.pop()
    assert second.deliveries == 2 and second.token != first.token
    assert q.ack(first) is False  # the stale consumer's ack is refused
    assert q.extend([first]) == [False]
    assert q.stats()["leased"] == 1
    assert q.ack(second) is True


def test_requeue_returns_to_original_place(q):
    for i in range(3):
        q.insert(b"x", 10, id=f"e{i}")
    [a] = q.pop()
    assert a.id == "e0"
    q.insert(b"x", 10, id="e3")
    assert q.requeue(a) == "waiting"
    assert ids(q.peek(10)) == ["e0", "e1", "e2", "e3"]
    [again] = q.pop()
    assert again.id == "e0" and again.deliveries == 2


def test_requeued_batch_keeps_its_order(q, redis_client):
    # Given a consumer that took three entries at once and gives them back (a shutdown)
    q.insert_many([Item(b"x", 10, f"e{i}") for i in range(5)])
    batch = q.pop(3)
    q.insert(b"x", 10, id="late")
    # When they are requeued in any order
    for lease in (batch[1], batch[2], batch[0]):
        assert q.requeue(lease) == "waiting"
    # Then they are back at the front in their first order, and nothing is doubled
    assert ids(q.peek(10)) == ["e0", "e1", "e2", "e3", "e4", "late"]
    assert len(pointers(redis_client, q)) == 6


def test_priority_changed_away_and_back_is_delivered_once(q, redis_client, technique):
    # Given an entry moved to another priority and back (its old pointers go stale)
    q.insert_many([Item(b"x", 10, "a"), Item(b"x", 10, "b")])
    q.change_priority("a", 200)
    q.change_priority("a", 10)
    # Then it waits once, behind b, and is delivered once
    assert ids(q.peek(10)) == ["b", "a"]
    got = [lease.id for lease in q.pop(10)]
    assert got == ["b", "a"]
    assert q.pop() == [] and pointers(redis_client, q) == []
    # And a new entry with the same id after the ack is not served from an old pointer
    q.ack([("a", "nope")])
    q.insert(b"y", 10, id="c")


def test_requeue_without_counting_undoes_the_delivery(q):
    q.insert(b"x", 1, id="a")
    [lease] = q.pop()
    q.requeue(lease, count_delivery=False)
    assert q.pop()[0].deliveries == 1


def test_extend_moves_deadline_and_checks_token(q, redis_client):
    q.insert(b"x", 1, id="a")
    [lease] = q.pop(lease_seconds=1)
    before = redis_client.zscore(q.keys.lease_deadlines, "a")
    assert q.extend([lease], 100) == [True]
    assert redis_client.zscore(q.keys.lease_deadlines, "a") - before > 90_000
    assert q.extend([("a", "wrong")]) == [False]


def test_reclaim_returns_expired_and_dead_letters_after_max_deliveries(make_pq, technique):
    q = make_pq("rc", technique=technique, max_deliveries=2)
    q.insert(b"x", 9, id="a")
    for expected in (1, 2):
        [lease] = q.pop(lease_seconds=0.02)
        assert lease.deliveries == expected
        time.sleep(0.05)
        res = q.reclaim()
    assert res == {
        "returned": 0,
        "dead": 1,
        "skipped": False,
        "more": False,
        "promoted": 0,
        "dead_dropped": 0,
        "restored": 0,
    }
    assert q.size() == 0 and q.stats()["dead"] == 1
    [dead] = q.dead.peek()
    assert dead.id == "a" and dead.dead_reason == "max_deliveries" and dead.priority == 9
    assert dead.payload == b"x"


def test_reclaim_guard_throttles(q):
    assert q.reclaim(guard_seconds=5)["skipped"] is False
    assert q.reclaim(guard_seconds=5)["skipped"] is True
    assert q.reclaim()["skipped"] is False  # guard 0: always runs


def test_reclaim_by_consumer_returns_only_that_consumers_leases(q):
    for i in range(4):
        q.insert(b"x", 1, id=f"e{i}")
    q.pop(2, consumer="dead-worker")
    q.pop(1, consumer="live-worker")
    res = q.reclaim(consumer="dead-worker")
    assert res["returned"] == 2
    assert q.stats()["leased"] == 1 and q.size() == 3


def test_requeue_dead_letters_at_max_deliveries(make_pq, technique):
    q = make_pq("rq", technique=technique, max_deliveries=1)
    q.insert(b"x", 1, id="a")
    assert q.requeue(q.pop()[0]) == "dead"
    assert q.dead.size() == 1


def test_dead_letter_with_reason(q):
    q.insert(b"x", 1, id="a")
    assert q.dead_letter(q.pop()[0], "rejected") == "dead"
    [d] = q.dead.peek()
    assert d.dead_reason == "rejected" and d.dead_ms > 0
    with pytest.raises(ValueError):
        q.dead_letter(("a", "t"), "bad,reason")


def test_duplicate_ids_are_both_kept_and_acked_independently(q, redis_client):
    # Given a task leased under its own id
    q.insert(b"first", 5, id="task")
    [first] = q.pop()
    # When the same id is inserted again (Celery retry) while the first is leased
    eid = q.insert(b"second", 5, id="task")
    assert eid.startswith("task~")
    [second] = q.pop()
    assert second.payload == b"second"
    # Then acking one does not touch the other
    assert q.ack(first) is True
    assert q.stats()["leased"] == 1
    assert q.ack(second) is True
    # only the sequence counter, the mode record, the window of publish ids, the counters and
    # the sweep record (started by the first pop) remain
    left = {k for k in q.keys.all() if redis_client.exists(k)}
    assert left <= {
        q.keys.sequence,
        q.keys.mode,
        q.keys.publish_ids,
        q.keys.publish_ids_before,
        q.keys.publish_window,
        q.keys.counters,
        q.keys.last_sweep,
    }, left


def test_remove_by_id_removes_waiting_entries_and_duplicates(q, redis_client, technique):
    q.insert(b"x", 5, id="t1")
    q.insert(b"x", 5, id="other")
    q.insert(b"x", 5, id="t1")  # a duplicate of t1
    assert q.remove("t1") == 2
    assert ids(q.peek(10)) == ["other"]
    # technique S leaves the pointers for lazy deletion, T removes them now
    assert len(pointers(redis_client, q)) == (1 if technique == "T" else 3)
    [lease] = q.pop()
    assert lease.id == "other"
    # lazy deletion: the pop discarded the stale pointer in front of "other"; the one behind it
    # (the duplicate) is discarded when it surfaces
    assert len(pointers(redis_client, q)) == (0 if technique == "T" else 1)
    assert q.pop() == []
    assert pointers(redis_client, q) == []
    assert redis_client.zcard(q.keys.priority_index) == 0
    assert q.remove("nope") == 0


def test_remove_leaves_leased_entries_alone(q):
    q.insert(b"x", 5, id="t1")
    q.pop()
    assert q.remove("t1") == 0
    assert q.stats()["leased"] == 1


def test_lazy_deletion_then_cleanup_sweep(redis_client, make_pq):
    q = make_pq("lazy", technique="S")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(10)])
    for i in range(0, 10, 2):
        q.remove(f"e{i}")
    assert len(pointers(redis_client, q)) == 10
    assert q.size() == 5
    assert q.peek(1)[0].id == "e1"  # read-only: skips, does not delete
    assert len(pointers(redis_client, q)) == 10
    assert q.cleanup(count=4) == 2  # looks at e0..e3 only
    assert len(pointers(redis_client, q)) == 8
    assert [eid for _, _, eid in pointers(redis_client, q)][:2] == ["e1", "e3"]
    assert q.cleanup() == 3  # on from e4, where the first sweep stopped
    assert [eid for _, _, eid in pointers(redis_client, q)] == ["e1", "e3", "e5", "e7", "e9"]


def test_patent_operations(q):
    q.insert(b"a", 10, id="a")
    q.insert(b"b", 20, id="b")
    q.insert(b"c", 10, id="c")
    assert q.peek(1)[0].id == "b"
    assert q.retrieve_by_priority(10) == "a"
    assert q.retrieve_by_priority(11) is None
    q.remove("a")
    assert q.retrieve_by_priority(10) == "c"
    top = q.remove_highest_priority()
    assert top.id == "b" and top.payload == b"b"
    assert ids(q.peek(5)) == ["c"]
    assert q.remove_highest_priority().id == "c"
    assert q.remove_highest_priority() is None


def test_change_priority(q):
    for i, p in enumerate([10, 10, 50]):
        q.insert(b"x", p, id=f"e{i}")
    q.change_priority("e1", 50)  # goes behind e2, which was already waiting at 50
    assert [(e.id, e.priority) for e in q.peek(5)] == [("e2", 50), ("e1", 50), ("e0", 10)]
    q.change_priority("e0", 255)
    assert q.pop()[0].id == "e0"
    with pytest.raises(NotWaiting):
        q.change_priority("e0", 1)
    with pytest.raises(EntryNotFound):
        q.change_priority("missing", 1)
    with pytest.raises(ValueError):
        q.change_priority("e1", 999)


def test_max_length_is_exact_and_atomic(make_pq):
    q = make_pq("bounded", max_length=3)
    for i in range(3):
        q.insert(b"x", 1)
    with pytest.raises(QueueFull) as err:
        q.insert(b"x", 1)
    assert err.value.queue == "bounded" and err.value.size == 3
    q.pop()  # a leased entry is not waiting: room for one more
    q.insert(b"x", 1)
    assert q.size() == 3


def test_purge_keeps_leases(q):
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(2500)])
    lease = q.pop()[0]
    assert q.purge() == 2499
    assert q.size() == 0
    assert q.ack(lease)


def test_stats(q):
    q.insert(b"x", 5, id="a")
    q.insert(b"x", 5, id="b")
    q.insert(b"x", 200, id="c")
    q.pop()
    s = q.stats()
    assert s["waiting"] == 2 and s["leased"] == 1 and s["dead"] == 0
    assert s["per_priority"] == {5: 2}
    assert s["head_age_seconds"] is not None and s["head_age_seconds"] >= 0


def test_tenant_and_payload_with_separators_round_trip(q):
    payload = b"a|b,c\n\x00\xff|"
    q.insert(payload, 1, id="id,with|odd chars", tenant="acme,inc|x%")
    [lease] = q.pop()
    assert lease.payload == payload
    assert lease.tenant == "acme,inc|x%"
    assert lease.id == "id,with|odd chars"
    assert q.ack(lease)


def test_scores_stay_exact_at_the_extremes(q, redis_client):
    # Given the largest rank and a sequence near the top of its 44 bits
    redis_client.set(q.keys.sequence, SEQ_SPAN - 3)
    q.insert(b"x", 0, id="last")
    [(rank, seq, _)] = pointers(redis_client, q)
    score = split_entry(redis_client.hget(q.keys.entries, "last"))[0].score
    assert rank == 255 and seq == SEQ_SPAN - 2
    assert int(score) == 255 * SEQ_SPAN + SEQ_SPAN - 2 and int(score) < 2**53
    assert q.pop()[0].id == "last"


def forget_scripts(client):
    """What a restart without persistence does to the scripts and the library of functions."""
    client.script_flush()
    client.function_flush()


def test_pipelined_calls_survive_a_script_cache_flush(fresh_redis):
    redis_client = fresh_redis.client()
    q = open_queue(redis_client, "flushed")
    # Given scripts known to Redis, then forgotten (as after a Redis restart)
    q.insert(b"x", 1, id="a")
    forget_scripts(redis_client)
    # When an insert batch and a pop+ack pair run as pipelined EVALSHA calls
    q.insert_many([Item(b"y", 1, "b"), Item(b"z", 1, "c")])
    from celery_pq.queue import run_calls

    [lease] = q.pop(1)
    forget_scripts(redis_client)
    ack_reply, pop_reply = run_calls(
        redis_client, [q._scripts.ack_call([(lease.id, lease.token)]), q._scripts.pop_call(1)]
    )
    # Then each call ran exactly once
    assert ack_reply == [1]
    assert [x.id for x in calls.popped_leases(q._scripts, pop_reply)] == ["b"]
    assert q.size() == 1


@pytest.mark.parametrize("fair", [False, True])
def test_acks_ride_in_the_next_pop(redis_client, make_pq, fair):
    q = make_pq("ride", fair=fair)
    q.insert_many([Item(b"x", 1, f"e{i}", tenant="A") for i in range(3)])
    first = q.pop(2)
    # When a pop call carries the acks of the last deliveries, one of them with a wrong token
    script, keys, args = q._scripts.pop_call(1, acks=[(first[0].id, first[0].token), (first[1].id, "stale-token")])
    reply = script(keys=keys, args=args, client=redis_client)
    # Then the good ack is done, the bad one is refused by code, and the next entry is leased
    assert calls.ack_codes(reply) == [1, -3]
    assert [lease.id for lease in calls.popped_leases(q._scripts, reply)] == ["e2"]
    assert q.stats()["leased"] == 2 and redis_client.hexists(q.keys.entries, "e0") == 0
    if fair:
        assert tenant_counts(q)["A"]["leased"] == 2


def test_single_calls_survive_a_script_flush_a_killed_connection_and_a_restart(fresh_redis):
    # A single script call runs on the calling thread's own connection
    client = fresh_redis.client()
    q = open_queue(client, "own", QueueSettings(key_prefix="own"))
    q.insert(b"a", 1, id="a")
    # When Redis forgets the scripts, the call loads it and runs once
    forget_scripts(client)
    q.insert(b"b", 1, id="b")
    assert q.size() == 2
    # When the server closes that connection, the call goes through a fresh one
    for row in client.client_list():
        if row["cmd"] in ("evalsha", "script|load", "fcall", "function|load"):
            client.client_kill_filter(_id=row["id"])
    q.insert(b"c", 1, id="c")
    assert q.size() == 3
    # When Redis restarts (it keeps nothing), the calls after it work on a new connection
    fresh_redis.restart()
    q.insert(b"d", 1, id="d")
    assert [lease.id for lease in q.pop(5)] == ["d"]


def test_a_forked_child_does_not_share_the_parents_connection(make_pq):
    import os

    q = make_pq("fork")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(40)])
    q.pop(1)  # the parent now holds its own connection
    pid = os.fork()
    if pid == 0:  # the child pops on its own connection, interleaved with the parent
        code = 0
        try:
            for _ in range(15):
                if len(q.pop(1)) != 1:
                    code = 1
        except Exception:
            code = 2
        os._exit(code)
    got = [len(q.pop(1)) for _ in range(15)]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == [1] * 15
    assert q.size() == 40 - 1 - 15 - 15


def test_scripts_run_as_functions_of_one_library_loaded_once(fresh_redis):
    from celery_pq.scripts import library

    client = fresh_redis.client()
    q = open_queue(client, "lib")
    client.config_resetstat()
    # When a queue is used on a Redis with functions
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(3)])
    for lease in q.pop(3):
        q.ack(lease)
    # Then every script call is an FCALL of this version's library, loaded once
    stats = client.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] >= 4 and "cmdstat_evalsha" not in stats
    assert stats["cmdstat_function|load"]["calls"] == 1
    names = [dict(zip(lib[::2], lib[1::2]))[b"library_name"] for lib in client.function_list()]
    assert names == [library().name.encode()]


def test_a_user_who_may_not_load_functions_gets_the_same_scripts_by_evalsha(fresh_redis):
    # Given a Redis user allowed everything but FUNCTION
    with fresh_redis.client() as admin:
        admin.acl_setuser(
            "nofn", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-function"]
        )
    client = redis.Redis(port=fresh_redis.port, username="nofn", password="pw")
    q = open_queue(client, "nofn")
    # When it inserts, pops and acks
    q.insert(b"a", 1, id="a")
    [lease] = q.pop(1)
    assert q.ack(lease) and q.size() == 0
    # Then the scripts ran by EVALSHA
    with fresh_redis.client() as admin:
        stats = admin.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] >= 3 and "cmdstat_fcall" not in stats


def test_the_library_starts_every_call_with_fresh_module_state(fresh_redis):
    # A library keeps its top-level tables between calls; each function makes them new, as a
    # script's fresh run does (CTX.dropped counts the dead letters dropped by one call only)
    client = fresh_redis.client()
    q = open_queue(client, "state", QueueSettings(max_dead_length=1))
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(2)])
    first, second = q.pop(2)
    # Given a call that dropped a dead letter to make room
    assert q.dead_letter(first) == "dead" and q.dead_letter(second) == "dead"
    assert q.dead.size() == 1
    # When the next call drops nothing, it says it dropped nothing
    assert q.reclaim()["dead_dropped"] == 0


@pytest.mark.parametrize("fair", [False, True])
def test_peek_gives_exactly_the_count_asked_in_delivery_order(make_pq, fair):
    # Given 12 entries over three priorities (two tenants when fair)
    q = make_pq("peekn", fair=fair)
    for i in range(12):
        q.insert(b"x", [0, 100, 255][i % 3], id=f"e{i}", tenant=("a", "b")[i % 2] if fair else None)
    # When fewer entries are asked for than a rank holds, or more than there are
    # Then exactly that many come back (all there are at most), the highest priority first
    for n in (1, 3, 5, 12, 20):
        got = q.peek(n)
        assert len(got) == min(n, 12), n
        assert [e.priority for e in got] == sorted((e.priority for e in got), reverse=True)
    assert [e.id for e in q.peek(5)] == ["e2", "e5", "e8", "e11", "e1"]


def test_the_sweep_record_starts_with_a_queues_first_leases_and_the_pops_after_keep_it(q, redis_client):
    # Given a queue whose first pop leased an entry: the sweep record holds that pop's time
    q.insert_many([Item(b"x", 1) for _ in range(3)])
    [a] = q.pop(1)
    first = redis_client.get(q.keys.last_sweep)
    assert first is not None
    # When a later pop acks that lease and takes another (a consumer's steady stream)
    time.sleep(0.01)
    [b] = q.pop(1, acks=[(a.id, a.token)])
    # Then the record is the first leases' time still (no sweep ran since)
    assert redis_client.get(q.keys.last_sweep) == first
    # and a pop that acks nothing makes sure of it again where it is gone
    redis_client.delete(q.keys.last_sweep)
    q.pop(1, acks=[])
    assert redis_client.get(q.keys.last_sweep) is not None
    assert q.ack(b) is True
