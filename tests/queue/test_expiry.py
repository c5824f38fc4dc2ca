"""Broker-side expiry on a real redis-server: an entry past its deadline is never delivered.

An insert stores one absolute deadline (Redis clock) with the entry; the pops check it when
they take the entry and dead-letter it (reason ``expired``) or drop it, a bounded number per
call, counting and logging each.
"""

from __future__ import annotations

import time

import pytest

from celery_pq import ConfigError, Item, PriorityQueue
from celery_pq.storage.records import split_entry

try:
    from support.consume import pop_all
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import pop_all

EXPIRE_BUDGET = 100  # includes/dead.lua


def q_of(make_pq, name="xq", **kw):
    kw.setdefault("event_log", 1000)
    return make_pq(name, **kw)


def stored(client, q, eid):
    return split_entry(client.hget(q.keys.entries, eid))


def now_ms(client):
    s, us = client.time()
    return s * 1000 + us // 1000


def drain(q, count=10):
    return pop_all(q, count)


def test_deadline_is_stored_in_the_entry_header(redis_client, make_pq):
    q = q_of(make_pq)
    before = now_ms(redis_client)
    q.insert(b"a", 1, id="rel", ttl=30)
    q.insert(b"b", 1, id="abs", expires_ms=before + 5_000)
    q.insert(b"c", 1, id="both", ttl=60, expires_ms=before + 7_000)
    q.insert(b"d", 1, id="none")
    after = now_ms(redis_client)
    assert before + 30_000 <= stored(redis_client, q, "rel")[0].expires_ms <= after + 30_000
    assert stored(redis_client, q, "abs")[0].expires_ms == before + 5_000
    assert stored(redis_client, q, "both")[0].expires_ms == before + 7_000  # the earlier
    # peek shows the deadline
    assert {e.id: e.expires_ms for e in q.peek(4)} == {
        "rel": stored(redis_client, q, "rel")[0].expires_ms,
        "abs": before + 5_000,
        "both": before + 7_000,
        "none": None,
    }
    header, payload = stored(redis_client, q, "none")
    assert header.expires_ms == 0 and payload == b"d"
    # an entry without a deadline keeps the six-field header (nothing more to parse or store)
    assert redis_client.hget(q.keys.entries, "none").split(b"|")[0].count(b",") == 5


def test_expired_entry_is_dead_lettered_never_delivered(make_pq):
    q = q_of(make_pq)
    # Given an entry that expires, one behind it that does not, and one at a lower priority
    q.insert(b"old", 9, id="gone", ttl=0.05)
    q.insert(b"new", 9, id="live")
    q.insert(b"later", 1, id="low", ttl=60)
    time.sleep(0.1)
    # When a consumer pops
    assert drain(q) == ["live", "low"]
    # Then the expired one went to the dead-letter queue with reason "expired", payload intact
    [dead] = q.dead.peek(10)
    assert (dead.id, dead.payload, dead.dead_reason, dead.priority) == ("gone", b"old", "expired", 9)
    assert q.counters()["expired"] == 1
    assert q.counters()["dead_lettered"] == 1
    assert q.counters()["delivered"] == 2
    [ev] = [e for e in q.events() if e["e"] == "dead"]
    assert (ev["id"], ev["r"], ev["p"]) == ("gone", "expired", 9)
    # a dead letter does not expire again: it can be taken from the dead-letter queue
    assert [lease.id for lease in q.dead.pop(5)] == ["gone"]


def test_expired_drop_deletes_it(redis_client, make_pq):
    q = q_of(make_pq, expired="drop")
    q.insert(b"old", 0, id="gone", ttl=0.05)
    q.insert(b"new", 0, id="live")
    time.sleep(0.1)
    assert drain(q) == ["live"]
    assert q.dead.peek(10) == []
    assert not redis_client.hexists(q.keys.entries, "gone")
    assert q.counters()["expired"] == 1
    assert q.counters().get("dead_lettered", 0) == 0
    [ev] = [e for e in q.events() if e["e"] == "remove"]
    assert (ev["id"], ev["r"]) == ("gone", "expired")
    assert not [e for e in q.events() if e["e"] == "dead"]


def test_expired_setting_is_checked():
    with pytest.raises(ConfigError, match="expired"):
        PriorityQueue(None, "x", expired="keep")


def test_not_yet_expired_is_delivered_and_a_delay_does_not_move_the_deadline(make_pq):
    q = q_of(make_pq)
    q.insert(b"a", 0, id="soon", ttl=60)
    assert drain(q) == ["soon"]
    # due after its deadline: it waits its delay, then is expired when due
    q.insert(b"b", 0, id="late", delay=0.2, ttl=0.1)
    time.sleep(0.35)
    deadline = time.monotonic() + 3
    got = []
    while time.monotonic() < deadline and not q.counters().get("expired"):
        q.reclaim()  # the sweep promotes due delayed entries
        got += drain(q)
        time.sleep(0.05)
    assert got == []
    assert [d.id for d in q.dead.peek(5)] == ["late"]


def test_bound_per_call(redis_client, make_pq):
    q = q_of(make_pq, event_log=0)
    # Given more expired entries than one pop may clear, then a live one
    n = EXPIRE_BUDGET + 50
    before = now_ms(redis_client)
    q.insert_many([Item(b"x", 3, f"e{i}", expires_ms=before - 1) for i in range(n)], chunk=1000)
    q.insert(b"y", 3, id="live")
    # When one pop asks for one entry
    first = q.pop(1)
    # Then it cleared at most the budget (plus the pointers of its batch) and returned nothing
    assert list(first) == []
    cleared = q.counters()["expired"]
    assert EXPIRE_BUDGET <= cleared < n
    # and the next pops clear the rest and deliver the live one
    assert drain(q) == ["live"]
    assert q.counters()["expired"] == n
    assert len(q.dead.peek(1000)) == n


@pytest.mark.parametrize("scope", ["within_priority", "tenant_first"])
def test_fair_queue_skips_expired(make_pq, scope):
    q = q_of(make_pq, fair=True, fair_scope=scope)
    q.insert(b"a", 0, id="a1", tenant="A", ttl=0.05)
    q.insert(b"a", 0, id="a2", tenant="A")
    q.insert(b"b", 0, id="b1", tenant="B", ttl=0.05)
    q.insert(b"b", 0, id="b2", tenant="B")
    time.sleep(0.1)
    assert sorted(drain(q)) == ["a2", "b2"]
    assert sorted(d.id for d in q.dead.peek(10)) == ["a1", "b1"]
    assert q.counters()["expired"] == 2
    assert q.stats()["waiting"] == 0
    # the tenants' waiting counts went down with the expired entries: nothing waits for them
    q.insert(b"a", 0, id="a3", tenant="A")
    assert drain(q) == ["a3"]


def test_fair_bound_per_call(redis_client, make_pq):
    q = q_of(make_pq, fair=True, event_log=0)
    before = now_ms(redis_client)
    n = EXPIRE_BUDGET + 30
    # (an expired entry costs its tenant no turn: the tenant stays first in the schedule, so
    # one tenant's backlog of them is what one call meets)
    q.insert_many([Item(b"x", 0, f"e{i}", tenant="A", expires_ms=before - 1) for i in range(n)], chunk=1000)
    q.insert(b"y", 0, id="live", tenant="A")
    assert list(q.pop(1)) == []
    assert q.counters()["expired"] == EXPIRE_BUDGET
    assert drain(q) == ["live"]
    assert q.counters()["expired"] == n
