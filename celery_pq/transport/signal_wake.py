"""Signals that wake a Celery worker's event loop at once.

An idle worker's loop sleeps in its poll until a timer or a socket is due. A signal breaks into
that poll, but Python runs the handler and polls again for the time left, so the warm shutdown
a SIGTERM asks for would wait for the poll to time out. Made the process's signal wake-up fd
(``signal.set_wakeup_fd``), the write end of the loop's self-wake pipe (poller.Poller) makes
every signal wake the loop, whose next pass sees the shutdown.

Only the main thread may set it, and it is never taken from another owner. A forked child (a
prefork pool's worker process) lets it go: its signals are its own.
"""

from __future__ import annotations

import os
import signal
import threading

_ours: int | None = None  # the fd set here, while it is the process's wake-up fd


def take(fd: int) -> bool:
    """Make ``fd`` the signal wake-up fd, where this thread may and no other is set: whether it is."""
    global _ours
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    if previous not in (-1, fd):
        signal.set_wakeup_fd(previous)  # another's: left as it was
        return False
    _ours = fd
    return True


def holds(fd: int) -> bool:
    """Whether ``fd`` was made the signal wake-up fd here and not given back since."""
    return _ours == fd


def give_back(fd: int) -> bool:
    """Let ``fd`` be the signal wake-up fd no more (unless another has taken its place since):
    whether done, which only the main thread can do; until then ``fd`` must stay open (a
    signal would write to a closed or reused fd)."""
    global _ours
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.set_wakeup_fd(-1)
    if previous not in (-1, fd):
        signal.set_wakeup_fd(previous)  # another's since: left as it was
    if _ours == fd:
        _ours = None
    return True


def _forget_in_child() -> None:
    global _ours
    if _ours is not None:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:  # forked from a thread other than the main one: not ours to change
            pass
        _ours = None


os.register_at_fork(after_in_child=_forget_in_child)
