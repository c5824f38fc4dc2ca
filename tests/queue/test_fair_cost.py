"""fair_cost: what a delivery costs its tenant (tasks, time held, declared cost), on a real
redis-server (docs/fairness.md, "Counting by tasks, by time or by declared cost")."""

import time
from collections import Counter

import pytest

from celery_pq import Item, ModeMismatch
from celery_pq.storage.keys import queue_keys
from tests.queue.test_fairness import fill, fq


def held_back(client, q, ms):
    """Make the one lease charge record of ``q`` as if delivered ``ms`` earlier (a task that ran
    that long, without waiting for it)."""
    lc = q.keys.lease_charges
    for eid, rec in client.hgetall(lc).items():
        at, charged = rec.decode().split(",")
        client.hset(lc, eid, f"{int(at) - ms},{charged}")


def run(client, q, took, n):
    """Pop, hold and ack ``n`` times (one at a time); ``took``: tenant -> ms its tasks take.
    {tenant: deliveries}, {tenant: ms charged}."""
    got, held = Counter(), Counter()
    for _ in range(n):
        lease = q.pop(1)[0]
        got[lease.tenant] += 1
        held[lease.tenant] += took[lease.tenant]
        held_back(client, q, took[lease.tenant])
        q.ack(lease)
    return got, held


def test_time_is_charged_at_ack_so_worker_time_is_shared(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time")
    fill(q, "A", 300)
    fill(q, "B", 300)
    got, held = run(redis_client, q, {"A": 200, "B": 20}, 300)
    share = held["A"] / (held["A"] + held["B"])
    assert 0.45 <= share <= 0.55, (got, held)
    assert got["B"] > 8 * got["A"]
    th = {k.decode(): int(v) for k, v in redis_client.hgetall(q.keys.tenant_held).items() if b"|" not in k}
    assert th["A"] >= held["A"] and th["B"] >= held["B"]  # (the Redis clock ran on a little too)
    assert redis_client.hlen(q.keys.lease_charges) == 0


def test_by_tasks_the_same_work_is_counted_in_deliveries(redis_client, make_pq):
    q = fq(make_pq)
    fill(q, "A", 100)
    fill(q, "B", 100)
    got = Counter(lease.tenant for lease in (q.pop(1)[0] for _ in range(100)))
    assert got == {"A": 50, "B": 50}
    assert not redis_client.exists(q.keys.lease_charges, q.keys.tenant_held)  # nothing more written


def test_weights_share_the_time(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time", weights={"A": 3})
    q.configure_tenants(weights={"A": 3})
    fill(q, "A", 400)
    fill(q, "B", 400)
    _, held = run(redis_client, q, {"A": 200, "B": 20}, 400)
    share = held["A"] / (held["A"] + held["B"])
    assert 0.70 <= share <= 0.80, held


def test_an_expired_lease_is_charged_its_length(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time")
    fill(q, "A", 1)
    lease = q.pop(1, lease_seconds=0.2)[0]
    time.sleep(0.5)  # the sweep comes later than the deadline: only the length counts
    assert q.reclaim()["returned"] == 1
    th = int(redis_client.hget(q.keys.tenant_held, "A"))
    assert 200 <= th < 300, th
    assert redis_client.hlen(q.keys.lease_charges) == 0
    assert q.ack(lease) is False  # a late ack charges nothing more
    assert int(redis_client.hget(q.keys.tenant_held, "A")) == th


def test_renewal_does_not_charge_and_a_reject_charges_the_time_held(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time")
    fill(q, "A", 2)
    lease = q.pop(1)[0]
    q.extend([lease], 30)
    assert not redis_client.exists(q.keys.tenant_held)
    held_back(redis_client, q, 150)
    assert q.requeue(lease) == "waiting"
    assert 150 <= int(redis_client.hget(q.keys.tenant_held, "A")) < 250


def test_a_delivery_undone_costs_nothing(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time")
    fill(q, "A", 1)
    before = redis_client.hget(q.keys.virtual_times, f"F:{q.rank(5)}:A")
    lease = q.pop(1)[0]
    charged = int(redis_client.hget(q.keys.virtual_times, f"F:{q.rank(5)}:A"))
    assert charged > int(before or 0)
    held_back(redis_client, q, 500)
    assert q.requeue(lease, count_delivery=False) == "waiting"
    assert not redis_client.exists(q.keys.tenant_held)
    # the provisional charge is taken back; the level is busy (A waits), so V stays
    assert int(redis_client.hget(q.keys.virtual_times, f"F:{q.rank(5)}:A")) == int(before or 0)


def test_after_a_busy_period_every_finish_tag_is_at_most_v(redis_client, make_pq):
    """A charge that comes once the level ran empty moves V with it (fair_gc's invariant)."""
    q = fq(make_pq, fair_cost="time")
    fill(q, "A", 1)
    fill(q, "B", 1)
    leases = q.pop(2)
    for lease, ms in zip(leases, (900, 10)):
        held_back_one(redis_client, q, lease, ms)
        q.ack(lease)
    fv = {k.decode(): int(v) for k, v in redis_client.hgetall(q.keys.virtual_times).items() if k.startswith(b"F:")}
    v = int(redis_client.hget(q.keys.virtual_times, f"V:{q.rank(5)}"))
    assert fv and all(tag <= v for tag in fv.values()), (fv, v)


def held_back_one(client, q, lease, ms):
    from celery_pq.storage.ids import encode_id

    lc = q.keys.lease_charges
    eid = encode_id(lease.id)
    at, charged = client.hget(lc, eid).decode().split(",")
    client.hset(lc, eid, f"{int(at) - ms},{charged}")


def test_declared_cost_is_charged_at_delivery(redis_client, make_pq):
    q = fq(make_pq, fair_cost="declared")
    q.insert_many([Item(b"x", 5, None, tenant="A", cost=10) for _ in range(30)])
    q.insert_many([Item(b"x", 5, None, tenant="B") for _ in range(100)])  # none: 1
    got = Counter(lease.tenant for lease in (q.pop(1)[0] for _ in range(66)))
    assert got == {"A": 6, "B": 60}, got
    assert not redis_client.exists(q.keys.lease_charges)


def test_a_declared_cost_is_checked():
    with pytest.raises(ValueError, match="cost"):
        Item(b"x", cost=0)
    with pytest.raises(ValueError, match="cost"):
        Item(b"x", cost="3")


def test_the_queue_keeps_its_fair_cost(redis_client, make_pq):
    """As fair_scope: the first declaration records it; another process follows it, or gets ModeMismatch."""
    q = fq(make_pq, fair_cost="time", declare=True)
    assert q.mode["fair_cost"] == "time"
    other = fq(make_pq)  # fair_cost "tasks" in its options: the queue's stands
    assert other.settings.fair_cost == "time"
    from celery_pq.queue import PriorityQueue, QueueSettings

    stray = PriorityQueue(redis_client, "fair", QueueSettings(fair=True, key_prefix=q.settings.key_prefix))
    with pytest.raises(ModeMismatch, match="fair_cost='time'"):
        stray.insert(b"x", tenant="A")
    assert queue_keys("fair", q.settings.key_prefix).mode == q.keys.mode


def test_a_missing_or_invalid_declared_cost_counts_1_and_is_logged(caplog):
    from celery_pq.transport.tenants import cost_of

    assert cost_of({"headers": {"x-pq-cost": 250}}, "q") == 250.0
    assert cost_of({"headers": {"x-pq-cost": "2.5"}}, "q") == 2.5
    assert cost_of({"headers": {}}, "q") is None
    for bad in ("many", -1, 0, float("nan"), True, 1e9):
        assert cost_of({"headers": {"x-pq-cost": bad}}, "q") is None
    assert "x-pq-cost='many' is not a number" in caplog.text


def test_the_ack_event_carries_the_time_held(redis_client, make_pq):
    q = fq(make_pq, fair_cost="time", event_log=1000)
    fill(q, "A", 1)
    lease = q.pop(1)[0]
    held_back(redis_client, q, 120)
    q.ack(lease)
    ack = next(e for e in q.events() if e["e"] == "ack")
    assert 120 <= ack["h"] < 220
    assert "h" not in next(e for e in q.events() if e["e"] == "deliver")


def test_a_task_without_tenant_is_charged_its_own_average(redis_client, make_pq):
    """The tasks without a tenant (tenant "") have a running average of their own, as any
    tenant: not the queue's (fv "A:" was both, so their provisional charge was every tenant's)."""
    q = fq(make_pq, fair_cost="time")
    fill(q, "B", 1)
    lease = q.pop(1)[0]
    held_back(redis_client, q, 1000)
    q.ack(lease)
    fill(q, None, 2)
    lease = q.pop(1)[0]
    assert lease.tenant in ("", None)
    held_back(redis_client, q, 10)
    q.ack(lease)
    held = int(redis_client.hget(q.keys.tenant_held, ""))
    q.pop(1)
    [rec] = redis_client.hvals(q.keys.lease_charges)
    assert int(rec.decode().split(",")[1]) == held * 100  # its own first time held, at weight 1
