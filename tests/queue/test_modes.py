"""A queue's mode (fairness, scope, priority order, technique) is recorded with it: a process
whose settings disagree is refused at every call that changes the queue and touches nothing; only
``migrate_mode`` (on purpose) changes the record (docs/settings.md). A process that disagrees is a
``PriorityQueue`` made with its own settings: ``open_queue`` would take the recorded mode."""

from __future__ import annotations

import pytest

from celery_pq import Item, ModeMismatch, PriorityQueue
from tests.support.tenants import tenant_counts


def test_fair_pop_on_a_plain_queue_is_refused_and_strands_nothing(redis_client, make_pq, key_prefix):
    # Given a plain queue with ten waiting entries
    plain = make_pq("m")
    plain.insert_many([Item(b"x", 1)] * 10)
    before = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*")}
    # When a process that thinks the queue is fair pops from it
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True)
    with pytest.raises(ModeMismatch) as err:
        fair.pop(5)
    # Then the error names the queue and both settings, and nothing was touched
    assert "'m'" in str(err.value) and "fair=" in str(err.value)
    assert err.value.stored["fair"] is False and err.value.wanted["fair"] is True
    after = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*")}
    assert after == before
    # and the plain consumer still gets all ten
    assert len(plain.pop(20)) == 10


@pytest.mark.parametrize(
    "other",
    [
        {"fair": True},
        {"priority_order": "lower_first"},
        {"technique": "S"},
    ],
)
def test_every_call_that_changes_a_queue_checks_its_mode(redis_client, make_pq, key_prefix, other):
    q = make_pq("m")
    q.insert(b"a", 5, id="a")
    [lease] = q.pop()
    q.insert(b"b", 5, id="b")
    wrong = PriorityQueue(redis_client, "m", key_prefix=key_prefix, **other)
    for call in (
        lambda: wrong.insert(b"c", 1),
        lambda: wrong.pop(),
        lambda: wrong.ack(lease),
        lambda: wrong.requeue(lease),
        lambda: wrong.remove("b"),
        lambda: wrong.change_priority("b", 9),
        lambda: wrong.purge(),
        lambda: wrong.reclaim(),
        lambda: wrong.insert_many([Item(b"d", 1)]),
    ):
        with pytest.raises(ModeMismatch):
            call()
    assert q.ack(lease) and [e.id for e in q.pop(5)] == ["b"]


def test_plain_pop_on_a_fair_queue_is_refused(redis_client, make_pq, key_prefix):
    fair = make_pq("m", fair=True)
    fair.insert(b"x", 1, tenant="A")
    with pytest.raises(ModeMismatch):
        PriorityQueue(redis_client, "m", key_prefix=key_prefix).pop()
    assert [e.tenant for e in fair.pop()] == ["A"]


def test_an_empty_queue_keeps_its_mode_until_a_migration_changes_it(redis_client, make_pq, key_prefix):
    # Given a fair queue, drained
    fair = make_pq("m", fair=True)
    fair.insert(b"x", 1, tenant="A")
    fair.purge()
    # When a process that takes it as plain inserts into it
    plain = PriorityQueue(redis_client, "m", key_prefix=key_prefix)
    with pytest.raises(ModeMismatch):
        plain.insert(b"y", 1)
    # Then it is still fair: its consumers go on, and only a migration (on purpose) changes it
    assert fair.recorded()["mode"] == fair.mode
    fair.insert(b"z", 1, tenant="B")
    assert [e.tenant for e in fair.pop()] == ["B"]
    plain.migrate_mode()
    assert plain.recorded()["mode"] == plain.mode


def test_migrate_mode_moves_a_plain_backlog_to_fair(redis_client, make_pq, key_prefix):
    plain = make_pq("m")
    plain.insert_many([Item(b"x", p) for p in (1, 9, 5)])
    [held] = plain.pop()  # priority 9, leased through the migration
    fair = PriorityQueue(redis_client, "m", key_prefix=key_prefix, fair=True, priority_order="lower_first")
    fair.migrate_mode()
    assert fair.recorded()["mode"] == fair.mode
    assert [e.priority for e in fair.pop(5)] == [1, 5]
    assert fair.ack(held)
    assert tenant_counts(fair) == {"": {"waiting": 0, "leased": 2}}
