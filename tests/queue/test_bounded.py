"""Bounded work per script call, asserted by counting, never by timing.

Redis runs one script at a time, so no call may do work that grows with the queue. Each test
builds a worst case at a small size (20,000 entries) on a real redis-server and counts what one
call did: the commands it ran inside (``INFO commandstats``: an HGET per pointer looked at), or
how far its cursor moved; then checks that nothing was lost or delivered twice, in order.
benchmarks/slowlog.py measures the same cases' durations at 120,000 entries.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from celery_pq import Item, PriorityQueue, QueueMigrating
from celery_pq.storage import constants as C

try:
    from support.consume import pop_all
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import pop_all
from celery_pq.queue import run_calls

N = 20_000


def commandstats(client) -> Counter:
    return Counter({name.removeprefix("cmdstat_"): row["calls"] for name, row in client.info("commandstats").items()})


def counted(client, fn) -> Counter:
    """The commands Redis ran (scripts' inner commands included) while fn ran."""
    before = commandstats(client)
    fn()
    after = commandstats(client)
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k]})


def fill(q, n, *, prefix="e", priority=5, tenants=0, chunk=1000):
    items = [Item(b"x", priority, f"{prefix}{i}", tenant=f"t{i % tenants}" if tenants else None) for i in range(n)]
    q.insert_many(items, chunk=chunk)


def pointers(client, q, rank):
    """A rank's pointers: its compaction pass's front list, then its list."""
    return client.llen(q.keys.front(rank)) + client.llen(q.keys.level(rank))


def drain(q, count=100):
    return pop_all(q, count)


def test_a_paused_tenant_at_the_head_costs_each_insert_one_bounded_compaction_step(redis_client, make_pq):
    # Given a fair queue whose paused tenant holds the head of a priority, and N entries of
    # other tenants behind it, all served: N stale pointers wait behind the head
    q = make_pq("paused-head", fair=True)
    q.insert(b"held", 5, id="held", tenant="held")
    q.pause("held")
    fill(q, N, tenants=50)
    assert len(drain(q)) == N
    rank = q.rank(5)
    assert pointers(redis_client, q, rank) > N
    # When inserts come, one at a time
    looked = []
    for i in range(COMPACT_PUSHES):
        seen = counted(redis_client, lambda: q.insert(b"y", 5, id=f"new{i}", tenant=f"t{i % 50}"))
        looked.append(seen["hget"])
    # Then no insert looked at more than one compaction step of pointers (the old rebuild
    # looked at all N in one call), and the steps together dropped the stale ones
    assert max(looked) <= C.COMPACT_STEP + 5, max(looked)
    assert sum(looked) >= N  # (one HGET per pointer looked at)
    assert pointers(redis_client, q, rank) <= 2 * (COMPACT_PUSHES + 1) + 2 * 64
    # and every entry is delivered once, the paused tenant's after its resume
    assert sorted(drain(q)) == sorted(f"new{i}" for i in range(COMPACT_PUSHES))
    q.resume("held")
    assert drain(q) == ["held"]


#: Inserts after the backlog was served: enough for the compaction steps (one per 64 pushes) to
#: pass over N stale pointers.
COMPACT_PUSHES = 64 * (N // C.COMPACT_STEP + 2)


def test_a_pass_under_way_keeps_fifo_order_returns_and_removals(redis_client, make_pq):
    # Given a plain queue (technique S) of N entries, all but every 10th removed by id
    q = make_pq("pass", technique="S")
    fill(q, N)
    for i in range(N):
        if i % 10:
            q.remove(f"e{i}")
    rank = q.rank(5)
    # When a few cleanup steps have run, so a compaction pass is under way (the front list holds
    # the current pointers looked at, the list the rest)
    for _ in range(3):
        gone, looked, more = q._scripts.run("cleanup", rank=rank, count=C.COMPACT_STEP)
        assert looked == C.COMPACT_STEP and more == 1  # the cursor moved by one step, no more
    assert redis_client.llen(q.keys.front(rank)) == len(range(0, 3 * C.COMPACT_STEP, 10))
    assert redis_client.zscore(q.keys.priority_index, rank) == rank + 0.5
    # and entries are popped, returned, re-prioritised and removed (technique T's way too) meanwhile
    first = q.pop(3)
    assert [lease.id for lease in first] == ["e0", "e10", "e20"]
    q.requeue(first[1])
    q.change_priority("e30", 5)  # to the back of its priority
    q.remove("e40")
    q.insert(b"x", 5, id="last")
    q.ack(first[0])
    q.ack(first[2])
    # Then the order is FIFO with the returned entry back at its place, each entry once
    want = ["e10"] + [f"e{i}" for i in range(50, N, 10)] + ["e30", "last"]
    assert q.peek(3)[0].id == "e10"
    assert drain(q, count=7) == want
    assert redis_client.hlen(q.keys.entries) == 0


def test_cleanup_takes_bounded_steps_from_where_it_stopped(redis_client, make_pq):
    q = make_pq("cleanup", technique="S")
    fill(q, N)
    for i in range(N // 2, N):
        q.remove(f"e{i}")
    seen = counted(redis_client, lambda: q.cleanup(count=N))
    # every pointer looked at once (an HGET each), in calls of at most COMPACT_STEP
    assert seen["hget"] == N
    calls = seen["fcall"] + seen["evalsha"]
    assert calls == -(-N // C.COMPACT_STEP)
    assert pointers(redis_client, q, q.rank(5)) == N // 2
    assert drain(q) == [f"e{i}" for i in range(N // 2)]


def test_migrate_mode_runs_in_bounded_steps_and_fences_the_queue(redis_client, make_pq, key_prefix):
    # Given a plain queue of N entries (some leased) over several priorities
    q = make_pq("migrate")
    items = [Item(b"x", i % 3, f"e{i}", tenant=f"t{i % 7}") for i in range(N)]
    q.insert_many(items)
    held = q.pop(10)
    # (made directly: open_queue would take the recorded mode)
    fair = PriorityQueue(redis_client, "migrate", key_prefix=key_prefix, fair=True, priority_order="lower_first")
    # When one step of the migration has run
    waiting, leased, bad, done = fair._scripts.run("migrate", step=C.MIGRATE_STEP)
    assert done == 0 and waiting + leased <= 2 * C.MIGRATE_STEP
    # Then every other call does nothing and says why: a pipeline raises, the queue API waits
    with pytest.raises(QueueMigrating):
        run_calls(redis_client, [fair._scripts.pop_call(1)])
    assert q.extend(held) == [True] * 10  # leases are renewed meanwhile
    # And each later step looks at a bounded number of entries (HSCAN's COUNT is a hint: a
    # little more), and moves at most a step of pointers
    calls = 1
    while not done:
        reply = []
        seen = counted(
            redis_client,
            lambda: reply.extend(fair._scripts.run("migrate", step=C.MIGRATE_STEP)),
        )
        assert seen["sadd"] <= 2 * C.MIGRATE_STEP and seen["rpush"] <= C.MIGRATE_STEP
        done = reply[3]
        calls += 1
    assert calls >= N // (2 * C.MIGRATE_STEP)
    # and the queue is fair, lower-first, with every entry once: priority 0 first, FIFO within
    # a tenant, the leases kept
    assert fair.recorded()["mode"] == fair.mode
    for lease in held:
        assert fair.ack(lease)
    got = drain(fair)
    held_ids = {lease.id for lease in held}
    assert sorted(got) == sorted(f"e{i}" for i in range(N) if f"e{i}" not in held_ids)
    ranks = [int(got_id[1:]) % 3 for got_id in got]
    assert ranks == sorted(ranks)
    for t in range(7):
        mine = [int(g[1:]) for g in got if int(g[1:]) % 7 == t and int(g[1:]) % 3 == 0]
        assert mine == sorted(mine)


def test_the_queue_api_waits_out_a_migration(redis_client, make_pq):
    q = make_pq("wait")
    fill(q, 3000)
    fair = make_pq("wait", fair=True)
    fair._scripts.run("migrate", step=100)  # the migration's first step
    # While it is under way, a pop waits (retrying: each try does nothing) ...
    got = []
    t = threading.Thread(target=lambda: got.extend(fair.pop(1)))
    t.start()
    time.sleep(0.2)
    assert not got and redis_client.hlen(fair.keys.leases) == 0
    # ... until the migration is over
    fair.migrate_mode()
    t.join(timeout=C.MIGRATION_WAIT)
    assert [lease.id for lease in got] == ["e0"]


def test_an_expired_publish_id_window_is_unlinked_not_deleted(redis_client, make_pq):
    q = make_pq("window", dedupe_seconds=1)
    q.insert(b"first", 1)
    redis_client.hset(q.keys.publish_ids, mapping={f"p{i}": "" for i in range(N)})
    redis_client.hset(q.keys.publish_ids_before, mapping={f"p{i}": "" for i in range(N)})
    redis_client.set(q.keys.publish_window, int(time.time() * 1000) - 5000)
    seen = counted(redis_client, lambda: q.insert(b"after", 1))
    # Redis frees the big hashes in the background: UNLINK, never DEL, in the script
    assert seen["unlink"] == 1 and seen["del"] == 0
    assert redis_client.hlen(q.keys.publish_ids_before) == 0 and redis_client.hlen(q.keys.publish_ids) == 1


def test_a_consumers_leases_are_looked_for_a_window_at_a_time(redis_client, make_pq):
    q = make_pq("recover")
    fill(q, 2000)
    q.pop(100, consumer="leaving")
    for _ in range(19):
        q.pop(100, consumer="staying")
    seen = counted(redis_client, lambda: q.reclaim(consumer="leaving", limit=100))
    assert seen["zrange"] == 2000 // 100 + 1  # one window of 100 a call, every lease looked at
    assert q.stats()["leased"] == 1900 and q.size() == 100


def test_replay_drops_a_pointer_only_near_the_front(redis_client, make_pq):
    q = make_pq("replay")
    fill(q.dead, N)
    seen = counted(redis_client, lambda: q.replay([f"e{i}" for i in range(N - 100, N)] + ["e0"]))
    assert seen["lpos"] == 101 and seen["lrem"] == 1  # e0's; the others are left stale
    assert q.size() == 101 and q.dead.size() == N - 101
    assert [e.id for e in q.dead.peek(2)] == ["e1", "e2"]


def test_an_id_sent_many_times_costs_each_ack_and_remove_step_a_bounded_amount(redis_client, make_pq):
    # Given one task id sent 2,000 times (each a message of its own, under a duplicate id)
    q = make_pq("same")
    sends = 2000
    ids = q.insert_many([Item(b"x", 1, "same")] * sends, chunk=100)
    assert len(set(ids)) == sends and redis_client.zcard(q.keys.duplicate_index) == sends - 1
    # When one is popped and acked: its duplicate id is forgotten with one ZREM, nothing rewritten
    first, lease = q.pop(2)  # the id itself, then its first duplicate
    assert lease.id.startswith("same~")
    seen = counted(redis_client, lambda: q.ack(lease))
    assert seen["zrem"] == 2 and seen["hset"] == 0 and seen["hget"] == 1  # (lz and dq; the entry's lease)
    # And a remove by the id goes in steps of STEP_CHUNK duplicates, each entry once
    seen = counted(redis_client, lambda: q.remove("same"))
    dups = sends - 2  # (one acked)
    assert seen["fcall"] + seen["evalsha"] == dups // C.STEP_CHUNK + 1  # the last call finds less than a step
    assert seen["zrangebylex"] == seen["fcall"] + seen["evalsha"]
    assert q.size() == 0 and redis_client.zcard(q.keys.duplicate_index) == 0
    assert q.ack(first)


def test_a_sweep_during_a_migration_is_skipped_not_waited_for(make_pq):
    q = make_pq("sweep")
    fill(q, 1000)
    fair = make_pq("sweep", fair=True)
    fair._scripts.run("migrate", step=10)
    start = time.monotonic()
    assert fair.reclaim()["skipped"] is True  # the keeper's thread renews leases too: it goes on
    assert time.monotonic() - start < 1
    fair.migrate_mode()
    assert fair.reclaim()["skipped"] is False


def test_views_peeks_and_purges_read_a_rank_whose_pass_is_under_way(redis_client, make_pq):
    q = make_pq("views", technique="S")
    fill(q, 3000, priority=7)
    fill(q, 10, priority=2, prefix="low")
    for i in range(3000):
        if i % 3:
            q.remove(f"e{i}")
    rank = q.rank(7)
    q._scripts.run("cleanup", rank=rank, count=C.COMPACT_STEP)  # a pass: 171 in front, the rest behind
    assert redis_client.zscore(q.keys.priority_index, rank) == rank + 0.5
    assert [e.id for e in q.peek(3)] == ["e0", "e3", "e6"]
    assert q.stats()["waiting"] == 1010
    assert q.retrieve_by_priority(7) == "e0"
    got = q.pop(200, view=(rank - 1, rank + 1))  # (a rank range) the front list runs out part way: on with the list
    assert [lease.id for lease in got] == [f"e{i}" for i in range(0, 600, 3)]
    assert redis_client.zscore(q.keys.priority_index, rank) == rank  # the front list ran empty: no pass
    assert q.purge() == 800 + 10
    assert q.size() == 0 and redis_client.zcard(q.keys.priority_index) == 0


def test_a_duplicate_removed_by_its_own_id_is_forgotten(redis_client, make_pq):
    q = make_pq("forget")
    _, dup = q.insert_many([Item(b"x", 1, "a"), Item(b"x", 1, "a")])
    assert q.remove(dup) == 1  # by the duplicate's own id "a~<seq>"
    assert redis_client.zcard(q.keys.duplicate_index) == 0
    q.insert(b"mine", 1, id=dup)  # an entry of its own that has that id now
    assert q.remove("a") == 1 and q.exists(dup)  # the task id's duplicates do not name it
