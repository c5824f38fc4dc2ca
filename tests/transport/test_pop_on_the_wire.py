"""A pop sent without waiting for its reply (Celery's event loop, a prefork pool): every message
delivered once and in order, the reply read before any other call on its connection, and what
the pop took given back at a close, kept for a later ack after a lost connection, or not
delivered once its lease ran out unread."""

import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import redis
from celery.worker import state
from kombu import Connection, Consumer
from kombu.asynchronous import Hub

from celery_pq.testing.proxy import FaultProxy
from celery_pq.transport.leasebook import LeaseBook

from ..support.consume import make_queue, publish_numbers


@pytest.fixture
def opts(key_prefix):
    return {"key_prefix": key_prefix}


class _Request:
    """What Celery's worker state keeps of a request (its id; held by identity)."""

    def __init__(self, id):
        self.id = id


def _pool_like(conn, name, n, hub, *, prefetch=2) -> list:
    """A queue of the numbers 0..n-1 and a consumer of it in a kombu Hub that runs no task in
    its callback: as a prefork worker's main process, it reserves a request for each message in
    Celery's worker state (``task_reserved``), and acks it on a later pass of the loop
    (call_soon, as when a child reports the task started), the request then done
    (``task_ready``). The numbers it gets."""
    q = make_queue(name)
    publish_numbers(conn, q, range(n))
    got = []

    def cb(body, message):
        got.append(body["i"])
        request = _Request(f"{name}-{body['i']}")
        state.task_reserved(request)

        def started():
            message.ack()
            state.task_ready(request)

        hub.call_soon(started)

    Consumer(conn, [q], callbacks=[cb], prefetch_count=prefetch).consume()
    conn.transport.register_with_event_loop(conn.connection, hub)
    return got


def _run(hub, until, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        hub.run_once()


def _first_delivery(conn, name, hub, monkeypatch, before_ack=lambda: None) -> None:
    """One pass of the loop's tick that delivers the first of three messages and stops there
    (no time to go on: ``TICK_DRAIN_SECONDS`` 0); then its ack, which sends the next pop."""
    from celery_pq.storage import constants

    monkeypatch.setattr(constants, "TICK_DRAIN_SECONDS", 0.0)
    got = _pool_like(conn, name, 3, hub, prefetch=1)
    for callback in list(hub.on_tick):
        callback()
    assert got == [0]
    before_ack()
    _acks_now(hub)
    assert conn.default_channel.deliveries._pop is not None


def _acks_now(hub) -> None:
    """Run the loop's waiting callbacks (the deferred acks) now, and nothing else."""
    for item in hub._pop_ready():
        if item:
            item()


def test_a_prefork_pools_pops_go_without_waiting_and_deliver_each_message_once_in_order(url, opts, monkeypatch):
    landed = []
    land = LeaseBook.land
    monkeypatch.setattr(LeaseBook, "land", lambda self, pop: landed.append((pop, land(self, pop))) or landed[-1][1])
    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        got = _pool_like(conn, "wire", 40, hub)
        q = conn.default_channel.queue("wire")
        _run(hub, lambda: len(got) == 40 and q.stats()["leased"] == 0)
        assert got == list(range(40))
        assert q.stats()["waiting"] == 0
        # every message after the first came by a pop on the wire, which carried the acks before it
        # (the first pop waits: whether tasks run in the loop's thread is known after a delivery)
        assert sum(len(leases) for _, leases in landed) >= 38
        assert sum(len(pairs) for pop, _ in landed for pairs in pop.acks.values()) >= 38
    hub.close()


def _solo_like(conn, name, n, hub, *, late: bool) -> list:
    """A queue of the numbers 0..n-1 and a consumer of it in a kombu Hub that runs each task in its
    callback, as Celery's solo pool: the request accepted (``task_accepted``), then with ``late``
    the task done (``task_ready``) and acked, as a late ack; else acked first, as an early ack, then
    done. The numbers it gets."""
    q = make_queue(name)
    publish_numbers(conn, q, range(n))
    got = []

    def cb(body, message):
        request = _Request(f"{name}-{body['i']}")
        request.name = "solo-like"
        state.task_accepted(request)
        if not late:
            message.ack()
        got.append(body["i"])
        state.task_ready(request)
        if late:
            message.ack()

    Consumer(conn, [q], callbacks=[cb], prefetch_count=1).consume()
    conn.transport.register_with_event_loop(conn.connection, hub)
    return got


@pytest.mark.parametrize("late", [True, False])
def test_a_solo_pools_late_ack_sends_the_next_pop_at_once_its_early_ack_does_not(url, opts, monkeypatch, late):
    landed = []
    land = LeaseBook.land
    monkeypatch.setattr(LeaseBook, "land", lambda self, pop: landed.append((pop, land(self, pop))) or landed[-1][1])
    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        got = _solo_like(conn, f"solo-{late}", 30, hub, late=late)
        q = conn.default_channel.queue(f"solo-{late}")
        _run(hub, lambda: len(got) == 30 and q.stats()["leased"] == 0)
        assert got == list(range(30)) and q.stats()["waiting"] == 0
        if late:  # the pop goes at the ack that ends the task, the ack in it (the first two pops wait:
            # whether the tasks run in the loop's thread is known once the first delivery returned)
            assert sum(len(leases) for _, leases in landed) >= 28
            assert sum(len(pairs) for pop, _ in landed for pairs in pop.acks.values()) >= 28
        else:  # an early ack comes before the task runs: the pop waits for the task, as before
            assert landed == []
    hub.close()


def test_a_call_on_the_connection_of_a_pop_on_the_wire_reads_the_pops_reply_first(make_pq):
    q = make_pq("flight")
    q.insert(b"a", 1)
    q.insert(b"b", 1)
    flight = q.send_pop(1)
    assert flight is not None and not flight.done
    assert q.stats()["leased"] == 1  # (this call's reply is its own)
    assert flight.done
    [delivery], _ = q.landed(flight.result())
    assert delivery.payload == b"a"


def test_a_pop_on_the_wire_at_the_close_gives_back_what_it_took(url, opts, make_pq, monkeypatch):
    hub = Hub()
    with Connection(url, transport_options=opts) as conn:
        _first_delivery(conn, "closing", hub, monkeypatch)
    hub.close()
    stats = make_pq("closing").stats()
    assert (stats["waiting"], stats["leased"]) == (2, 0)  # 0 acked, 1 given back at once


@contextmanager
def _first_delivery_through_a_proxy(redis_server, options, name, monkeypatch, fault):
    """``_first_delivery`` on a connection through a FaultProxy, ``fault(proxy)`` done just
    before the ack that sends the next pop: the channel, the pop then on the wire."""
    proxy = FaultProxy(redis_server.port)
    hub = Hub()
    try:
        with Connection(f"pq://127.0.0.1:{proxy.port}/0", transport_options=options) as conn:
            _first_delivery(conn, name, hub, monkeypatch, before_ack=lambda: fault(proxy))
            yield conn.default_channel, proxy
        hub.close()
    finally:
        proxy.close()


def _kept(make_pq, name) -> int:
    """Entries still in the queue, waiting or leased."""
    stats = make_pq(name).stats()
    return stats["waiting"] + stats["leased"]


def test_a_lost_connection_under_a_pop_on_the_wire_keeps_its_acks(opts, redis_server, make_pq, monkeypatch):
    # the pop that the ack of 0 sends is still on its way ...
    with _first_delivery_through_a_proxy(
        redis_server, opts, "dropped", monkeypatch, lambda proxy: proxy.latency(0.5)
    ) as (channel, proxy):
        proxy.cut()  # ... when its connection is lost
        proxy.latency(0)
        with pytest.raises(redis.ConnectionError):
            channel.deliveries.land()
        assert [tag for _, tag in channel.leases.held()[channel.queue("dropped")]] != []  # the ack of 0 waits
        channel.leases.flush()  # sent with the next round trip, on a new connection
        assert not channel.leases.holds_work()
    # 0 acked; 1 and 2 kept (1 leased by the lost pop until its lease runs out, if it ran)
    assert _kept(make_pq, "dropped") == 2


def test_a_pop_on_a_connection_gone_silent_fails_after_the_socket_timeout_and_keeps_its_acks(
    opts, redis_server, make_pq, monkeypatch
):
    # the pop that the ack of 0 sends goes into a connection that never answers
    options = {**opts, "socket_timeout": 1.0}
    with _first_delivery_through_a_proxy(redis_server, options, "silent", monkeypatch, FaultProxy.silence) as (
        channel,
        _,
    ):
        start = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            while time.monotonic() - start < 5:
                channel.deliveries.pop_and_deliver()  # (each tick of the loop looks)
                time.sleep(0.05)
        assert 1.0 <= time.monotonic() - start < 2.0
        channel.leases.flush()  # the ack of 0 waited; sent on a new connection
        assert not channel.leases.holds_work()
    assert _kept(make_pq, "silent") == 2


def test_a_pop_reply_read_late_is_renewed_first_and_one_whose_lease_ran_out_is_not_delivered(make_pq):
    q = make_pq("late", lease_seconds=1.0)
    book = LeaseBook(SimpleNamespace(renew_interval=0.2, lease_seconds=1.0))
    # Read after a renewal's interval (a stalled loop), within the lease: renewed, then delivered
    q.insert(b"x", 1)
    pop = book.send_pop(q, 1, consumer=None, view=None)
    assert pop is not None
    time.sleep(0.5)
    assert [d.payload for d in book.land(pop)] == [b"x"]
    assert q.leases()[0]["seconds_left"] > 0.8  # renewed for a whole lease (else about 0.5 left)
    # Read after the lease ran out, the entry swept back and taken by another consumer: not delivered
    q.insert(b"y", 1)
    pop = book.send_pop(q, 1, consumer=None, view=None)
    assert pop is not None
    time.sleep(1.2)
    q.reclaim()
    assert [lease.payload for lease in q.pop(2)] == [b"x", b"y"]  # (x: its lease was never renewed again)
    assert book.land(pop) == []
