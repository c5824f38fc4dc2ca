"""The sharded queue (``ShardedQueue``) on a real redis-server, N in {1, 4}: nothing lost or
doubled, leases and acks per shard, priority order relaxed but bounded, stats summed."""

import random
import time

import pytest

from celery_pq import ConfigError, Item, PriorityQueue
from celery_pq import queue as queues
from celery_pq.queue.sharded import ShardedQueue
from celery_pq.storage.errors import EntryNotFound
from celery_pq.storage.keys import shard_names
from celery_pq.transport.options import Options
from tests.support.tenants import tenant_deliveries


def open_queue(client, prefix, n, *, peek=2, seed=1, name="orders", **options):
    q = queues.open_queue(client, name, Options(key_prefix=prefix, shards=n, peek=peek, **options).queue_settings(name))
    if n > 1:
        q._rng = random.Random(seed)
    return q


def drain(q, *, count=1):
    """Pop and ack until empty; the leases in delivery order."""
    out = []
    while True:
        got = q.pop(count)
        if not got:
            return out
        out += got
        assert all(q.ack(got))


def test_one_shard_is_todays_queue_and_reads_its_data(redis_client, make_pq, key_prefix):
    # Given entries written by a plain queue before shards existed
    plain = make_pq("orders")
    plain.insert(b"a", 5, id="a")
    plain.insert(b"b", 9, id="b")
    # When the options say shards=1
    q = open_queue(redis_client, key_prefix, 1)
    # Then it is that very queue, same keys, same data
    assert type(q) is PriorityQueue and q.keys == plain.keys
    assert [e.id for e in drain(q)] == ["b", "a"]


def test_shard_zero_keeps_todays_data_when_the_queue_grows(redis_client, make_pq, key_prefix):
    make_pq("orders").insert(b"old", 7, id="old")
    q = open_queue(redis_client, key_prefix, 4)
    assert q.shards[0].keys.entries == f"{key_prefix}:{{orders}}:ii"
    assert q.size() == 1 and [e.id for e in drain(q)] == ["old"]


@pytest.mark.parametrize("n", [1, 4])
def test_nothing_lost_or_doubled_with_interleaved_consumers(redis_client, key_prefix, n):
    q = open_queue(redis_client, key_prefix, n)
    rng = random.Random(n)
    ids = {q.insert(b"x", rng.randrange(256), id=f"t{i}") for i in range(300)}
    # three consumers, each taking batches and acking some late
    held, seen = [], []
    while True:
        got = q.pop(rng.choice([1, 3, 5]), consumer=f"c{rng.randrange(3)}")
        if not got and not held:
            break
        seen += [lease.id for lease in got]
        held += got
        rng.shuffle(held)
        done, held = held[: len(held) // 2 + 1], held[len(held) // 2 + 1 :]
        assert all(q.ack(done))
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    s = q.stats()
    assert (s["waiting"], s["leased"], s["delayed"]) == (0, 0, 0)
    assert q.counters()["acked"] == 300 == q.counters()["delivered"]
    # every counter is named, as a plain queue names them, with 0 where nothing happened
    assert set(q.counters()) == set(q.shards[0].counters()) and q.counters()["dead_lettered"] == 0


@pytest.mark.parametrize("n", [1, 4])
def test_one_consumer_peeking_every_shard_gets_exact_priority_order(redis_client, key_prefix, n):
    q = open_queue(redis_client, key_prefix, n, peek=n)
    rng = random.Random(7)
    for i in range(200):
        q.insert(b"x", rng.randrange(256))
    got = [lease.priority for lease in drain(q)]
    assert len(got) == 200 and got == sorted(got, reverse=True)


def test_peeking_fewer_shards_relaxes_the_order_within_a_bound(redis_client, key_prefix):
    # k=1 of 4 shards: each delivery is the best of one shard, so at most 3 shards' heads
    # (and everything waiting behind them at better ranks) outrank it; nothing is skipped forever
    q = open_queue(redis_client, key_prefix, 4, peek=1, seed=3)
    rng = random.Random(5)
    for i in range(200):
        q.insert(b"x", rng.randrange(256))
    got = [lease.priority for lease in drain(q)]
    assert sorted(got, reverse=True) != got  # relaxed (a plain queue would be exact)
    assert len(got) == 200
    per_shard = {s.name: [] for s in q.shards}
    # each shard on its own still gives its entries in exact order
    q2 = open_queue(redis_client, key_prefix, 4, peek=1, seed=3, name="other")
    for i in range(100):
        q2.insert(b"x", rng.randrange(256))
    for lease in drain(q2):
        per_shard.setdefault(lease.queue, []).append(lease.priority)
    for name, ps in per_shard.items():
        assert ps == sorted(ps, reverse=True), name


def test_a_consumer_finds_work_in_a_shard_it_did_not_peek(redis_client, key_prefix):
    # k=1 of 4: the peeked shard is empty (3 times in 4), the wider peek finds the one entry
    q = open_queue(redis_client, key_prefix, 4, peek=1)
    for seed in range(12):
        q._rng = random.Random(seed)
        q.shards[seed % 4].insert(b"x", 3, id=f"only{seed}")
        [lease] = q.pop()
        assert lease.id == f"only{seed}" and lease.queue == q.shards[seed % 4].name
        assert q.ack(lease)


def test_second_best_is_taken_when_the_best_peeked_shard_was_emptied_meanwhile(redis_client, make_pq, key_prefix):
    # Given the best entry sits alone in shard a, the second-best in shard b
    q = open_queue(redis_client, key_prefix, 4, peek=4)
    a, b = q.shards[0], q.shards[1]
    a.insert(b"best", 250, id="best")
    b.insert(b"next", 10, id="next")
    other = make_pq(a.name)  # another consumer of shard a
    peek = q.peek_heads

    def raced(shards, view=None):
        heads = peek(shards, view)
        assert [lease.id for lease in other.pop()] == ["best"]  # it wins the race after our peek
        return heads

    q.peek_heads = raced
    # When our consumer pops, Then shard a gives nothing and the second-best peeked serves,
    # with no new peek round
    [lease] = q.pop()
    assert lease.id == "next"


@pytest.mark.parametrize("fair", [False, True])
def test_second_best_is_taken_when_the_best_peeked_shard_was_beaten_meanwhile(redis_client, key_prefix, fair):
    # Given shard a holds the best entry and a poor one, shard b a middling one
    q = open_queue(redis_client, key_prefix, 4, peek=4, **({"fair_key": "tenant"} if fair else {}))
    a, b = q.shards[0], q.shards[1]
    a.insert(b"best", 250, id="best", tenant="t" if fair else None)
    a.insert(b"poor", 1, id="poor", tenant="t" if fair else None)
    b.insert(b"next", 10, id="next", tenant="u" if fair else None)
    other = queues.open_queue(
        redis_client,
        a.name,
        Options(key_prefix=key_prefix, **({"fair_key": "tenant"} if fair else {})).queue_settings(a.name),
    )
    peek = q.peek_heads

    def raced(shards, view=None):
        heads = peek(shards, view)
        assert [lease.id for lease in other.pop()] == ["best"]  # taken after our peek
        return heads

    q.peek_heads = raced
    # When our consumer pops, Then shard a's head now ranks below b's peeked head: a gives
    # nothing (its poor entry stays waiting) and b serves
    [lease] = q.pop()
    assert lease.id == "next"
    assert [e.id for e in a.peek(5)] == ["poor"]


def test_peek_head_skips_stale_pointers_and_says_nothing_for_a_paused_shard(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4, technique="S")
    a = q.shards[0]
    a.insert(b"gone", 250, id="gone")
    a.insert(b"kept", 3, id="kept")
    assert a.remove("gone") == 1  # technique S leaves its pointer behind
    [head] = q.peek_heads([a])
    assert head[0] == a.rank(3) and head[1] == a.peek(1)[0].enqueued_ms
    assert q.peek_heads([a], view=(0, 10)) == [None]  # only a stale pointer there
    a.pause()
    assert q.peek_heads([a]) == [None]


def test_equal_priorities_go_oldest_head_first_across_shards(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4, peek=4)
    for i in range(12):
        q.shards[i % 4].insert(b"x", 7, id=f"t{i}")
        time.sleep(0.002)  # distinct enqueue milliseconds (not a timed assertion)
    assert [lease.id for lease in drain(q)] == [f"t{i}" for i in range(12)]


@pytest.mark.parametrize("n", [1, 4])
def test_leases_acks_and_requeues_go_to_the_shard_of_the_lease(redis_client, key_prefix, n):
    q = open_queue(redis_client, key_prefix, n, max_deliveries=2)
    for i in range(8):
        q.insert(b"x", i, id=f"t{i}")
    leases = q.pop(1) + q.pop(1) + q.pop(1)
    for lease in leases:
        shard = next(s for s in q.shards if s.name == lease.queue)
        assert shard.leases(id=lease.id)[0]["deliveries"] == 1
        assert q.leases(id=lease.id)[0]["consumer"] == shard.leases(id=lease.id)[0]["consumer"]
    assert q.extend(leases, 30) == [True, True, True]
    assert q.ack(leases[0]) and not q.ack(leases[0])  # acked once, in its own shard
    assert q.requeue(leases[1]) == "waiting"
    assert q.dead_letter(leases[2], "rejected") == "dead"
    s = q.stats()
    assert (s["waiting"], s["leased"], s["dead"]) == (6, 0, 1)
    assert [e.id for e in q.dead.peek(5)] == [leases[2].id]
    assert q.replay([leases[2].id])["replayed"]
    assert q.size() == 7


@pytest.mark.parametrize("n", [1, 4])
def test_expired_leases_come_back_to_their_shards(redis_client, key_prefix, n):
    q = open_queue(redis_client, key_prefix, n)  # (a transport's lease is 0.75 s at least: the pops ask for less)
    for i in range(10):
        q.insert(b"x", 100, id=f"t{i}")
    taken = (
        q.pop(10, lease_seconds=0.05)
        if n == 1
        else [lease for _ in range(10) for lease in q.pop(1, lease_seconds=0.05)]
    )
    assert len(taken) == 10 and q.size() == 0
    time.sleep(0.1)  # (not an assertion on time: the leases must have run out for the sweep)
    back = q.reclaim()
    assert back["returned"] == 10 and q.size() == 10
    assert sorted(lease.id for lease in drain(q)) == sorted(f"t{i}" for i in range(10))


def test_delayed_entries_of_every_shard_soonest_due_first(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    for i, delay in enumerate([300, 60, 120, 30, 240, 90]):
        q.insert(b"later", i, id=f"d{delay}", tenant=f"t{i}", delay=delay)  # tenants spread the shards
    q.insert(b"now", 5, id="now")
    assert len({s.name for s in q.shards if s.delayed(10)}) > 1
    found = q.delayed(4)
    assert [e.id for e, _ in found] == ["d30", "d60", "d90", "d120"]
    assert [due for _, due in found] == sorted(due for _, due in found)
    assert {e.payload for e, _ in found} == {b"later"} and found[0][0].priority == 3


def test_stats_counters_and_backlog_sum_the_shards(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    for i in range(40):
        q.insert(b"x", 200 if i % 4 == 0 else 5, id=f"t{i}")
    q.insert(b"later", 1, id="later", delay=60)
    q.pop(1)
    s = q.stats()
    parts = [shard.stats() for shard in q.shards]
    assert s["waiting"] == 39 == sum(p["waiting"] for p in parts)
    assert s["delayed"] == 1 and s["leased"] == 1
    merged = {}
    for p in parts:
        for prio, count in p["per_priority"].items():
            merged[prio] = merged.get(prio, 0) + count
    assert s["per_priority"] == merged and sum(merged.values()) == 39
    assert [row["waiting"] for row in s["shards"]] == [p["waiting"] for p in parts]
    assert sum(1 for p in parts if p["waiting"]) >= 3  # spread over the shards
    assert q.counters()["enqueued"] == 41 and q.backlog() == 39 and q.size() == 39
    assert len(q.peek(100)) == 39 and q.peek(1)[0].priority == 200


def test_a_tenant_stays_on_one_shard_and_keeps_its_order(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4, fair_key="tenant")
    for i in range(30):
        q.insert(b"x", 0, id=f"{'ab'[i % 2]}{i}", tenant="ab"[i % 2])
    got = drain(q)
    for t in "ab":
        mine = [lease for lease in got if lease.tenant == t]
        assert len({lease.queue for lease in mine}) == 1  # one shard per tenant
        assert [int(lease.id[1:]) for lease in mine] == sorted(int(lease.id[1:]) for lease in mine)  # FIFO
    assert tenant_deliveries(q) == {"a": 15, "b": 15}


def test_a_retried_publish_id_is_stored_once(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    first = q.insert(b"x", 1, publish_id=b"pub-1")
    assert q.insert(b"x", 1, publish_id=b"pub-1") == first
    assert q.size() == 1


def test_delayed_entries_and_views_work_per_shard(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4, peek=4)
    for i in range(12):
        q.insert(b"x", 250 if i % 3 == 0 else 10, id=f"t{i}")
    q.insert(b"x", 250, id="due", delay=0.05)  # waits in its shard's delayed set
    q.register_view(0, 5)  # ranks 0..5 = priorities 250..255
    assert q.size() == 12 and q.stats()["delayed"] == 1
    view = [lease.priority for lease in q.pop(1, view=(0, 5)) + q.pop(1, view=(0, 5))]
    assert view == [250, 250]
    time.sleep(0.1)  # (the entry must be due for the sweep to promote it)
    assert q.reclaim()["promoted"] == 1 and q.stats()["delayed"] == 0
    rest = drain(q)
    assert len(rest) == 11 and "due" in {lease.id for lease in rest}


def test_insert_many_spreads_and_returns_ids_in_order(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    ids = q.insert_many([Item(b"x", i % 256, f"m{i}") for i in range(50)])
    assert ids == [f"m{i}" for i in range(50)]
    assert sum(1 for s in q.shards if s.size()) == 4 and q.size() == 50


def test_insert_many_tells_repeats_in_the_order_given(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    items = [Item(b"x", 1, f"m{i}", publish_id=f"p{i}") for i in range(20)]
    q.insert_many(items[::3])
    ids, repeated = q.insert_many(items, repeats=True)
    assert ids == [f"m{i}" for i in range(20)] and repeated == [i % 3 == 0 for i in range(20)]
    assert q.size() == 20


def test_max_length_is_the_queues_limit_split_over_the_shards(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4, max_length=8)
    assert [s.settings.max_length for s in q.shards] == [2, 2, 2, 2]


def test_remove_change_priority_pause_and_purge_reach_every_shard(redis_client, key_prefix):
    q = open_queue(redis_client, key_prefix, 4)
    for i in range(20):
        q.insert(b"x", 5, id=f"t{i}")
    assert q.remove("t3") == 1 and not q.exists("t3")
    q.change_priority("t7", 200)
    assert q.peek(1)[0].id == "t7"
    with pytest.raises(EntryNotFound, match="'orders' has no entry 'nope'"):
        q.change_priority("nope", 1)
    assert q.pause() and q.recorded()["paused"] and q.pop() == []
    assert q.resume() and len(q.pop(1)) == 1
    assert q.purge() == 18 and q.size() == 0


def test_bad_input_is_refused_with_a_clear_error(redis_client, key_prefix):
    for bad in ({"shards": 0}, {"shards": 257}, {"shards": "4"}, {"peek": 0}, {"peek": 65}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Options(**bad)
    q = open_queue(redis_client, key_prefix, 4)
    q.insert(b"x", 1, id="a")
    [lease] = q.pop()
    with pytest.raises(ValueError, match="Lease objects"):
        q.ack((lease.id, lease.token))
    assert q.ack(lease)
    with pytest.raises(ValueError, match="peek must be"):
        ShardedQueue(q.shards, "orders", peek=0)


def test_celerys_own_queues_are_never_sharded(redis_client, key_prefix):
    o = Options(key_prefix=key_prefix, shards=4)
    assert isinstance(queues.open_queue(redis_client, "orders", o.queue_settings("orders")), ShardedQueue)
    for name in ("celery@host.celery.pidbox", "x.reply.celery.pidbox", "celeryev.abc"):
        assert isinstance(queues.open_queue(redis_client, name, o.queue_settings(name)), PriorityQueue)
    orders = queues.open_queue(redis_client, "orders", o.queue_settings("orders"))
    assert [s.name for s in orders.shards] == shard_names("orders", 4)


def test_the_dashboard_shows_a_sharded_queue_as_one(redis_client, key_prefix):
    from celery_pq.ops.dashboard.board import Board

    q = open_queue(redis_client, key_prefix, 4, max_deliveries=1)
    for i in range(12):
        q.insert(b'{"body": "x"}', 9, id=f"t{i}")
    held = q.pop(1) + q.pop(1)
    assert q.dead_letter(held[1], "rejected") == "dead"
    board = Board(lambda: ["orders"], lambda name: q)
    board.sample()
    [state] = board.state()["queues"]
    assert state["stats"]["waiting"] == 10 and state["stats"]["leased"] == 1 and len(state["stats"]["shards"]) == 4
    assert [row["id"] for row in state["leases"]] == [held[0].id]
    assert [row["id"] for row in state["dead_letters"]] == [held[1].id]
    assert board.act("replay", {"queue": "orders", "ids": [held[1].id]})
    assert q.size() == 11


def test_an_entry_inserted_without_an_id_gets_one_no_other_shard_has(redis_client, key_prefix):
    # Given entries inserted without ids into 4 shards (each shard's own counter would give 1, 2, ...)
    q = open_queue(redis_client, key_prefix, 4)
    ids = [q.insert(f"m{i}".encode(), 1) for i in range(20)]
    ids += q.insert_many([Item(b"x", 2), Item(b"y", 3), Item(b"z", 4, "mine")])
    assert len(set(ids)) == 23 and ids[-1] == "mine"
    assert sum(1 for s in q.shards if s.size()) > 1
    # Then an id names one entry of the whole queue
    assert q.remove(ids[0]) == 1 and not q.exists(ids[0])
    assert all(q.exists(i) for i in ids[1:])
    q.change_priority(ids[1], 200)
    assert q.peek(1)[0].id == ids[1]
