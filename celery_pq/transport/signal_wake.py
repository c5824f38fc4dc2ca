"""Signals wake a Celery worker's idle event loop at once: the poller's self-wake pipe made the
process's ``signal.set_wakeup_fd`` (main thread only, never another's). docs/leases.md."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import suppress

_ours: int | None = None  # the fd set here, while it is the process's wake-up fd


def take(fd: int) -> bool:
    """Make ``fd`` the signal wake-up fd, where this thread may and no other is set; whether done."""
    global _ours
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    if previous not in (-1, fd):
        signal.set_wakeup_fd(previous)  # another's: left as it was
        return False
    _ours = fd
    return True


def give_back(fd: int) -> bool:
    """Stop ``fd`` being the signal wake-up fd, where ``take`` made it so; whether done (only the main thread
    can). Until then ``fd`` must stay open: a signal would write to a closed or reused fd."""
    global _ours
    if _ours != fd:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.set_wakeup_fd(-1)
    if previous not in (-1, fd):
        signal.set_wakeup_fd(previous)  # another's since: left as it was
    _ours = None
    return True


def _forget_in_child() -> None:
    global _ours
    if _ours is not None:
        with suppress(ValueError):  # forked from a thread other than the main one: not ours to change
            signal.set_wakeup_fd(-1)
        _ours = None


os.register_at_fork(after_in_child=_forget_in_child)
