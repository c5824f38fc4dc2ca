"""The wire below redis-py (celery_pq.scripts.wire): the lean path's socket timeout, and polling
for a reply."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_pq import PriorityQueue
from celery_pq.storage import constants as C
from celery_pq.testing import RedisServer


def test_a_call_on_the_lean_path_keeps_the_socket_timeout_in_the_kernel_and_recovers_after_it():
    import socket
    import struct

    from celery_pq.scripts import wire

    with RedisServer("--enable-debug-command", "yes") as server:
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        q = PriorityQueue(client, "lean")
        q.insert(b"warm", 1, id="w")
        conn = wire.own_connection(client)
        lean = wire._lean_io(conn)
        if lean is None:
            pytest.skip("redis-py's own path here (no hiredis parser, or not Linux)")
        sock = lean[0]
        # the socket blocks, with the connection's timeout kept by the kernel (no poll per call)
        assert sock.gettimeout() is None
        assert struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)) == (0, 500000)
        # a reply that does not come in time: redis-py's TimeoutError, the connection dropped
        sleeper = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", "1.2"))
        sleeper.start()
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            wire._roundtrip(conn, ("PING",))
        assert 0.4 < time.monotonic() - started < 1.1 and conn._sock is None
        sleeper.join()
        # the next call connects again and goes the lean way; errors come back as redis-py's
        assert wire._roundtrip(conn, ("PING",)) in (b"PONG", "PONG")
        with pytest.raises(redis.ResponseError):
            wire._roundtrip(conn, ("NOSUCHCOMMAND",))
        assert wire._roundtrip(conn, ("ECHO", "x")) == b"x"
        # where redis-py reads with a timeout of its own it puts Python's timeout mode back: the
        # next call here undoes it
        conn._sock.settimeout(0.5)
        assert q.insert(b"x", 1, id="t") == "t" and conn._sock.gettimeout() is None
        client.close()


def test_a_call_polls_for_its_reply_and_one_that_misses_the_poll_stops_the_polling_for_a_while():
    from celery_pq.scripts import wire

    # a script that answers after 30 ms (its own busy loop on the server's clock)
    slow = (
        "EVAL",
        "local t0 = redis.call('TIME') local a = t0[1] * 1e6 + t0[2] "
        "repeat local t = redis.call('TIME') until t[1] * 1e6 + t[2] - a > 30000 return 7",
        0,
    )
    poll_long, poll_short = 50_000_000, 1_000_000  # 50 ms (a PING answers within it), 1 ms
    with RedisServer() as server:
        client = redis.Redis(host=server.host, port=server.port)
        conn = wire.own_connection(client)
        if wire._lean_io(conn) is None:
            pytest.skip("redis-py's own path here (no hiredis parser, or not Linux)")
        assert wire._roundtrip(conn, ("PING",), poll_long) in (b"PONG", "PONG")
        assert getattr(conn, "_pq_spin_misses", 0) == 0 and getattr(conn, "_pq_spin_skip", 0) == 0
        # a reply later than the poll is read all the same (the thread then sleeps in recv), and
        # the connection polls for none of the next 2 calls
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (1, 2)
        for left in (1, 0):
            assert wire._roundtrip(conn, ("ECHO", "a"), poll_long) == b"a"
            assert conn._pq_spin_skip == left and conn._pq_spin_misses == 1
        # missed again: 4 calls without polling; then a reply in time starts the count anew
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (2, 4)
        for _ in range(5):
            assert wire._roundtrip(conn, ("ECHO", "b"), poll_long) == b"b"
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (0, 0)
        # the wait between polls is bounded, however many misses
        conn._pq_spin_misses = 40
        assert wire._roundtrip(conn, slow, poll_short) == 7
        assert conn._pq_spin_skip == C.SPIN_BACKOFF_MAX
        conn._pq_spin_skip = conn._pq_spin_misses = 0
        # a reply that comes while polling is in time, however long it took (a slow script:
        # polling on costs less than a sleep and a wake-up): the count starts anew
        conn._pq_spin_misses = 3
        assert wire._roundtrip(conn, slow, poll_long) == 7
        assert (conn._pq_spin_misses, conn._pq_spin_skip) == (0, 0)
        # a connection the server closed while it is polled: redis-py's ConnectionError at once
        my_id = wire._roundtrip(conn, ("CLIENT", "ID"), poll_long)
        server.client().client_kill_filter(_id=my_id)
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            wire._roundtrip(conn, ("PING",), poll_long)
        assert time.monotonic() - started < 1.0
        client.close()
