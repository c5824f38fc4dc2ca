"""The wire (celery_pq.scripts.wire): a thread's own connection keeps its socket timeout and
recovers after it, and polling for a reply backs off after a missed one."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_pq import PriorityQueue
from celery_pq.storage import constants as C
from celery_pq.testing import RedisServer


def test_a_call_on_the_threads_own_connection_keeps_the_socket_timeout_and_recovers_after_it():
    from celery_pq.scripts import wire

    with RedisServer("--enable-debug-command", "yes") as server:
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        q = PriorityQueue(client, "lean")
        q.insert(b"warm", 1, id="w")
        line = wire.own_line(client)
        assert line is not None
        # a reply that does not come in time: redis-py's TimeoutError, the connection dropped
        sleeper = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", "1.2"))
        sleeper.start()
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            line.call("PING", spin_ns=1_000_000)
        assert 0.4 < time.monotonic() - started < 1.1 and line.conn._sock is None
        sleeper.join()
        # the next call connects again; errors come back as redis-py's
        assert line.call("PING") in (b"PONG", "PONG")
        with pytest.raises(redis.ResponseError):
            line.call("NOSUCHCOMMAND")
        assert line.call("ECHO", "x") == b"x"
        assert q.insert(b"x", 1, id="t") == "t"
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
        line = wire.own_line(client)
        assert line is not None
        assert line.call("PING", spin_ns=poll_long) in (b"PONG", "PONG")
        assert (line.misses, line.skip) == (0, 0)
        # a reply later than the poll is read all the same (the thread then sleeps in its read), and
        # the line polls for none of the next 2 calls
        assert line.call(*slow, spin_ns=poll_short) == 7
        assert (line.misses, line.skip) == (1, 2)
        for left in (1, 0):
            assert line.call("ECHO", "a", spin_ns=poll_long) == b"a"
            assert line.skip == left and line.misses == 1
        # missed again: 4 calls without polling; then a reply in time starts the count anew
        assert line.call(*slow, spin_ns=poll_short) == 7
        assert (line.misses, line.skip) == (2, 4)
        for _ in range(5):
            assert line.call("ECHO", "b", spin_ns=poll_long) == b"b"
        assert (line.misses, line.skip) == (0, 0)
        # the wait between polls is bounded, however many misses
        line.misses = 40
        assert line.call(*slow, spin_ns=poll_short) == 7
        assert line.skip == C.SPIN_BACKOFF_MAX
        line.skip = line.misses = 0
        # a reply that comes while polling is in time, however long it took (a slow script:
        # polling on costs less than a sleep and a wake-up): the count starts anew
        line.misses = 3
        assert line.call(*slow, spin_ns=poll_long) == 7
        assert (line.misses, line.skip) == (0, 0)
        # a connection the server closed while it is polled: redis-py's ConnectionError at once
        my_id = line.call("CLIENT", "ID", spin_ns=poll_long)
        server.client().client_kill_filter(_id=my_id)
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            line.call("PING", spin_ns=poll_long)
        assert time.monotonic() - started < 1.0
        client.close()
