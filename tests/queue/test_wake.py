"""Wake tokens: a pop leaves one while entries wait, and every call that makes an entry takeable
(a dead letter freeing a capped tenant, a requeue, a priority change) wakes the views that can take
it, registered by any process."""

from __future__ import annotations

import pytest

from celery_pq import Item


@pytest.mark.parametrize("view", [None, (0, 255), (200, 255)])
def test_a_pop_leaves_a_wake_token_while_entries_wait_and_none_once_it_took_the_last(redis_client, make_pq, view):
    q = make_pq("mw")
    q.insert_many([Item(b"x", 50, "a"), Item(b"x", 50, "b"), Item(b"x", 40, "c")])  # ranks 205 and 215
    wk = q.keys.wake if view is None else q.keys.view_wake(*view)
    redis_client.delete(wk)
    assert [e.id for e in q.pop(1, view=view)] == ["a"]  # b is behind it in its rank
    assert redis_client.llen(wk) == 1
    redis_client.delete(wk)
    assert [e.id for e in q.pop(1, view=view)] == ["b"]  # its rank ran empty; c waits in another
    assert redis_client.llen(wk) == 1
    assert [e.id for e in q.pop(2, view=view)] == ["c"]  # the last one
    assert redis_client.llen(wk) == 0


def test_dead_lettering_a_capped_tenants_lease_wakes_a_consumer(redis_client, make_pq):
    q = make_pq("mm", fair=True, tenant_concurrency=1)
    q.insert_many([Item(b"x", 5, "a1", tenant="A"), Item(b"x", 5, "a2", tenant="A")])
    [lease] = q.pop(1)
    assert q.pop(1) == [] and not redis_client.llen(q.keys.wake)
    q.dead_letter(lease)
    assert redis_client.llen(q.keys.wake) == 1 and [e.id for e in q.pop(1)] == ["a2"]


def test_requeue_and_change_priority_wake_views_registered_elsewhere(redis_client, make_pq):
    q = make_pq("mm")
    q.insert(b"x", 200, id="a")
    q.insert(b"y", 5, id="b")
    other = make_pq("mm")
    hi = other.register_view(*sorted((q.rank(200), q.rank(255))))
    lo = other.register_view(q.rank(255), q.rank(255))
    [lease] = q.pop(1)  # this object never heard of the views
    redis_client.delete(hi, lo)
    q.requeue(lease)
    assert redis_client.llen(hi) == 1 and not redis_client.llen(lo)
    q.change_priority("b", 255)
    assert redis_client.llen(lo) == 1
