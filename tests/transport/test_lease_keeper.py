"""The lease keeper's renewals, on a real redis-server: a renewal the scripts refuse is a lost
lease worth a warning, unless the lease book no longer keeps it (acked meanwhile); a lease
released (its task ended) is not renewed, its ack still sent."""

import logging

from celery_pq import Item
from celery_pq.transport.leasebook import LeaseBook
from celery_pq.transport.leases import LeaseKeeper
from celery_pq.transport.options import Options


def held_book(make_pq, n=2):
    q = make_pq("keep")
    q.insert_many([Item(b"x", 1, f"e{i}") for i in range(n)])
    book = LeaseBook(Options())
    leases = q.pop(n)
    book.hold(q, leases)
    return q, book, leases


def test_a_lease_lost_while_held_is_reported(make_pq, caplog):
    q, book, (a, b) = held_book(make_pq)
    # Given a lease the book still holds, taken away in Redis (another consumer's sweep)
    q.requeue(a)
    # When the keeper renews
    with caplog.at_level(logging.WARNING, logger="celery_pq.transport.leasebook"):
        LeaseKeeper(transport=None).renew([book])
    # Then that loss is reported, and only that one
    lost = [r.getMessage() for r in caplog.records if "lost before renewal" in r.getMessage()]
    assert len(lost) == 1 and "e0" in lost[0]


def test_a_lease_acked_between_the_snapshot_and_the_renewal_is_not_reported(make_pq, caplog, monkeypatch):
    q, book, (a, b) = held_book(make_pq)
    # Given the keeper's snapshot of the book, then an ack of one of its leases (the race)
    snapshot = book.held()
    book.drop(a.token)
    assert q.ack(a)
    monkeypatch.setattr(book, "held", lambda: snapshot)
    # When the keeper renews with that snapshot
    with caplog.at_level(logging.WARNING, logger="celery_pq.transport.leasebook"):
        LeaseKeeper(transport=None).renew([book])
    # Then the refused renewal of the acked lease is no warning, and the other lease was renewed
    assert [r for r in caplog.records if "lost before renewal" in r.getMessage()] == []
    assert q.leases(id="e1")[0]["seconds_left"] > 50


def test_a_released_lease_is_not_renewed_but_its_late_ack_is_sent(make_pq):
    q, book, (a, b) = held_book(make_pq)
    # Given a retired book whose first lease's task no longer runs
    book.release_ended({b.token})
    # Then the keeper renews only the other one
    assert book.held() == {q: [("e1", b.token)]}
    # and an ack that still comes for the released lease goes to Redis at once
    book.ack(a.token, defer=True)
    assert not q.exists("e0") and q.exists("e1")
