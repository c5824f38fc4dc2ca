"""A channel's lease book: every delivered, unacked message (its tag is its lease token) and the
acks deferred to the next round trip; the only object the lease keeper touches. docs/leases.md."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import NamedTuple

from redis import exceptions as rex

from ..queue import Consumer, Lease, Popped, PriorityQueue, ack_all
from ..scripts import Flight
from ..storage import constants as C
from ..storage.errors import ErrorCode

logger = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]  # [(entry id, token), ...]


class PopInFlight(NamedTuple):
    """A pop sent without waiting (``LeaseBook.send_pop``): its queue, acks and call on the wire."""

    queue: PriorityQueue
    acks: dict[PriorityQueue, Pairs]
    flight: Flight
    sent: float  # (monotonic)


class LeaseBook:
    def __init__(self, options):
        self.options = options  # the channel's
        self._lock = threading.Lock()
        self._held: dict[str, tuple[PriorityQueue, str]] = {}  # tag -> (queue, entry id)
        self._acks: dict[PriorityQueue, Pairs] = {}  # waiting for the next round trip
        # Tags of acks whose round trip failed: sent again, they may find their entry acked already.
        self._resent: set[str] = set()
        self.queues: tuple[PriorityQueue, ...] = ()  # consumed (the channel's), swept by the keeper
        # Leases given back in vain (Redis unreachable): not renewed, but an ack for one is sent.
        self._unreturned: dict[str, tuple[PriorityQueue, str]] = {}
        # The acks of each round trip under way, by id of their batch: renewed like the waiting
        # ones; a renewal refused meanwhile is noted in ``_refused`` until ``_check`` settles it.
        self._sending: dict[int, dict[PriorityQueue, Pairs]] = {}
        self._refused: set[str] = set()
        #: Set at the channel's close: acks then wait for the keeper.
        self.closed = False
        #: Set by a sweep that returned entries: the channel looks before blocking.
        self.returned = False

    # -- the channel's side -----------------------------------------------------------------
    def pop(
        self, q: Consumer, count: int, *, consumer: str | None = None, view: tuple[int, int] | None = None
    ) -> Popped:
        """Pop ``q`` with every ack waiting, in one round trip; the leases are held from now, by shard."""
        pending = self._take()
        leases = self._send(
            pending, lambda: (p := q.pop(count, acks=pending, lean=True, consumer=consumer, view=view), p.acked)
        )
        self.hold(leases.queue or q.shards[0], leases)
        return leases

    def send_pop(self, q: Consumer, count: int, *, consumer: str | None, view) -> PopInFlight | None:
        """``pop`` sent without waiting for its reply (``land`` reads it); None, nothing sent, where
        only a waiting pop can be made (acks of other queues waiting, ``wait_replicas``, a cluster, ...)."""
        shard = q.shards[0]
        with self._lock:  # (the keeper may flush meanwhile)
            if any(other is not shard for other in self._acks):
                return None
            flight = q.send_pop(count, acks=self._acks.get(shard, []), consumer=consumer, view=view)
            if flight is None:
                return None
            pending, self._acks = self._acks, {}
            self._sending[id(pending)] = pending
        return PopInFlight(shard, pending, flight, monotonic())

    def land(self, pop: PopInFlight) -> Popped:
        """The leases of a ``send_pop``, held from now; a failure is raised, its acks waiting again."""
        q = pop.queue

        def landed():
            deliveries, codes = q.landed(pop.flight.result())
            return Popped(deliveries, q, deliveries.due_in), {q: codes}

        leases = self._send(pop.acks, landed)
        if leases and monotonic() - pop.sent > self.options.renew_interval:
            # its reply lay unread past a renewal (a stalled loop): renew first, drop the lapsed
            kept = q.extend([(d.id, d.token) for d in leases], self.options.lease_seconds)
            leases = Popped([d for d, ok in zip(leases, kept) if ok], q, leases.due_in)
        self.hold(q, leases)
        return leases

    def hold(self, q: PriorityQueue, leases: Sequence[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._held[lease.token] = (q, lease.id)

    def drop(self, tag: str) -> tuple[PriorityQueue, str] | None:
        """Stop holding a tag's lease; ``(queue, entry id)``, or None when it holds none."""
        with self._lock:
            return self._held.pop(tag, None)

    def unreturned(self, tag: str, held: tuple[PriorityQueue, str]) -> None:
        """A dropped lease whose give-back did not reach Redis: it expires unless acked first."""
        with self._lock:
            self._unreturned[tag] = held

    def ack(self, tag: str, *, defer: bool) -> None:
        """Ack now, or with ``defer`` (always once closed) with the next round trip; a full batch goes
        at once. An unknown tag is ignored; an ``unreturned`` lease is acked now (nothing renews it)."""
        with self._lock:
            held = self._held.pop(tag, None)
            late = held is None
            if held is None:
                held = self._unreturned.pop(tag, None)
                if held is None:
                    return
            q, eid = held
            defer = not late and (defer or self.closed)
            if defer:
                self._acks.setdefault(q, []).append((eid, tag))
                full = not self.closed and sum(map(len, self._acks.values())) >= C.MAX_POP_BATCH
        if not defer:
            self._ack_all({q: [(eid, tag)]})
        elif full:
            self.flush()

    def flush(self) -> None:
        """Send the acks waiting; an error leaves them waiting."""
        if self._acks:  # (unlocked: an ack added meanwhile waits for the next flush)
            self._ack_all(self._take())

    # -- the keeper's side --------------------------------------------------------------------
    def held(self, *, locked: bool = True) -> dict[PriorityQueue, Pairs]:
        """``{queue: [(entry id, token), ...]}`` of the leases held now, those whose ack is not
        yet sent included (they must not lapse meanwhile). ``locked=False``, for a reader in
        another OS thread that cannot wait on a green lock (``green.NativeWatch`` under eventlet):
        each table copied in one step (a dict copy, atomic under the GIL), the held ones first as
        a lease moves from them to the acks; a lease moving meanwhile may be missed by this look."""
        if locked:
            with self._lock:
                return _pairs(self._held, self._acks, self._sending)
        held, acks, sending = self._held.copy(), self._acks.copy(), self._sending.copy()
        return _pairs(held, acks, sending)

    def release_ended(self, running: set) -> None:
        """A retired book's held leases whose tasks no longer run (``running``: their tags) are
        renewed no more: their deliveries ended unacked (Celery cancels its running tasks at a
        lost connection with ``worker_cancel_long_running_tasks_on_connection_loss``), so each
        expires and is delivered again; an ack that still comes for one is sent (``unreturned``)."""
        with self._lock:
            for tag in [t for t in self._held if t not in running]:
                self._unreturned[tag] = self._held.pop(tag)
                logger.debug("celery-pq: lease %s kept across a lost connection: its task ended; not renewed", tag)

    def holds_work(self) -> bool:
        """Leases or acks not yet sent that the keeper must serve."""
        with self._lock:
            return bool(self._held or self._acks)

    # -- sending ------------------------------------------------------------------------------
    def _ack_all(self, pending: dict[PriorityQueue, Pairs]) -> None:
        if pending:
            self._send(pending, lambda: (None, ack_all(pending)))

    def _take(self) -> dict[PriorityQueue, Pairs]:
        with self._lock:
            pending, self._acks = self._acks, {}
        return pending

    def _send(self, pending: dict[PriorityQueue, Pairs], call: Callable[[], tuple]):
        """``call()``'s result (the round trip carrying ``pending``, perhaps sent already: ``send_pop``),
        ack codes checked; on an error the acks wait again. The one place acks in flight are settled."""
        with self._lock:
            self._sending[id(pending)] = pending
        try:
            result, codes = call()
        except BaseException:
            self._again(pending)
            raise
        finally:
            with self._lock:
                self._sending.pop(id(pending), None)
        self._check(pending, codes)
        return result

    def refused(self, q: PriorityQueue, eid: str, tag: str) -> None:
        """A renewal of ``tag`` was refused: the lease is lost when this book holds it; a tag whose ack
        is under way or was resent is noted for ``_check``; one acked since the renewal is no loss."""
        with self._lock:
            resent = tag in self._resent
            lost = not resent and (
                tag in self._held or any(t == tag for pairs in self._acks.values() for _, t in pairs)
            )
            if not lost and (resent or any(t == tag for b in self._sending.values() for p in b.values() for _, t in p)):
                self._refused.add(tag)
        if lost:
            _lost(q, eid)

    def _again(self, pending: dict[PriorityQueue, Pairs]) -> None:
        """Acks whose round trip failed wait again, in front of the newer ones."""
        with self._lock:
            for q, pairs in pending.items():
                self._acks[q] = pairs + self._acks.get(q, [])
                self._resent.update(tag for _, tag in pairs)

    def _check(self, pending: dict[PriorityQueue, Pairs], codes: dict) -> None:
        """Log the acks of ``pending`` that Redis refused (``codes``: by queue, in order)."""
        for q, pairs in pending.items():
            got = codes.get(q, ())
            if not self._resent and not self._refused and all(code == 1 for code in got):
                continue  # (the common case)
            for (eid, tag), code in zip(pairs, got):
                with self._lock:
                    resent = tag in self._resent
                    self._resent.discard(tag)
                    refused = tag in self._refused
                    self._refused.discard(tag)
                if code == 1:
                    continue
                if code == ErrorCode.NOT_LEASED and resent and refused:
                    _lost(q, eid)  # its renewal was refused while its ack was unconfirmed
                    continue
                if code == ErrorCode.NOT_LEASED and resent and _gone(q, eid):
                    # an ack sent again after the reply to its first sending was lost
                    logger.debug("celery-pq: ack of %s in %r: already done", eid, q.name)
                    continue
                logger.warning("celery-pq: ack of %s in %r came after its lease expired; it may run again", eid, q.name)


def _pairs(held: dict, acks: dict, sending: dict) -> dict[PriorityQueue, Pairs]:
    out: dict[PriorityQueue, Pairs] = {}
    for tag, (q, eid) in held.items():
        out.setdefault(q, []).append((eid, tag))
    for batch in (acks, *sending.values()):
        for q, pairs in batch.items():
            out.setdefault(q, []).extend(pairs)
    return out


def _lost(q: PriorityQueue, eid: str) -> None:
    logger.warning("celery-pq: lease of %s in %r was lost before renewal; it may run again", eid, q.name)


def _gone(q: PriorityQueue, eid: str) -> bool:
    """Whether an entry is no longer in its queue (acked, or removed)."""
    try:
        return not q.exists(eid)
    except rex.RedisError:
        return False
