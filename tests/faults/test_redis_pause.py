"""Redis paused for longer than lease_seconds (SIGSTOP of redis-server, or DEBUG SLEEP): the
leases that ran out on Redis's clock during the pause are not all taken as expired the instant
Redis answers again. A sweep that comes more than its gap after the last one gives each of them
the time it had left when the gap began, so a live holder renews it and a dead one's runs out
one lease later (lua/reclaim.lua, docs/leases.md)."""

import signal
import time

import pytest

from benchmarks.faults import redis_pause
from celery_pq.queue import open_queue
from celery_pq.testing import RedisServer


def _paused(server, seconds):
    server.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        server.process.send_signal(signal.SIGCONT)


@pytest.fixture
def server():
    with RedisServer() as s:
        yield s


def test_a_pause_longer_than_the_lease_gives_leases_their_time_back(server):
    r = server.client()
    q = open_queue(r, "pz")
    for i in range(3):
        q.insert(b"x", 5, id=f"e{i}")
    # Given a lease that ran out before any gap: the sweep returns it as always
    [early] = q.pop(lease_seconds=0.1)
    time.sleep(0.3)
    assert q.reclaim(gap_seconds=0.5)["returned"] == 1
    # and two leases of 1 s, one held by a live consumer, one by a dead one
    live, dead = q.pop(count=2, lease_seconds=1.0)
    assert q.reclaim(gap_seconds=0.5)["returned"] == 0
    # When Redis is paused for 2.5 s (both leases run out on its clock meanwhile)
    _paused(server, 2.5)
    # Then the first sweep after it returns neither: each gets the time it had left
    res = q.reclaim(gap_seconds=0.5)
    assert (res["returned"], res["restored"]) == (0, 2)
    [left] = q.leases(id=live.id)
    assert 0.5 < left["seconds_left"] <= 1.0
    # the live holder renews its lease in that time,
    assert q.extend([(live.id, live.token)], 1.0) == [True]
    # and the dead holder's lease runs out within one more lease and comes back, once
    # (sweeps every 0.2 s, as a consumer's keeper does; the live holder renews meanwhile)
    returned = restored = 0
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        time.sleep(0.2)
        q.extend([(live.id, live.token)], 1.0)
        res = q.reclaim(gap_seconds=0.5)
        returned, restored = returned + res["returned"], restored + res["restored"]
    assert (returned, restored) == (1, 0)
    assert not q.leases(id=dead.id) and q.leases(id=live.id)
    assert q.ack(live)


def test_with_restore_seconds_a_lease_that_ran_out_in_the_gap_gets_a_whole_lease_from_now(server):
    # (what the lease keeper passes: its lease length, so that a holder whose keeper is slow to
    # get through after the pause, every process waking at once, still renews in time)
    q = open_queue(server.client(), "pz")
    q.insert(b"x", 5, id="e0")
    [lease] = q.pop(lease_seconds=1.0)
    q.reclaim(gap_seconds=0.5)
    time.sleep(0.5)  # half the lease gone before the pause: it had 0.5 s left
    _paused(server, 2.0)
    res = q.reclaim(gap_seconds=0.5, restore_seconds=3.0)
    assert (res["returned"], res["restored"]) == (0, 1)
    assert 2.5 < q.leases(id=lease.id)[0]["seconds_left"] <= 3.0
    # a lease that had more time left than restore_seconds keeps its own
    q.insert(b"y", 5, id="e1")
    [long] = q.pop(lease_seconds=3.0)
    q.reclaim(gap_seconds=0.5)
    _paused(server, 3.5)
    res = q.reclaim(gap_seconds=0.5, restore_seconds=0.2)
    assert res["restored"] == 2 and q.leases(id=long.id)[0]["seconds_left"] > 2.0


def test_leases_taken_before_the_first_sweep_get_their_time_back_after_a_pause(server):
    # (the duplicate of the worker test below: the workers popped their first tasks and Redis
    # stopped before any sweep of the queue had recorded its time; the first sweep after the
    # pause, with no record to measure a gap from, took the leases as expired)
    q = open_queue(server.client(), "pz")
    for i in range(2):
        q.insert(b"x", 5, id=f"e{i}")
    # Given leases of 1 s taken before any sweep of the queue ran
    live, dead = q.pop(count=2, lease_seconds=1.0)
    # When Redis is paused for 2 s (both run out on its clock meanwhile)
    _paused(server, 2.0)
    # Then the first sweep after it returns neither: each gets restore_seconds from now
    res = q.reclaim(gap_seconds=0.5, restore_seconds=1.5)
    assert (res["returned"], res["restored"]) == (0, 2)
    assert 1.0 < q.leases(id=live.id)[0]["seconds_left"] <= 1.5
    # the live holder renews it, and the dead one's comes back once, within that time and a sweep
    assert q.extend([(live.id, live.token)], 1.0) == [True]
    assert _sweeps(q, live, 1.8) == (1, 0)
    assert not q.leases(id=dead.id) and q.ack(live)


def _sweeps(q, live, seconds):
    """Sweep every 0.2 s for ``seconds`` as a consumer's keeper does, the live holder renewing
    its lease meanwhile: (returned, restored) in all."""
    returned = restored = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        q.extend([(live.id, live.token)], 1.0)
        res = q.reclaim(gap_seconds=0.5)
        returned, restored = returned + res["returned"], restored + res["restored"]
    return returned, restored


def test_before_the_first_sweep_the_gap_counts_from_the_first_leases(server):
    # (the queue's first leases start its sweep record: what a lease had left when the gap
    # began is counted from them)
    q = open_queue(server.client(), "pz")
    q.insert(b"x", 5, id="e0")
    [lease] = q.pop(lease_seconds=1.0)
    _paused(server, 2.0)
    res = q.reclaim(gap_seconds=0.5)
    assert (res["returned"], res["restored"]) == (0, 1)
    assert 0.8 < q.leases(id=lease.id)[0]["seconds_left"] <= 1.0


def test_without_a_gap_every_lease_is_taken_as_expired_after_the_pause(server):
    # (what the gap prevents: the same pause, swept with gap_seconds=0)
    q = open_queue(server.client(), "pz")
    for i in range(2):
        q.insert(b"x", 5, id=f"e{i}")
    q.pop(count=2, lease_seconds=1.0)
    q.reclaim()
    _paused(server, 2.0)
    assert q.reclaim()["returned"] == 2


def test_a_sweep_gap_shorter_than_the_threshold_changes_nothing(server):
    q = open_queue(server.client(), "pz")
    q.insert(b"x", 5, id="e0")
    [lease] = q.pop(lease_seconds=0.2)
    q.reclaim(gap_seconds=5.0)
    time.sleep(0.4)  # the lease ran out, the sweep gap (0.4 s) is below 5 s: an ordinary expiry
    res = q.reclaim(gap_seconds=5.0)
    assert (res["returned"], res["restored"]) == (1, 0)


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["sigstop", "debug_sleep"])
def test_workers_tasks_under_way_through_a_redis_pause_run_once(tmp_path, how):
    # Given two prefork workers (lease 2 s) with 1 s tasks under way, when the broker is paused
    # for 5 s (longer than two leases) and goes on
    result = redis_pause("celery-pq", tmp_path, tasks=12, lease=2.0, pause=5.0, task_seconds=1.0, how=how)
    # Then none is lost, nothing runs that was not sent, every task is done and nothing stays behind
    assert result["under_way_at_pause"] >= 1
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] == 12 and result["residue"] == {"waiting": 0, "leased": 0}
    # and no task runs twice (the pause comes right after the first tasks started, often before
    # any sweep of the queue: test_leases_taken_before_the_first_sweep_get_their_time_back_after_a_pause)
    assert result["duplicated"] == []


def test_an_ack_after_a_give_back_that_did_not_reach_redis_is_still_sent(server):
    # (the other duplicate of the worker test: at the lost connection a message whose pool child
    # had not yet reported its start is given back, Redis being paused the give-back fails; its
    # task ran all the same, and its ack, when the task ended, was dropped: the lease ran out
    # and the task ran again)
    from kombu import Connection

    url = f"pq://127.0.0.1:{server.port}/0"
    with Connection(url, transport_options={"lease_seconds": 2.0}) as conn:
        producer, consumer = conn.SimpleQueue("gb"), conn.channel()
        producer.put({"n": 1})
        message = consumer.basic_get("gb")
        assert message is not None
        # Given a give-back that does not reach Redis: Redis is paused (the socket timeout is
        # 1.33 s), and the call waits for a new connection's handshake (only that is queued)
        conn.transport.release_pool()
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(conn.connection_errors):
                consumer.deliveries.give_back(message.delivery_tag)
        finally:
            server.process.send_signal(signal.SIGCONT)
        # When its task ends and acks it after all
        message.ack()
        # Then it is done: nothing waits or is leased, and it never comes back
        q = open_queue(server.client(), "gb")
        assert q.size() == 0 and q.stats()["leased"] == 0
        time.sleep(2.5)
        q.reclaim()
        assert q.size() == 0
        producer.close()
