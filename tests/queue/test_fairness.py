"""Fair delivery by tenant, caps, delayed entries and priority views, on a real redis-server."""

import random
import threading
import time
from collections import Counter

import pytest

from celery_pq import Item, QueueFull
from celery_pq.queue import QueueSettings, open_queue
from tests.support.tenants import held_tenants, tenant_counts


def fq(make_pq, **kw):
    kw.setdefault("fair", True)
    return make_pq(kw.pop("name", "fair"), **kw)


def drain(q, n=None, ack=True):
    """Pop one at a time (prefetch 1) and ack; the tenants in delivery order."""
    order = []
    while n is None or len(order) < n:
        got = q.pop(1)
        if not got:
            break
        order.append(got[0].tenant)
        if ack:
            q.ack(got[0])
    return order


def fill(q, tenant, n, priority=5):
    q.insert_many([Item(b"x", priority, None, tenant=tenant) for _ in range(n)])


def fairness_state_is_empty(client, q):
    """No tenant state left, and no pointer left in the priority index: a fair pop drops the
    stale pointers at the front of the lists it served from."""
    k = q.keys
    return (
        client.exists(
            k.tenant_entries,
            k.tenant_schedule,
            k.tenant_states,
            k.tenant_counts,
            k.rate_parked,
            k.priority_index,
            *k.levels(),
        )
        == 0
    )


def test_equal_weights_round_robin(redis_client, make_pq):
    q = fq(make_pq)
    fill(q, "A", 5)
    fill(q, "B", 2)
    fill(q, "C", 2)
    assert drain(q) == ["A", "B", "C", "A", "B", "C", "A", "A", "A"]
    assert fairness_state_is_empty(redis_client, q)


def test_a_large_backlog_delays_others_by_at_most_one_round(make_pq):
    # Acceptance 1 at the queue level: A queues 2,000, then B and C 20 each
    q = fq(make_pq)
    fill(q, "A", 2000)
    fill(q, "B", 20)
    fill(q, "C", 20)
    order = drain(q, 100)
    last_b = max(i for i, t in enumerate(order) if t == "B")
    last_c = max(i for i, t in enumerate(order) if t == "C")
    assert last_b < 66 and last_c < 66, (last_b, last_c)


def test_weights_three_to_one(make_pq):
    q = fq(make_pq)
    q.configure_tenants(weights={"A": 3})
    fill(q, "A", 4000)
    fill(q, "B", 4000)
    share = Counter(drain(q, 4000))["A"] / 4000
    assert abs(share - 0.75) <= 0.02, share


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def test_weights_three_two_one_shares_and_jain_index(make_pq):
    q = fq(make_pq)
    weights = {"A": 3, "B": 2, "C": 1}
    q.configure_tenants(weights=weights)
    for t in weights:
        fill(q, t, 6000)
    order = drain(q, 6000)
    c = Counter(order)
    for t, w in weights.items():
        assert abs(c[t] / 6000 - w / 6) <= 0.02, (t, c[t])
    for start in range(0, 6000, 500):
        window = Counter(order[start : start + 500])
        assert jain([window[t] / w for t, w in weights.items()]) >= 0.99


def test_idle_tenant_gets_no_saved_up_credit(make_pq):
    # Acceptance 5: C is idle while A and B run 1,000 tasks, then queues 50
    q = fq(make_pq)
    fill(q, "C", 1)
    drain(q, 1)
    fill(q, "A", 1500)
    fill(q, "B", 1500)
    drain(q, 1000)
    fill(q, "C", 50)
    order = drain(q, 30)
    assert Counter(order)["C"] == 10  # in turn (A, B, C, ...), not 50 in a row
    assert max(len(run) for run in "".join(order).split("A")) <= 2


def test_within_priority_and_tenant_first_order_differently(make_pq):
    def run(scope):
        q = fq(make_pq, name=f"scope-{scope}", fair_scope=scope)
        fill(q, "A", 3, priority=200)
        fill(q, "B", 3, priority=5)
        return drain(q)

    # strict priority first: A's urgent work all goes before B's
    assert run("within_priority") == ["A", "A", "A", "B", "B", "B"]
    # tenants share the queue: B gets its turns although its work is less urgent
    assert run("tenant_first") == ["A", "B", "A", "B", "A", "B"]


def test_each_tenants_entries_by_priority_then_fifo(make_pq):
    q = fq(make_pq, fair_scope="tenant_first")
    for i, p in enumerate([1, 9, 1, 9]):
        q.insert(f"a{i}".encode(), p, tenant="A")
    got = [q.pop()[0] for _ in range(4)]
    assert [x.payload for x in got] == [b"a1", b"a3", b"a0", b"a2"]


def test_requeue_keeps_place_in_tenant_order_and_leases_work(make_pq):
    q = fq(make_pq)
    for i in range(3):
        q.insert(f"a{i}".encode(), 5, id=f"a{i}", tenant="A")
    [first] = q.pop()
    assert first.id == "a0" and first.tenant == "A"
    assert q.requeue(first) == "waiting"
    assert [x.id for x in [q.pop()[0] for _ in range(3)]] == ["a0", "a1", "a2"]


def test_expired_lease_returns_to_tenant_order(redis_client, make_pq):
    q = fq(make_pq)
    fill(q, "A", 1)
    fill(q, "B", 1)
    [lease] = q.pop(lease_seconds=0.05)
    time.sleep(0.1)
    assert q.reclaim()["returned"] == 1
    tenants = drain(q)
    assert sorted(tenants) == ["A", "B"]
    assert fairness_state_is_empty(redis_client, q)


def test_remove_and_change_priority_with_fairness(redis_client, make_pq):
    q = fq(make_pq)
    q.insert(b"x", 5, id="a1", tenant="A")
    q.insert(b"x", 5, id="a2", tenant="A")
    q.insert(b"x", 5, id="b1", tenant="B")
    assert q.remove("a1") == 1
    q.change_priority("b1", 250)
    got = [q.pop()[0] for _ in range(2)]
    assert [g.id for g in got] == ["b1", "a2"]
    assert q.pop() == []
    q.ack(got)
    assert fairness_state_is_empty(redis_client, q)
    assert tenant_counts(q) == {}


def test_dead_lettering_releases_the_tenant(make_pq):
    q = fq(make_pq, tenant_concurrency=1, max_deliveries=1)
    fill(q, "A", 2)
    [lease] = q.pop()
    assert q.pop() == []  # A is at its cap
    assert q.requeue(lease) == "dead"
    assert len(q.pop()) == 1  # the cap is free again


def test_tenant_concurrency_cap_parks_without_blocking_others(make_pq):
    # Acceptance 11 at the queue level: several consumers, one noisy tenant
    q = fq(make_pq, tenant_concurrency=2)
    fill(q, "A", 50)
    fill(q, "B", 50)
    held = []
    most_a = 0
    rng = random.Random(3)
    delivered = Counter()
    for _ in range(400):
        if held and rng.random() < 0.5:
            q.ack(held.pop(rng.randrange(len(held))))
        else:
            got = q.pop(1)
            held += got
            delivered.update(x.tenant for x in got)
        most_a = max(most_a, sum(1 for x in held if x.tenant == "A"))
        assert tenant_counts(q).get("A", {}).get("leased", 0) == sum(1 for x in held if x.tenant == "A")
    assert most_a == 2
    assert delivered["B"] > 0 and delivered["A"] > 0


def test_per_tenant_caps_override_the_default(make_pq):
    q = fq(make_pq, tenant_concurrency=1)
    q.configure_tenants(concurrency={"big": 3})
    fill(q, "big", 5)
    fill(q, "small", 5)
    got = q.pop(10)
    assert Counter(x.tenant for x in got) == {"big": 3, "small": 1}


def test_tenant_rate_limit(make_pq):
    q = fq(make_pq, tenant_rate=5)
    fill(q, "A", 50)
    fill(q, "B", 3)
    start = time.monotonic()
    got = Counter()
    while time.monotonic() - start < 1.0:
        for x in q.pop(10):
            got[x.tenant] += 1
            q.ack(x)
        time.sleep(0.02)
    assert got["B"] == 3  # others keep flowing
    assert 5 <= got["A"] <= 11, got  # a burst of 5, then 5 per second


def test_max_length_per_tenant(make_pq):
    q = fq(make_pq, max_length_per_tenant=3)
    fill(q, "A", 3)
    with pytest.raises(QueueFull) as err:
        q.insert(b"x", 1, tenant="A")
    assert err.value.tenant == "A" and err.value.size == 3
    q.insert(b"x", 1, tenant="B")  # other tenants are not affected
    with pytest.raises(QueueFull):
        q.insert_many([Item(b"x", 1, None, tenant="B")] * 3)
    assert tenant_counts(q)["B"]["waiting"] == 1  # nothing of the refused chunk was written


def test_max_length_is_exact_under_concurrent_publishers(redis_server, key_prefix):
    # Acceptance 8: max_length=100, 8 concurrent publishers
    accepted, refused = [], []

    def publish(n):
        client = redis_server.client()
        q = open_queue(client, "bounded", QueueSettings(key_prefix=key_prefix, max_length=100))
        for _ in range(40):
            try:
                q.insert(b"x", 1)
                accepted.append(n)
            except QueueFull:
                refused.append(n)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == 100 and len(refused) == 220


def test_thousands_of_tenants(redis_client, make_pq):
    q = fq(make_pq)
    q.insert_many([Item(b"x", 5, None, tenant=f"t{i % 3000}") for i in range(6000)])
    first_round = drain(q, 3000)
    assert len(set(first_round)) == 3000  # every tenant once before anyone twice
    assert len(drain(q)) == 3000
    assert fairness_state_is_empty(redis_client, q)


def test_delayed_entries_wait_then_join_at_their_priority(make_pq):
    for fair in (False, True):
        q = make_pq(f"later-{fair}", fair=fair)
        q.insert(b"later", 200, id="later", delay=0.3, tenant="A" if fair else None)
        q.insert(b"now", 1, id="now", tenant="A" if fair else None)
        assert q.stats()["delayed"] == 1 and q.size() == 1
        assert [x.id for x in q.pop(5)] == ["now"]
        assert q.reclaim()["promoted"] == 0
        time.sleep(0.35)
        q.insert(b"low", 0, id="low", tenant="B" if fair else None)
        assert q.reclaim()["promoted"] == 1
        assert [x.id for x in q.pop(1)] == ["later"]  # at its own priority, ahead of "low"


def test_delayed_entries_can_be_removed_and_reprioritised(make_pq):
    q = make_pq("later")
    q.insert(b"x", 1, id="t1", delay=0.2)
    q.insert(b"x", 1, id="t2", delay=0.2)
    assert q.remove("t1") == 1
    q.change_priority("t2", 250)
    assert q.stats()["delayed"] == 1
    time.sleep(0.25)
    q.reclaim()
    [lease] = q.pop()
    assert lease.id == "t2" and lease.priority == 250


def test_priority_view_pops_only_its_range_and_is_woken_only_by_it(redis_client, make_pq):
    q = make_pq("views")
    lo, hi = 0, q.rank(200)  # priorities 200..255
    wake_key = q.register_view(lo, hi)
    publisher = make_pq("views")  # knows no views yet
    publisher.insert_many([Item(b"low", 5)] * 100)
    assert redis_client.llen(wake_key) == 0  # low-priority inserts do not wake the view
    assert q.pop(5, view=(lo, hi)) == []
    publisher.insert(b"urgent", 220)
    assert redis_client.llen(wake_key) == 1
    [got] = q.pop(5, view=(lo, hi))
    assert got.priority == 220
    assert redis_client.llen(wake_key) == 0  # nothing left in range: no token left behind
    assert q.size() == 100


def test_priority_view_on_a_fair_queue(make_pq):
    q = fq(make_pq, name="fair-views")
    view = (0, q.rank(200))
    q.register_view(*view)
    fill(q, "A", 10, priority=5)
    fill(q, "A", 2, priority=210)
    fill(q, "B", 2, priority=230)
    got = q.pop(10, view=view)
    assert sorted(x.priority for x in got) == [210, 210, 230, 230]
    assert q.pop(10, view=view) == []
    assert len(q.pop(20)) == 10


def test_per_tenant_stats_count_and_age(make_pq):
    q = fq(make_pq)
    fill(q, "A", 3)
    time.sleep(0.05)
    fill(q, "B,|odd", 1)
    q.pop(1)
    stats = q.stats()["per_tenant"]
    assert stats["A"]["waiting"] == 2 and stats["A"]["leased"] == 1
    assert stats["B,|odd"]["waiting"] == 1
    assert stats["A"]["next_age_seconds"] >= stats["B,|odd"]["next_age_seconds"] >= 0
    assert q.stats()["per_tenant"]["A"]["waiting"] == 2


def test_returned_work_wakes_the_views_it_belongs_to(redis_client, make_pq):
    q = make_pq("views-back")
    urgent = (0, q.rank(200))
    wake = q.register_view(*urgent)
    q.insert(b"x", 220, id="u1")
    q.insert(b"x", 220, id="u2")
    [a, b] = q.pop(2, view=urgent, lease_seconds=0.05)
    assert redis_client.llen(wake) == 0  # nothing left in range: the view's list was emptied
    q.requeue(a)
    assert redis_client.llen(wake) == 1  # requeued urgent work wakes the urgent view
    redis_client.delete(wake)
    time.sleep(0.1)
    assert q.reclaim()["returned"] == 1  # b's lease ran out
    assert redis_client.llen(wake) == 1  # swept back: the urgent view is woken too


def _stale_member(client, q, tenant, priority, seq, entry_id):
    """A tenant-order member for ``entry_id`` that is not current, counted as a waiting entry
    (what fair_add writes): what a script stopped half way could leave behind."""
    from celery_pq.queue import escape_tenant
    from celery_pq.storage import records as R
    from celery_pq.storage.ids import encode_id

    k, rank, t = q.keys, q.rank(priority), escape_tenant(tenant)
    client.zadd(k.tenant_entries, {R.join_tenant_member(t.encode(), rank, seq, encode_id(entry_id)): 0})
    client.hincrby(k.tenant_counts, f"n:{t}", 1)
    client.hincrby(k.virtual_times, f"L:{rank}", 1)


def test_the_fair_pop_makes_the_plain_pops_lease_and_score_checks(redis_client, make_pq):
    # Given a fair queue where tenant A's entry "a1" is leased and "a2" waits at priority 5, and
    # members that are not current: one for the leased "a1", one for "a2" at priority 9 (a score
    # a2 does not have), both served before a2's own member
    q = fq(make_pq, name="stale-members")
    q.insert(b"one", 5, id="a1", tenant="A")
    [first] = q.pop(1, consumer="c:1:first")
    assert first.id == "a1"
    q.insert(b"two", 5, id="a2", tenant="A")
    _stale_member(redis_client, q, "A", 9, 1, "a1")
    _stale_member(redis_client, q, "A", 9, 2, "a2")
    # When the fair pop takes all it can
    got = q.pop(5, consumer="c:2:second")
    # Then a1 is not leased a second time, a2 comes once with its own priority, and a1's lease
    # is still the first consumer's
    assert [(lease.id, lease.priority) for lease in got] == [("a2", 5)]
    assert q.leases(id="a1")[0]["consumer"] == "c:1:first"
    assert q.ack(first) and q.ack(got[0])
    assert q.pop(5) == [] and fairness_state_is_empty(redis_client, q)


def redis_ms(client):
    s, us = client.time()
    return s * 1000 + us // 1000


def step_the_clock_back(client, q, ms):
    """What Redis's clock stepping back by ``ms`` (a failover to a replica whose clock is behind,
    an NTP step) leaves in a fair queue: every time it stored (a bucket's last refill, a parked
    tenant's due time, the latest rate park) lies ``ms`` ahead of now."""
    k = q.keys
    for t, record in client.hgetall(k.token_buckets).items():
        tokens, last = record.split(b",")
        client.hset(k.token_buckets, t, tokens + b"," + str(int(last) + ms).encode())
    for t, due in client.zrange(k.rate_parked, 0, -1, withscores=True):
        client.zadd(k.rate_parked, {t: due + ms})
    parked = client.hget(k.virtual_times, "T")
    if parked is not None:
        client.hset(k.virtual_times, "T", int(parked) + ms)


def test_a_step_back_of_redis_s_clock_costs_a_rate_parked_tenant_one_period_at_most(redis_client, make_pq):
    # Given tenant A at 5/s, its burst taken and parked for its next token
    q = fq(make_pq, tenant_rate=5)
    fill(q, "A", 20)
    assert len(q.pop(20)) == 5 and held_tenants(q) == {"A": "rate"}
    # When Redis's clock steps back an hour
    step_the_clock_back(redis_client, q, 3_600_000)
    # Then the next pop parks A again for one period (200 ms) at most, not for the hour
    q.pop(20)
    due = redis_client.zscore(q.keys.rate_parked, "A")
    assert due is None or due <= redis_ms(redis_client) + 200, due
    # and A is delivered again within a moment
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not q.pop(1):
        time.sleep(0.01)
    assert q.size() == 14


def test_a_bucket_refilled_after_now_waits_one_period_at_most(redis_client, make_pq):
    # Given tenant A at 5/s, whose bucket holds half a token and was last refilled an hour
    # ahead of Redis's clock (the clock stepped back since)
    q = fq(make_pq, tenant_rate=5)
    fill(q, "A", 3)
    redis_client.hset(q.keys.token_buckets, "A", f"0.5,{redis_ms(redis_client) + 3_600_000}")
    # When a pop meets A
    assert q.pop(1) == []
    # Then A waits for the half token it lacks (100 ms), not the hour
    due = redis_client.zscore(q.keys.rate_parked, "A")
    assert due is not None and due <= redis_ms(redis_client) + 100, due
    assert redis_client.hget(q.keys.token_buckets, "A").startswith(b"0.5,")


def test_fair_purge_counts_a_requeued_entry_once(make_pq):
    q = make_pq("mm", fair=True)
    q.insert_many([Item(b"x", 5, "b1", tenant="B"), Item(b"x", 5, "b2", tenant="B"), Item(b"x", 5, "a1", tenant="A")])
    leases = q.pop(3)
    q.requeue(leases[-1])
    for lease in leases[:-1]:
        q.requeue(lease)
    assert q.purge() == 3
