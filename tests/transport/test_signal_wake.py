"""A Celery worker's idle event loop is woken by a signal at once (the loop's self-wake pipe is
the process's signal wake-up fd, set from the main thread), or every IDLE_WAKE_SECONDS where it
cannot be (a loop in another thread, another owner's wake-up fd): a warm shutdown asked for by
SIGTERM is not held up until the loop's poll times out."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest
from kombu import Connection
from kombu.asynchronous import Hub

from celery_pq.storage import constants as C
from celery_pq.transport import signal_wake


@pytest.fixture
def opts(key_prefix):
    return {"key_prefix": key_prefix}


@pytest.fixture(autouse=True)
def no_wakeup_fd():
    """Each test starts and must end with no signal wake-up fd set."""
    assert signal.set_wakeup_fd(-1) == -1
    yield
    assert signal.set_wakeup_fd(-1) == -1, "a signal wake-up fd was left set"


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_a_loop_in_the_main_thread_is_woken_by_a_signal_and_gives_the_fd_back_at_its_close(url, opts):
    hub = Hub()
    conn = Connection(url, transport_options=opts)
    conn.default_channel.client.ping()
    conn.transport.register_with_event_loop(conn.connection, hub)
    poller = conn.transport.poller
    read_end = poller._wake_pipe[0]
    previous = signal.signal(signal.SIGUSR2, lambda *a: None)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert select.select([read_end], [], [], 2.0)[0] == [read_end]
        assert os.read(read_end, 16) == bytes([signal.SIGUSR2])
        assert poller._idle_wake is None  # no timer needed
    finally:
        signal.signal(signal.SIGUSR2, previous)
        conn.release()
    assert poller._wake_pipe is None  # closed, after the fd was given back (the fixture checks)


def test_a_loop_in_another_thread_wakes_itself_every_idle_wake_seconds_until_its_close(url, opts):
    hub = Hub()
    conn = Connection(url, transport_options=opts)
    conn.default_channel.client.ping()
    _in_thread(lambda: conn.transport.register_with_event_loop(conn.connection, hub))
    poller = conn.transport.poller
    timer = poller._idle_wake
    assert timer is not None and not timer.canceled
    assert any(e.entry is timer for e in hub.timer.queue)
    assert 0 < hub.fire_timers() <= C.IDLE_WAKE_SECONDS  # the loop's poll waits no longer
    _in_thread(conn.release)
    assert timer.canceled and poller._idle_wake is None and poller._wake_pipe is None


def test_another_owners_wakeup_fd_is_left_in_place(url, opts):
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    try:
        hub = Hub()
        conn = Connection(url, transport_options=opts)
        conn.default_channel.client.ping()
        conn.transport.register_with_event_loop(conn.connection, hub)
        assert conn.transport.poller._idle_wake is not None  # woken by its timer instead
        conn.release()
        assert signal.set_wakeup_fd(-1) == w
    finally:
        os.close(r)
        os.close(w)


def test_take_and_give_back_belong_to_the_main_thread_and_a_forked_child_lets_go():
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        assert _in_thread(lambda: signal_wake.take(w)) is False
        assert signal_wake.take(w) is True
        assert signal_wake.take(w) is True  # (a loop registered again)
        assert _in_thread(lambda: signal_wake.give_back(w)) is False  # the pipe must stay open then
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: what is its wake-up fd?
            os.write(report_w, str(signal.set_wakeup_fd(-1)).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(report_r, 16) == b"-1"
        os.close(report_r)
        os.close(report_w)
        assert signal_wake.give_back(w) is True
    finally:
        os.close(r)
        os.close(w)
