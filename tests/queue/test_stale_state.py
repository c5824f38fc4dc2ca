"""What entries leave behind stays bounded: stale pointers (the documented bound), the fairness
state of tenants that left, and the delayed index of a removed entry."""

from __future__ import annotations

import time


def test_capped_tenants_do_not_leak_pointers(redis_client, make_pq):
    q = make_pq("m4", fair=True, tenant_concurrency=1)
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


def test_technique_s_removals_do_not_pile_up_pointers(redis_client, make_pq):
    q = make_pq("m4", technique="S")
    q.insert(b"head", 1, id="head")
    for i in range(2000):
        q.insert(b"x", 1, id=f"t{i}")
        assert q.remove(f"t{i}") == 1
    pointers = sum(redis_client.llen(q.keys.level(r)) for r in range(256))
    assert pointers <= 2 * q.size() + 128, pointers  # the documented bound


def test_fairness_state_of_tenants_that_left_is_cleaned_up(redis_client, make_pq):
    q = make_pq("m4", fair=True, tenant_rate=1000.0)
    for i in range(300):
        q.insert(b"x", 1, tenant=f"t{i}")
        q.ack(q.pop()[0])
    time.sleep(0.01)
    for _ in range(20):
        q.reclaim()
    assert redis_client.hlen(q.keys.virtual_times) < 50
    assert redis_client.hlen(q.keys.token_buckets) < 50


def test_technique_s_remove_of_a_delayed_entry_takes_it_out_of_the_delayed_index(make_pq):
    q = make_pq("mm", technique="S")
    q.insert(b"x", 5, id="a", delay=3600)
    assert q.remove("a") == 1
    assert q.size() == 0 and q.stats()["delayed"] == 0
