"""Entry ids never collide: an id given twice gets a generated one (``T~3``), never one stored
already, and dead letters of one id never overwrite each other."""

from __future__ import annotations


def test_dead_letters_never_overwrite_each_other(make_pq):
    q = make_pq("m5")
    assert [q.insert(b"T", 1, id="T"), q.insert(b"U", 1, id="U"), q.insert(b"T2", 1, id="T")] == ["T", "U", "T~3"]
    leases = {x.id: x for x in q.pop(3)}
    q.dead_letter(leases["T"])
    q.dead_letter(leases["T~3"])
    q.insert(b"T3", 1, id="T")
    q.dead_letter(q.pop()[0])
    assert sorted(e.payload for e in q.dead.peek(10)) == [b"T", b"T2", b"T3"]


def test_generated_ids_never_take_a_stored_id(make_pq):
    q = make_pq("m5")
    q.insert(b"user", 1, id="T~2")
    q.insert(b"user3", 1, id="3")
    q.insert(b"a", 1, id="T")
    dup = q.insert(b"b", 1, id="T")  # would be "T~4" or so, never a stored one
    gen = q.insert(b"c", 1)
    assert len({"T~2", "3", "T", dup, gen}) == 5
    assert sorted(e.payload for e in q.peek(10)) == [b"a", b"b", b"c", b"user", b"user3"]
    assert q.remove("T") == 2 and q.size() == 3
