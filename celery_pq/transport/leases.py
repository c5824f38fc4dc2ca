"""The lease keeper: one thread per connection that renews this process's leases, sends the acks
waiting and sweeps expired leases back to their queues; under gevent or eventlet a native watch beside it
(green.py). docs/leases.md ("Renewal", "Sweep", "Green pools")."""

from __future__ import annotations

import logging
import threading
from time import monotonic

from redis import exceptions as rex

from ..storage.connections import impatient
from .green import NativeWatch, green_runtime

logger = logging.getLogger(__name__)

#: Seconds before the first retry of a failed renewal, doubling up to RETRY_MAX (and renew_interval).
RETRY_FIRST = 0.1
RETRY_MAX = 2.0

#: Seconds between two reports of the same trouble (refused writes an error, the rest a warning).
REPORT_EVERY = 10.0

#: Redis errors that mean "this Redis takes no writes now", by the code that starts the reply.
_REFUSALS = {
    "OOM": "OOM: used memory is over maxmemory and the eviction policy is noeviction",
    "READONLY": "READONLY: this Redis is a read-only replica",
    "MISCONF": "MISCONF: Redis cannot persist to disk (stop-writes-on-bgsave-error)",
    "NOREPLICAS": "NOREPLICAS: not enough replicas for min-replicas-to-write",
}


def write_refusal(exc: BaseException) -> str | None:
    """Why Redis refuses writes, when ``exc`` says it does; else None."""
    if isinstance(exc, getattr(rex, "OutOfMemoryError", ())):
        code = "OOM"
    elif isinstance(exc, rex.ReadOnlyError) or isinstance(exc.__cause__, rex.ReadOnlyError):
        code = "READONLY"  # (a script's READONLY is a connection error: scripts.wire.demoted)
    else:  # (a refusal's reply starts with its code)
        code = str(exc).split(" ", 1)[0] if isinstance(exc, rex.ResponseError) else ""
    return _REFUSALS.get(code)


class LeaseKeeper(threading.Thread):
    def __init__(self, transport):
        super().__init__(name="celery-pq-lease-keeper", daemon=True)
        self.transport = transport
        self._stopped = threading.Event()
        self._reported: dict[str, float] = {}  # trouble -> when last logged
        self.renewals = 0  # extend calls made
        #: (books, monotonic time the next renewal is due, renew interval) as of the last look:
        #: what a ``NativeWatch`` reads, from another OS thread (one assignment, read at once).
        self.seen: tuple[list, float, float | None] = ([], 0.0, None)
        self.watch: NativeWatch | None = None
        self._watch_passes = 0  # the watch's passes when last reported

    def stop(self):
        self._stopped.set()

    def run(self):
        runtime = green_runtime()  # (gevent or eventlet: this thread is a greenlet)
        self.watch = NativeWatch(self, runtime) if runtime else None
        try:
            self._loop()
        finally:
            if self.watch is not None:
                self.watch.stop()

    def _loop(self):
        next_renew = next_sweep = 0.0
        failures = 0  # renewals failed in a row
        while not self._stopped.is_set():
            books = self.transport.keeper_books()
            if books is None:
                self.transport.release_pool()
                return
            wait = 0.25
            if books:
                renew_every = min(b.options.renew_interval for b in books)
                sweep_every = min(b.options.sweep_interval for b in books)
                now = monotonic()
                if now >= next_renew:
                    if self._attempt("renewing leases", self.renew, books):
                        failures = 0
                        next_renew = now + renew_every
                    else:
                        failures += 1
                        next_renew = now + min(RETRY_FIRST * 2 ** (failures - 1), RETRY_MAX, renew_every)
                if not failures:
                    # (not while renewals fail: a lease that ran out meanwhile is then named by
                    # the next renewal's refusal before its ack is resent: LeaseBook.refused)
                    for book in books:
                        self._attempt("sending acks", book.flush)
                if now >= next_sweep:
                    next_sweep = now + sweep_every
                    self._attempt("sweeping expired leases", self.sweep, books)
                tick = max(0.02, min(renew_every, sweep_every) / 4)
                wait = max(0.01, min(tick, next_renew - monotonic()))
                self.seen = (books, next_renew, renew_every)
            else:
                self.seen = ([], 0.0, None)
            self._watched()
            self._stopped.wait(wait)

    def _watched(self):
        """Say so when the native watch renewed for us (the hub was held), at most every REPORT_EVERY."""
        watch = self.watch
        if watch is None or watch.passes == self._watch_passes:
            return
        now = monotonic()
        if now - self._reported.get("held", -REPORT_EVERY) < REPORT_EVERY:
            return
        self._reported["held"] = now
        logger.warning(
            "celery-pq lease keeper: the %s hub was held past a lease renewal (a task that does not "
            "yield?); the native watch renewed the leases instead (%d pass(es), %d lease(s) so far)",
            watch.runtime,
            watch.passes,
            watch.renewed,
        )
        self._watch_passes = watch.passes

    def _attempt(self, what, fn, *args) -> bool:
        """Run one keeper task, reporting a failure; a moving slot fails it at once (``impatient``) so others go on."""
        try:
            with impatient():
                fn(*args)
            return True
        except Exception as exc:
            self._report(what, exc)
            return False

    def _report(self, what, exc):
        refusal = write_refusal(exc)
        now = monotonic()
        key = refusal or "other"
        if now - self._reported.get(key, -REPORT_EVERY) < REPORT_EVERY:
            return
        self._reported[key] = now
        if refusal:
            logger.error(
                "celery-pq lease keeper: Redis refuses writes (%s) while %s: leases are not renewed and "
                "expire, and their tasks may run twice. Redis said: %s",
                refusal,
                what,
                exc,
            )
        else:
            logger.warning("celery-pq lease keeper: %s failed: %r (will retry)", what, exc)

    def renew(self, books):
        """Renew every held lease, one extend per queue; the first error is raised after all."""
        error = None
        for book in books:
            for q, pairs in book.held().items():
                try:
                    results = q.extend(pairs, book.options.lease_seconds)
                except Exception as exc:
                    error = error or exc
                    continue
                self.renewals += 1
                for (eid, tag), ok in zip(pairs, results):
                    if not ok:
                        book.refused(q, eid, tag)
        if error is not None:
            raise error

    def sweep(self, books):
        seen = set()
        for book in books:
            for q in book.queues:  # a priority view sweeps the queue it views
                if q.name in seen:
                    continue
                seen.add(q.name)
                # longer unswept means Redis was out of reach (at most half a lease: any pause that let leases expire)
                gap = min(book.options.lease_seconds / 2, max(2 * book.options.sweep_interval, 1.0))
                # a lease expired in the gap gets a whole lease from now: its keeper comes out of it too, maybe slowly
                result = q.reclaim(
                    guard_seconds=book.options.sweep_interval * 0.9,
                    gap_seconds=gap,
                    restore_seconds=book.options.lease_seconds,
                )
                if result["restored"]:
                    logger.warning(
                        "celery-pq: no sweep of %r reached Redis for over %.1f s (Redis paused, down or "
                        "unreachable): %d lease(s) that expired meanwhile get a whole lease length from now, "
                        "for their holders to renew",
                        q.name,
                        gap,
                        result["restored"],
                    )
                while result["more"]:
                    result = q.reclaim(gap_seconds=gap)
                if result["returned"] or result["dead"] or result["promoted"]:
                    book.returned = True
