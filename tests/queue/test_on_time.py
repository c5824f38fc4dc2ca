"""On time: a delayed entry is deliverable when it is due, not at the next sweep. A pop promotes
the due entries itself (at most POP_PROMOTE a call, lua/includes/delays.lua) in the order the
sweep does, says when the next one is due, and a sooner delayed insert wakes a consumer; at
volume, pops (or a sweep that calls itself again) promote every due entry without waiting for
the sweep interval (docs/views-and-delays.md, "When a delayed task starts")."""

from __future__ import annotations

import time

import pytest

from celery_pq import Item
from celery_pq.queue import open_queue
from celery_pq.storage.constants import FAIR_POP_MAX, POP_PROMOTE, SWEEP_BATCH
from celery_pq.transport.options import Options


def redis_ms(client) -> int:
    s, us = client.time()
    return s * 1000 + us // 1000


def wait_until(client, ms: int) -> None:
    while redis_ms(client) < ms:
        time.sleep(0.005)


def test_a_pop_promotes_due_entries_as_the_sweep_does_and_says_when_the_next_is_due(redis_client, make_pq):
    """Each due entry joins the back of its priority with its score (so after w2, inserted after
    it), the better priority first; before that the pop takes nothing and says how long to wait."""
    orders = {}
    for how in ("pop", "sweep"):
        q = make_pq(f"ot-{how}", priority_order="lower_first")
        due = redis_ms(redis_client) + 300
        q.insert(b"w", 5, id="w1")
        q.insert(Item(b"c", 5, "c", due_ms=due))
        q.insert(Item(b"d", 1, "d", due_ms=due + 1))
        q.insert(b"w", 5, id="w2")
        q.insert(Item(b"later", 0, "later", due_ms=due + 60_000))
        first = q.pop(2)
        assert [x.id for x in first] == ["w1", "w2"]
        assert 100 < first.due_in <= 300
        wait_until(redis_client, due + 1)
        if how == "sweep":
            assert q.reclaim()["promoted"] == 2
        popped = q.pop(10)
        orders[how] = [x.id for x in popped]
        assert 58_000 < popped.due_in <= 60_000
        assert redis_client.zcard(q.keys.delayed) == 1
    assert orders["pop"] == orders["sweep"] == ["d", "c"]


def test_an_empty_queue_pop_reads_no_clock_and_says_nothing_is_delayed(make_pq):
    q = make_pq("ot-empty")
    assert q.pop(1).due_in is None


def test_a_delayed_insert_due_before_every_other_wakes_a_consumer(redis_client, make_pq):
    q = make_pq("ot-wake")
    view = q.register_view(0, 10)
    now = redis_ms(redis_client)
    q.insert(Item(b"a", 100, "a", due_ms=now + 60_000))  # the first delayed entry
    assert redis_client.llen(q.keys.wake) == 1
    redis_client.delete(q.keys.wake)
    q.insert(Item(b"b", 100, "b", due_ms=now + 120_000))  # after it: no consumer need look
    assert redis_client.llen(q.keys.wake) == 0
    q.insert(Item(b"c", 100, "c", due_ms=now + 30_000))  # sooner: the waits shorten
    assert redis_client.llen(q.keys.wake) == 1
    assert redis_client.llen(view) == 0  # (a view whose ranks it is not in is not woken)
    assert 28_000 < q.pop(1).due_in <= 30_000


def test_the_pop_promotes_a_bounded_number_a_call_and_the_sweep_calls_again(redis_client, make_pq):
    q = make_pq("ot-bound")
    due = redis_ms(redis_client) + 200
    q.insert_many([Item(b"x", 5, due_ms=due) for _ in range(SWEEP_BATCH + 2 * POP_PROMOTE)])
    wait_until(redis_client, due)
    popped = q.pop(1)
    assert len(popped) == 1 and popped.due_in == 0  # more are due now
    assert redis_client.zcard(q.keys.delayed) == SWEEP_BATCH + POP_PROMOTE
    swept = q.reclaim()
    assert swept["promoted"] == SWEEP_BATCH and swept["more"]  # (the lease keeper sweeps again)
    assert q.reclaim()["promoted"] == POP_PROMOTE


def test_promotion_by_pop_logs_due_expires_and_keeps_a_rate_parked_tenant_parked(redis_client, make_pq):
    q = make_pq("ot-fair", fair=True, tenant_rate=2)
    q.set_event_log(10_000)
    now = redis_ms(redis_client)
    q.insert_many([Item(b"a", 5, "a1", tenant="A"), Item(b"a", 5, "a2", tenant="A"), Item(b"a", 5, "a3", tenant="A")])
    assert [x.id for x in q.pop(3)] == ["a1", "a2"]  # A's bucket holds 2: a3 waits, A parked
    q.insert(Item(b"a", 5, "a4", tenant="A", due_ms=now + 100))
    q.insert(Item(b"b", 5, "b1", tenant="B", due_ms=now + 100, expires_ms=now + 150))
    wait_until(redis_client, now + 200)
    assert q.pop(5) == []  # a4 promoted behind a3, A still parked; b1 past its deadline
    assert redis_client.zcard(q.keys.delayed) == 0
    assert redis_client.hget(q.keys.tenant_states, "A").startswith(b"R")
    assert [x.id for x in q.dead.peek(5)] == ["b1"] and q.dead.peek(1)[0].dead_reason == "expired"
    assert {e["id"] for e in q.events() if e["e"] == "due"} == {"a4", "b1"}
    time.sleep(0.6)
    assert [x.id for x in q.pop(5)] == ["a3"]


SHARDED = dict(shards=4, peek=2)


@pytest.mark.parametrize("kind", ["plain", "fair", "sharded"])
def test_thousands_due_at_once_are_deliverable_without_a_sweep(redis_client, make_pq, key_prefix, kind):
    """6,000 entries due at one moment: pops alone (no sweep) deliver every one, a bounded number
    promoted per call."""
    if kind == "sharded":
        q = open_queue(redis_client, "ot-many", Options(key_prefix=key_prefix, **SHARDED).queue_settings("ot-many"))
    else:
        q = make_pq("ot-many", fair=kind == "fair")
    n = 6_000
    due = redis_ms(redis_client) + 1_500
    tenants = ["t1", "t2", "t3"] if kind == "fair" else [None]
    q.insert_many([Item(b"x", i % 3, f"e{i}", due_ms=due, tenant=tenants[i % len(tenants)]) for i in range(n)])
    shards = getattr(q, "shards", [q])
    delayed = lambda: sum(redis_client.zcard(s.keys.delayed) for s in shards)  # noqa: E731
    assert delayed() == n
    assert q.pop(1) == [] and 0 < q.pop(1).due_in <= 1_500
    wait_until(redis_client, due)
    got = list(q.pop(1))
    assert delayed() >= n - len(shards) * POP_PROMOTE  # (a pop promotes at most POP_PROMOTE)
    count = FAIR_POP_MAX if kind == "fair" else 100
    for _ in range(2 * n):
        popped = q.pop(count)
        if not popped and not delayed():
            break
        got += popped
        q.ack(list(popped))
    assert len(got) == n and len({x.id for x in got}) == n
    assert delayed() == 0
