"""Unique tasks, debounce and throttle by key, on a real redis-server: insert.lua decides per
entry, atomically, what a key's standing entry makes of a new publish (queue/unique.py,
lua/includes/unique.lua), and every way an entry leaves frees its key."""

from __future__ import annotations

import time

import pytest

from celery_pq import Item, QueueFull
from celery_pq.queue import QueueSettings, calls, open_queue
from celery_pq.queue.running import run_waiting
from celery_pq.queue.sharded import ShardedQueue
from celery_pq.queue.unique import UniqueKey
from celery_pq.storage.ids import encode_id
from celery_pq.storage.records import split_entry, split_pointer


def q_of(make_pq, name="uq", **kw):
    kw.setdefault("event_log", 1000)
    return make_pq(name, **kw)


def put(q, id, key, mode="while_waiting", seconds=60.0, priority=1, payload=None, retries=0, remember=None, **kw):
    unique = UniqueKey(key, mode, seconds, retries=retries) if retries else UniqueKey(key, mode, seconds)
    return q.insert(Item(payload or id.encode(), priority, id=id, **kw), unique=unique, remember=remember)


def waiting(q):
    return [e.id for e in q.peek(50)]


def held(client, q):
    return {k.decode(): v.decode() for k, v in client.hgetall(q.keys.unique_keys).items()}


def test_while_waiting_merges_until_the_entry_is_leased(make_pq):
    q = q_of(make_pq)
    assert put(q, "a1", "k").kind == "stored"
    out = put(q, "a2", "k")
    assert (out.kind, out.task_id, out.requested, out.key) == ("merged", "a1", "a2", "k")
    assert waiting(q) == ["a1"]
    [lease] = q.pop(1)
    # Given the standing entry is running, when the key is published again, it is stored
    assert put(q, "a3", "k").kind == "stored"
    assert waiting(q) == ["a3"]
    q.ack(lease)  # the ack of the old one leaves the new one's record alone
    out = put(q, "a4", "k")
    assert (out.kind, out.task_id, out.requested) == ("merged", "a3", "a4")
    assert q.counters()["unique_merged"] == 2


def test_while_active_holds_the_key_while_running_until_the_ack(redis_client, make_pq):
    q = q_of(make_pq)
    put(q, "b1", "k", "while_active")
    [lease] = q.pop(1)
    assert put(q, "b2", "k", "while_active").task_id == "b1"
    assert q.size() == 0
    q.ack(lease)
    assert held(redis_client, q) == {}  # freed at once by the ack (the entry's flag "u")
    assert put(q, "b3", "k", "while_active").kind == "stored"


def test_acks_carried_by_a_pop_free_their_keys(redis_client, make_pq):
    # Given two running entries holding keys (one a duplicate id: flags "du") and one without
    q = q_of(make_pq)
    put(q, "c1", "k1", "while_active")
    put(q, "c2", "k2", "while_active")
    q.insert(b"plain", 1, id="c3")
    held_leases = q.pop(3)
    put(q, "c1", "k3", "while_active")  # a republished id: stored as a duplicate "c1~<seq>"
    [dup] = q.pop(1)
    assert dup.id.startswith("c1~")
    # When the next pop carries all four acks (pop.lua's ack_pairs, not ack.lua)
    popped = q.pop(1, acks={q: [(lease.id, lease.token) for lease in [*held_leases, dup]]})
    codes = popped.acked
    # Then every key is free at once and new publishes of them are stored
    assert codes[q] == [1, 1, 1, 1]
    assert held(redis_client, q) == {}
    for key in ("k1", "k2", "k3"):
        assert put(q, f"n-{key}", key, "while_active").kind == "stored"


def test_a_key_is_freed_by_a_dead_letter(redis_client, make_pq):
    q = q_of(make_pq, max_deliveries=1)
    put(q, "c1", "k", "while_active")
    [lease] = q.pop(1)
    assert q.requeue(lease) == "dead"
    assert held(redis_client, q) == {}
    assert put(q, "c2", "k", "while_active").kind == "stored"


def test_a_key_is_freed_by_remove_and_purge(redis_client, make_pq):
    for technique in ("T", "S"):
        q = q_of(make_pq, name=f"rm{technique}", technique=technique)
        put(q, "d1", "k")
        assert q.remove("d1") == 1
        assert put(q, "d2", "k").kind == "stored"  # (S: the record names an entry gone: free)
        put(q, "d3", "j", delay=30)
        q.purge()
        assert q.size() == 0 and redis_client.zcard(q.keys.delayed) == 0
        assert put(q, "d4", "k").kind == "stored" and put(q, "d5", "j").kind == "stored"


def test_a_lost_lease_comes_back_still_holding_its_key(make_pq):
    q = q_of(make_pq)
    put(q, "e1", "k", "while_active")
    q.pop(1, consumer="gone", lease_seconds=0.05)
    time.sleep(0.1)
    assert q.reclaim()["returned"] == 1
    assert waiting(q) == ["e1"]
    assert put(q, "e2", "k").task_id == "e1"  # waiting again: while_waiting merges too
    [again] = q.pop(1)
    assert again.id == "e1" and again.deliveries == 2
    q.ack(again)
    assert put(q, "e3", "k").kind == "stored"


def test_replace_keeps_the_place_in_line_at_the_same_priority(redis_client, make_pq):
    q = q_of(make_pq)
    q.insert(b"x", 1, id="first")
    put(q, "r1", "k", "replace")
    q.insert(b"y", 1, id="last")
    out = put(q, "r2", "k", "replace", payload=b"new")
    assert (out.kind, out.task_id) == ("replaced", "r2")
    assert waiting(q) == ["first", "r2", "last"]
    assert [e.payload for e in q.peek(3)][1] == b"new"
    assert redis_client.hexists(q.keys.entries, "r1") == 0
    # a different priority: the new one goes to the back of its own level
    put(q, "r3", "k", "replace", priority=1)
    put(q, "r4", "k", "replace", priority=5)
    assert waiting(q) == ["r4", "first", "last"]
    assert [e.priority for e in q.peek(1)] == [5]
    assert q.counters()["unique_replaced"] == 3
    replaced = [(ev["e"], ev["id"], ev["r"]) for ev in q.events() if ev["e"] == "replaced"]
    assert replaced[0] == ("replaced", "r1", "k")


def test_replace_of_a_running_entry_stores_the_new_one(make_pq):
    q = q_of(make_pq)
    put(q, "s1", "k", "replace")
    q.pop(1)
    assert put(q, "s2", "k", "replace").kind == "stored"
    assert put(q, "s3", "k", "replace").kind == "replaced"
    assert waiting(q) == ["s3"]


def test_debounce_twice_moves_the_due_time_and_the_last_payload_wins(redis_client, make_pq):
    q = q_of(make_pq)
    assert put(q, "g1", "k", "debounce", 10, payload=b"one").kind == "stored"
    due1 = redis_client.zscore(q.keys.delayed, "g1")
    time.sleep(0.02)
    out = put(q, "g2", "k", "debounce", 10, payload=b"two")
    assert (out.kind, out.task_id) == ("debounced", "g2")
    due2 = redis_client.zscore(q.keys.delayed, "g2")
    assert due2 > due1 and redis_client.zscore(q.keys.delayed, "g1") is None
    assert redis_client.hexists(q.keys.entries, "g1") == 0
    assert split_entry(redis_client.hget(q.keys.entries, "g2"))[1] == b"two"
    # a short delay: it runs once it is due
    put(q, "g3", "k", "debounce", 0.05, payload=b"three")
    time.sleep(0.1)
    q.reclaim()
    [lease] = q.pop(5)
    assert lease.id == "g3" and lease.payload == b"three"


def test_throttle_stores_one_per_period(make_pq):
    q = q_of(make_pq)
    assert put(q, "t1", "k", "throttle", 0.2).kind == "stored"
    out = put(q, "t2", "k", "throttle", 0.2)
    assert (out.kind, out.task_id) == ("throttled", "t1")
    q.ack(q.pop(1)[0])  # an ack does not end the period
    assert put(q, "t3", "k", "throttle", 0.2).kind == "throttled"
    time.sleep(0.25)
    assert put(q, "t4", "k", "throttle", 0.2).kind == "stored"
    assert q.counters()["unique_throttled"] == 2


def test_the_sweep_prunes_records_that_stand_no_more(redis_client, make_pq):
    q = q_of(make_pq)
    put(q, "p1", "t", "throttle", 0.05)
    put(q, "p2", "k", "while_active")
    redis_client.hdel(q.keys.entries, "p2")  # gone by a path that frees nothing
    time.sleep(0.1)
    q.reclaim()
    assert held(redis_client, q) == {} and redis_client.hlen(q.keys.unique_holders) == 0


def test_a_repeated_publish_id_is_still_stored_once(make_pq):
    q = q_of(make_pq, dedupe_seconds=60)
    first = put(q, "h1", "k", publish_id=b"pid-1")
    again = put(q, "h1", "k", publish_id=b"pid-1")
    assert first.kind == "stored" and again.task_id == "h1" and q.size() == 1
    merged = put(q, "h2", "k", publish_id=b"pid-2")
    assert merged.kind == "merged"
    assert put(q, "h2", "k", publish_id=b"pid-2").task_id == "h1"  # the resend: told the same
    assert q.size() == 1 and q.counters()["enqueued"] == 1


def test_insert_unique_takes_insert_s_options_and_names_an_unknown_one(make_pq):
    q = q_of(make_pq)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'tennant'"):
        put(q, "t1", "k", tennant="acme")
    assert q.size() == 0
    out = put(q, "t1", "k", tenant="acme", delay=30, task="proj.add", remember=True)
    assert out.kind == "stored"
    [(entry, _)] = q.delayed(5)  # (delay=30: waiting in the delayed index)
    assert entry.tenant == "acme" and entry.id == "t1" and q.peek(5) == []


def test_merges_do_not_count_against_max_length(redis_client, make_pq):
    q = q_of(make_pq, max_length=2)
    put(q, "m1", "a")
    put(q, "m2", "b", "replace")
    assert put(q, "m3", "a").kind == "merged"  # full, but nothing is added
    assert put(q, "m4", "b", "replace").kind == "replaced"  # one leaves as one comes
    with pytest.raises(QueueFull):
        put(q, "m5", "c")
    assert q.size() == 2 and held(redis_client, q).keys() == {"a", "b"}


def test_fair_queue_replace_and_merge(make_pq):
    q = q_of(make_pq, fair=True)
    put(q, "f1", "k", "replace", tenant="acme")
    q.insert(b"z", 1, id="other", tenant="beta")
    assert put(q, "f2", "k", "replace", tenant="acme").kind == "replaced"
    assert put(q, "f3", "j", tenant="acme").kind == "stored"
    assert put(q, "f4", "j", tenant="acme").kind == "merged"
    got = []
    while popped := q.pop(1):
        got += [lease.id for lease in popped]
        q.ack(popped[0])
    assert sorted(got) == ["f2", "f3", "other"]


def test_a_key_always_lands_on_the_same_shard(redis_client, key_prefix):
    q = open_queue(redis_client, "sh", QueueSettings(shards=4, key_prefix=key_prefix))
    assert isinstance(q, ShardedQueue)
    outs = [q.insert(Item(b"x", 1), unique=UniqueKey(f"key-{i % 5}")) for i in range(20)]
    assert sum(o.kind == "stored" for o in outs) == 5
    assert q.size() == 5


def test_bad_keys_are_refused_before_anything_is_sent():
    for bad in ("", 3, None):
        with pytest.raises(ValueError, match="unique key"):
            UniqueKey(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unique mode"):
        UniqueKey("k", "sometimes")
    for bad in (0, -1, "5", float("nan"), True):
        with pytest.raises(ValueError, match="unique seconds"):
            UniqueKey("k", "throttle", bad)  # type: ignore[arg-type]


def test_a_keyless_insert_sends_what_it_sent_before(redis_client, make_pq):
    """The ARGV of an insert without a key: the layout it always had, with the one count "0" of
    the (empty) list of unique keys before the entries; the reply: the entry id alone."""
    q = q_of(make_pq, event_log=0)._scripts
    _, head = calls.insert_head(q)
    item = (Item(b"p", 1, "id1"), None)
    args = calls.insert_args(q, head, [item], (), "0")
    rank = q.rank(1)
    assert args == [0, 0, "", 0, 0, "0", 0, encode_id("id1"), rank, "", b"p", "0", "", "", "", "", q.context]
    assert calls.insert_args(q, head, [item], (), "0", {}) == args
    [reply] = run_waiting(q.client, [q.insert_call([item])], [q])[0]
    assert reply == [b"id1"]
    assert redis_client.exists(q.keys.unique_keys, q.keys.unique_holders) == 0
    assert split_entry(redis_client.hget(q.keys.entries, "id1"))[0].flags == b""


def test_a_retry_of_the_running_task_is_stored_not_merged(make_pq):
    """Celery's retry publishes the task's own id again while it runs, its ``retries`` one up:
    with the key held by that very run (while_active) or within its throttle period, the retry
    is stored (under a duplicate id), not merged into the run about to be acked. The same id
    published again without more retries (a task id the caller chose) is merged or throttled."""
    q = q_of(make_pq)
    put(q, "task-1", "k", "while_active")
    [lease] = q.pop(1)
    again = put(q, "task-1", "k", "while_active")  # the same id, no retry: merged into the run
    assert (again.kind, again.task_id) == ("merged", "task-1")
    retry = put(q, "task-1", "k", "while_active", retries=1)
    assert retry.kind == "stored" and retry.task_id.startswith("task-1~")
    assert put(q, "other", "k", "while_active").task_id == retry.task_id  # the retry holds the key
    q.ack(lease)
    assert put(q, "other", "k", "while_active").task_id == retry.task_id
    assert put(q, "task-1", "k", "while_active", retries=1).task_id == retry.task_id  # not more retries
    put(q, "t-1", "t", "throttle", 60)
    assert put(q, "t-1", "t", "throttle", 60).kind == "throttled"
    assert put(q, "t-1", "t", "throttle", 60, retries=1).kind == "stored"
    assert put(q, "t-1", "t", "throttle", 60, retries=1).kind == "throttled"
    assert put(q, "t-2", "t", "throttle", 60).kind == "throttled"
    with pytest.raises(ValueError, match="retries"):
        UniqueKey("k", retries=-1)


def orphans(client, q) -> list[str]:
    """Key records (uq, ue) and debounce publish times (ub) that name no entry of the queue."""
    entries = {k.decode() for k in client.hkeys(q.keys.entries)}
    named = [rec.rsplit("|", 1)[1] for rec in held(client, q).values() if rec.startswith("e|")]
    named += [k.decode() for k in client.hkeys(q.keys.unique_holders)]
    named += [m.decode() for m in client.zrange(q.keys.debounce_publishes, 0, -1)]
    return [eid for eid in named if eid not in entries]


@pytest.mark.parametrize("technique", ["S", "T"])
def test_an_entry_removed_leaves_no_record_to_swallow_a_reused_id(redis_client, make_pq, technique):
    # Given an entry holding key k, removed by id
    q = q_of(make_pq, name=f"reuse{technique}", technique=technique)
    put(q, "d1", "k")
    assert q.remove("d1") == 1
    # Then its key record went with it
    assert held(redis_client, q) == {} and orphans(redis_client, q) == []
    # and when its id is taken again by an entry of another key, a publish of k is stored, not
    # merged into that unrelated entry (where it would never run)
    assert put(q, "d1", "j").kind == "stored"
    assert put(q, "d2", "k").kind == "stored"
    assert sorted(waiting(q)) == ["d1", "d2"]


def test_no_way_out_of_the_queue_leaves_a_key_record_behind(redis_client, make_pq):
    """Every way an entry leaves (ack, dead letter, expiry, purge, replace, debounce, removal)
    takes its key records with it; a requeue keeps them (the entry is still there)."""
    q = q_of(make_pq, max_deliveries=2, technique="S")
    put(q, "ack", "a", "while_active")
    put(q, "dead", "b", "while_active")
    put(q, "expired", "c", "while_active", ttl=0.05)
    put(q, "replaced", "d", "replace")
    put(q, "debounced", "e", "debounce", 30)
    [first] = q.pop(1)
    q.ack(first)
    [second] = q.pop(1)
    assert q.requeue(second) == "waiting"  # back to waiting: still holds its key
    assert orphans(redis_client, q) == [] and "b" in held(redis_client, q)
    [second] = q.pop(1)
    assert q.requeue(second) == "dead"
    time.sleep(0.1)
    assert [lease.id for lease in q.pop(5)] == ["replaced"]  # the expired one is dead-lettered
    put(q, "replacing", "d", "replace")
    put(q, "debouncing", "e", "debounce", 30)
    assert orphans(redis_client, q) == []
    assert set(held(redis_client, q)) == {"d", "e"}
    q.purge()
    assert held(redis_client, q) == {} and orphans(redis_client, q) == []
    assert redis_client.zcard(q.keys.debounce_publishes) == 0


def test_throttle_records_are_pruned_as_fast_as_new_keys_come(redis_client, make_pq):
    """An "at most once per period per user" throttle with many new users a second: each
    throttled insert drops a few records whose period is over, so the key table keeps pace with
    any rate of new keys (the sweep alone pruned about 50 a call) and nothing sweeps here."""
    q = q_of(make_pq, event_log=0)
    # Given 1,000 distinct keys throttled for 0.5 s, their periods over
    for i in range(1000):
        put(q, f"a{i}", f"user-a{i}", "throttle", 0.5)
    time.sleep(0.55)
    # When 500 new keys come (throttled for a minute), at thousands a second, with no sweep
    for i in range(500):
        put(q, f"b{i}", f"user-b{i}", "throttle", 60)
    # Then every record whose period was over is gone: the table holds the live ones only
    assert redis_client.hlen(q.keys.unique_keys) == 500
    assert redis_client.zcard(q.keys.throttle_deadlines) == 500
    # and rounds of 500 new keys with a short period stay at most one round over the live ones
    sizes = []
    for r in range(4):
        for i in range(500):
            put(q, f"c{r}-{i}", f"user-c{r}-{i}", "throttle", 0.05)
        sizes.append(redis_client.hlen(q.keys.unique_keys))
        time.sleep(0.06)
    assert max(sizes) <= 1000, sizes
    assert q.stats()["unique"]["keys"] <= 1000


def test_replace_looks_for_the_old_place_near_the_ends_only(redis_client, make_pq):
    """A replace finds the waiting one's pointer with LPOS bounded by MAXLEN (from the head and
    from the tail of its rank): its work does not grow with the backlog. Near either end the new
    entry keeps the old one's place; deep in the backlog it goes to the back of its priority."""
    q = q_of(make_pq, event_log=0)
    put(q, "head", "h", "replace")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(20_000)], chunk=1000)
    put(q, "deep", "d", "replace")
    q.insert_many([Item(b"x", 1, f"f{i}") for i in range(20_000)], chunk=1000)
    put(q, "tail", "t", "replace")
    q.insert_many([Item(b"x", 1, f"g{i}") for i in range(10)])
    # When each is replaced, SLOWLOG recording every command the script runs
    before = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis_client.config_set("slowlog-log-slower-than", 0)
    try:
        redis_client.slowlog_reset()
        for old in ("head", "deep", "tail"):
            out = put(q, f"{old}2", {"head": "h", "deep": "d", "tail": "t"}[old], "replace")
            assert out.kind == "replaced"
        log = redis_client.execute_command("SLOWLOG", "GET", -1)
    finally:
        redis_client.config_set("slowlog-log-slower-than", before)
    # Then every LPOS it ran was bounded (MAXLEN), a few per replace
    lpos = [[bytes(a).upper() for a in entry[3]] for entry in log if bytes(entry[3][0]).upper() == b"LPOS"]
    assert lpos and all(b"MAXLEN" in args for args in lpos), lpos
    assert len(lpos) <= 3 * 4
    # and the head and tail replaced in place, the deep one at the back of its priority
    rank = q.rank(1)
    level = [split_pointer(p)[1].decode() for p in redis_client.lrange(q.keys.level(rank), -12, -1)]
    assert level[-12:] == ["tail2", *(f"g{i}" for i in range(10)), "deep2"]
    assert q.peek(1)[0].id == "head2"
    assert redis_client.hexists(q.keys.entries, "deep") == 0
    assert q.size() == 40_013


def test_a_backward_step_of_the_clock_stretches_a_throttle_by_one_period_at_most(redis_client, make_pq):
    q = q_of(make_pq)
    put(q, "t1", "k", "throttle", 0.2)
    # Given the record as a Redis whose clock was an hour ahead wrote it (the state a failover to
    # a replica an hour behind leaves: its deadline an hour and a period away)
    kind, _, rest = redis_client.hget(q.keys.unique_keys, "k").decode().split("|", 2)
    sec, usec = redis_client.time()
    ahead = sec * 1000 + usec // 1000 + 3_600_000 + 200
    redis_client.hset(q.keys.unique_keys, "k", f"{kind}|{ahead}|{rest}")
    redis_client.zadd(q.keys.throttle_deadlines, {"k": ahead})
    # Then a publish within the period is throttled, and the period ends a period later, not in an hour
    assert put(q, "t2", "k", "throttle", 0.2).kind == "throttled"
    time.sleep(0.25)
    assert put(q, "t3", "k", "throttle", 0.2).kind == "stored"


def test_a_backward_step_of_the_clock_delays_a_debounce_by_one_delay_at_most(redis_client, make_pq):
    q = q_of(make_pq)
    put(q, "d1", "k", "debounce", 0.2)
    # Given the debounced entry as a Redis whose clock was an hour ahead stored it: due an hour
    # and a delay from now, published an hour from now
    sec, usec = redis_client.time()
    now = sec * 1000 + usec // 1000
    redis_client.zadd(q.keys.delayed, {"d1": now + 3_600_000 + 200})
    redis_client.zadd(q.keys.debounce_publishes, {"d1": now + 3_600_000})
    # When the sweep runs, and again once the delay has passed
    q.reclaim()
    assert redis_client.zscore(q.keys.delayed, "d1") <= now + 1000
    time.sleep(0.25)
    q.reclaim()
    # Then it is due: it runs a delay after the step, not an hour later
    [lease] = q.pop(1)
    assert lease.id == "d1"
