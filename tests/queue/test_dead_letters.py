"""Dead-letter queues: they have no dead-letter queue of their own, and keep at most
``max_dead_length`` entries."""

from __future__ import annotations

import logging

import pytest

from celery_pq import Item


def test_a_dead_letter_queue_does_not_dead_letter_into_itself(make_pq):
    q = make_pq("m9", max_deliveries=1)
    q.insert(b"x", 1, id="a")
    q.dead_letter(q.pop()[0])
    dead = q.dead
    [lease] = dead.pop()
    with pytest.raises(ValueError, match="dead-letter queue"):
        dead.dead_letter(lease)
    assert dead.requeue(lease) == "waiting"
    for _ in range(3):
        [lease] = dead.pop()
        assert dead.requeue(lease) == "waiting"
    assert [e.id for e in dead.peek(5)] == ["a"]


def test_the_dead_letter_queue_keeps_at_most_max_dead_length(make_pq, caplog):
    q = make_pq("m9", max_dead_length=3)
    q.insert_many([Item(b"%d" % i, 1, f"t{i}") for i in range(5)])
    with caplog.at_level(logging.WARNING, logger="celery_pq"):
        for lease in q.pop(5):
            q.dead_letter(lease)
    assert sorted(e.id for e in q.dead.peek(10)) == ["t2", "t3", "t4"]
    assert "max_dead_length" in caplog.text
