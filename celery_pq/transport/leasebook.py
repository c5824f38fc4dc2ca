"""The lease book of one channel: which leases it holds, which acks wait to be sent.

A delivered message's delivery tag is its lease token. The book keeps ``tag -> (queue, entry
id)`` for every delivered, unacked message (the queue is the shard it came from, for a sharded
queue: acks, rejects and renewals go to that shard), and the acks deferred to the next round trip
(``flush``, or the next pop, which carries them: ``pop``). It is the only object the lease
keeper thread touches (``leases.py``): it renews ``held()``, sends what ``flush`` sends, sweeps
``queues()``; a sweep that returned entries sets ``returned`` for the channel's next look.

An ack whose round trip fails is kept, in front of the newer ones, and sent again with the next
round trip; until then its lease is renewed like any other held lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import NamedTuple

from redis import exceptions as rex

from ..queue import Lease, Popped, PriorityQueue, Queue, ack_all
from ..scripts import Flight
from ..storage import constants as C
from ..storage.errors import ErrorCode

logger = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]  # [(entry id, token), ...]


class PopInFlight(NamedTuple):
    """A pop sent without waiting (``LeaseBook.send_pop``): its queue, the acks it carries, and
    the call on the wire (``scripts.Flight``)."""

    queue: PriorityQueue
    acks: dict[PriorityQueue, Pairs]
    flight: Flight
    sent: float  # (monotonic)

    def overdue(self) -> bool:
        """Whether its reply is later than its connection's timeout allows a waiting call."""
        timeout = self.flight.conn.socket_timeout
        return timeout is not None and monotonic() - self.sent > timeout


class LeaseBook:
    def __init__(self, options):
        #: The channel's options (lease_seconds, renew_interval, sweep_interval).
        self.options = options
        self._lock = threading.Lock()
        self._held: dict[str, tuple[PriorityQueue, str]] = {}  # delivery tag -> (queue, entry id)
        self._acks: dict[PriorityQueue, Pairs] = {}  # acks waiting for the next round trip
        self._waiting = 0  # how many
        # Tags of acks whose round trip failed: sent again, they may find their entry acked by
        # the first sending (its reply was lost). Any other refused ack is late, and says so.
        self._resent: set[str] = set()
        self._queues: tuple[PriorityQueue, ...] = ()  # the consumed queues, swept by the keeper
        # Leases given back in vain (Redis unreachable): not renewed, but an ack that comes for
        # one (its task ran after all) is still sent (``unreturned``).
        self._unreturned: dict[str, tuple[PriorityQueue, str]] = {}
        # The acks of each round trip under way (``_send``, and a pop on the wire until its
        # reply is read: ``send_pop``), by the id of their batch: renewed like the waiting ones,
        # but a renewal refused meanwhile came after the ack, unless that round trip fails: such
        # tags are noted in ``_refused`` (``refused``) until their ack is settled (``_check``).
        self._sending: dict[int, dict[PriorityQueue, Pairs]] = {}
        self._refused: set[str] = set()
        #: Set at the channel's close: acks then wait for the keeper (a lost connection).
        self.closed = False
        #: Set by a sweep that returned entries to the consumed queues: look before blocking.
        self.returned = False

    # -- the channel's side -----------------------------------------------------------------
    def pop(self, q: Queue, count: int, *, consumer: str | None = None, view: tuple[int, int] | None = None) -> Popped:
        """Pop ``q`` (a queue, or a sharded queue) with every ack waiting, in one round trip;
        the leases are held from now, each under the queue (the shard) it came from. (Lean
        ones, ``queue.Delivery``: id, token, deliveries and payload.)"""
        pending = self._take()
        leases = self._send(
            pending, lambda: q.pop_with_acks(count, acks=pending, lean=True, consumer=consumer, view=view)
        )
        self.hold(leases.queue or q.shards[0], leases)
        return leases

    def send_pop(self, q: Queue, count: int, *, consumer: str | None, view) -> PopInFlight | None:
        """``pop`` sent without waiting for its reply (``land`` reads it), with the acks waiting
        for ``q``; None, nothing sent, where only a waiting pop can be made (acks of other queues
        waiting, replicas to wait for, a sharded queue, a cluster, no lean connection)."""
        shard = q.shards[0]
        with self._lock:  # (the acks it carries are those taken: the keeper may flush meanwhile)
            if any(other is not shard for other in self._acks):
                return None
            flight = q.send_pop(count, acks=self._acks.get(shard, []), consumer=consumer, view=view)
            if flight is None:
                return None
            pending, self._acks, self._waiting = self._acks, {}, 0
            self._sending[id(pending)] = pending
        return PopInFlight(shard, pending, flight, monotonic())

    def land(self, pop: PopInFlight) -> Popped:
        """The leases of a pop sent by ``send_pop`` (its reply read now, waiting if need be),
        held from now; a failure leaves its acks waiting, and is raised."""
        q, pending = pop.queue, pop.acks
        try:
            reply = pop.flight.result()
        except BaseException:
            self._again(pending)
            raise
        finally:
            with self._lock:
                self._sending.pop(id(pending), None)
        deliveries, codes = q.landed(reply)
        if pending:
            self._check(pending, {q: codes})
        leases: Popped = Popped(deliveries, q)
        if leases and monotonic() - pop.sent > self.options.renew_interval:
            # its reply lay unread longer than a renewal (a long stall of the loop): renewed
            # before any is delivered, and one whose lease ran out meanwhile is not delivered
            kept = q.extend([(d.id, d.token) for d in leases], self.options.lease_seconds)
            leases = Popped([d for d, ok in zip(leases, kept) if ok], q)
        self.hold(q, leases)
        return leases

    def hold(self, q: PriorityQueue, leases: Sequence[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._held[lease.token] = (q, lease.id)

    def drop(self, tag: str) -> tuple[PriorityQueue, str] | None:
        """Stop holding a tag's lease (it is given back, rejected or dead-lettered now);
        ``(queue, entry id)``, or None when the tag holds no lease."""
        with self._lock:
            return self._held.pop(tag, None)

    def unreturned(self, tag: str, held: tuple[PriorityQueue, str]) -> None:
        """A lease dropped to be given back whose give-back did not reach Redis: it is still
        leased there, and expires unless an ack for it comes first."""
        with self._lock:
            self._unreturned[tag] = held

    def ack(self, tag: str, *, defer: bool) -> None:
        """Ack now, or with ``defer`` (and always once closed) with the next round trip; a
        full batch is sent at once. Fanout messages and no_ack deliveries hold no lease. The
        ack of a lease whose give-back failed is sent now: its task did run (after a lost
        connection, before its pool child reported its start), and its lease, not renewed,
        would expire and deliver it again; no lease keeper may serve this book any more."""
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
                self._waiting += 1
                full = not self.closed and self._waiting >= C.MAX_POP_BATCH
        if not defer:
            pending = {q: [(eid, tag)]}
            self._send(pending, lambda: (None, ack_all(pending)))
        elif full:
            self.flush()

    def holding(self, tags) -> int:
        """How many of ``tags`` hold a lease here."""
        with self._lock:
            return sum(1 for tag in tags if tag in self._held)

    def flush(self) -> None:
        """Send the acks waiting for the next round trip (before blocking, on the keeper's
        timer, at close); an error leaves them waiting."""
        if not self._acks:  # (a look without the lock: an ack added meanwhile waits for the next flush)
            return
        pending = self._take()
        if pending:
            self._send(pending, lambda: (None, ack_all(pending)))

    def watch(self, queues: Sequence[PriorityQueue]) -> None:
        """The queues consumed now (the keeper sweeps their expired leases)."""
        self._queues = tuple(dict.fromkeys(queues))

    # -- the keeper's side --------------------------------------------------------------------
    def held(self) -> dict[PriorityQueue, Pairs]:
        """``{queue: [(entry id, token), ...]}`` of the leases held now, acked ones whose ack
        waits for the next round trip included (they must not lapse meanwhile)."""
        out: dict[PriorityQueue, Pairs] = {}
        with self._lock:
            for tag, (q, eid) in self._held.items():
                out.setdefault(q, []).append((eid, tag))
            for q, pairs in self._acks.items():
                out.setdefault(q, []).extend(pairs)
            for sending in self._sending.values():
                for q, pairs in sending.items():
                    out.setdefault(q, []).extend(pairs)
        return out

    def queues(self) -> tuple[PriorityQueue, ...]:
        return self._queues

    def holds_work(self) -> bool:
        """Leases or acks not yet sent that the keeper must serve."""
        with self._lock:
            return bool(self._held or self._acks)

    # -- sending ------------------------------------------------------------------------------
    def _take(self) -> dict[PriorityQueue, Pairs]:
        with self._lock:
            pending, self._acks, self._waiting = self._acks, {}, 0
        return pending

    def _send(self, pending: dict[PriorityQueue, Pairs], call: Callable[[], tuple]):
        """Run ``call`` (one round trip carrying ``pending``): its result, after checking the
        ack codes; on an error the acks wait again and the error is raised."""
        if pending:
            with self._lock:
                self._sending[id(pending)] = pending
        try:
            result, codes = call()
        except BaseException:
            self._again(pending)
            raise
        finally:
            if pending:
                with self._lock:
                    self._sending.pop(id(pending), None)
        self._check(pending, codes)
        return result

    def refused(self, tag: str) -> bool:
        """A renewal of ``tag`` was refused (its lease is gone): whether this book keeps it (its
        lease is lost: the keeper says so). A tag whose ack is under way or was sent before is
        noted instead: if its ack then finds its entry gone after a failed round trip, the lease
        was lost before that ack, and ``_check`` says so."""
        with self._lock:
            resent = tag in self._resent
            if not resent and (tag in self._held or any(t == tag for pairs in self._acks.values() for _, t in pairs)):
                return True
            if resent or any(t == tag for batch in self._sending.values() for p in batch.values() for _, t in p):
                self._refused.add(tag)
        return False

    def _again(self, pending: dict[PriorityQueue, Pairs]) -> None:
        """Acks whose round trip failed wait again, in front of the newer ones."""
        with self._lock:
            for q, pairs in pending.items():
                self._acks[q] = pairs + self._acks.get(q, [])
                self._waiting += len(pairs)
                self._resent.update(tag for _, tag in pairs)

    def _check(self, pending: dict[PriorityQueue, Pairs], codes: dict) -> None:
        """Log the acks of ``pending`` that Redis refused (``codes``: by queue, in order)."""
        for q, pairs in pending.items():
            got = codes.get(q, ())
            if not self._resent and not self._refused and all(code == 1 for code in got):
                continue  # (most round trips: every ack done, none of them sent before)
            for (eid, tag), code in zip(pairs, got):
                with self._lock:
                    resent = tag in self._resent
                    self._resent.discard(tag)
                    refused = tag in self._refused
                    self._refused.discard(tag)
                if code == 1:
                    continue
                if code == ErrorCode.NOT_LEASED and resent and refused:
                    # its renewal was refused while its ack was unconfirmed: the lease was lost
                    logger.warning(
                        "celery-pq: lease of %s in %r was lost before renewal; it may run again", eid, q.name
                    )
                    continue
                if code == ErrorCode.NOT_LEASED and resent and _gone(q, eid):
                    # an ack sent again after the reply to its first sending was lost
                    logger.debug("celery-pq: ack of %s in %r: already done", eid, q.name)
                    continue
                logger.warning("celery-pq: ack of %s in %r came after its lease expired; it may run again", eid, q.name)


def _gone(q: PriorityQueue, eid: str) -> bool:
    """Whether an entry is no longer in its queue (acked, or removed)."""
    try:
        return not q.exists(eid)
    except rex.RedisError:
        return False
