"""What a channel receives and how each delivery ends: ``Deliveries`` pops within kombu's prefetch window and
hands each lease to kombu (its tag: the lease token); ``QoS`` sends acks and rejects here. docs/leases.md."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from contextlib import suppress
from time import monotonic, time
from typing import Any, Protocol

from kombu.transport import virtual
from redis.exceptions import ResponseError

from ..queue import Consumer, Delivery
from ..storage import constants as C
from ..storage.codec import decode
from .green import green_runtime
from .leasebook import PopInFlight
from .messages import BROADCAST_ID, DELIVERED_ENTRY
from .poller import Wait


class ReceivingChannel(Protocol):
    """What the receiving side uses of its channel (channel.py's ``Channel``)."""

    @property
    def qos(self) -> Any: ...
    @property
    def active_queues(self) -> list: ...

    connection: Any
    transport: Any
    leases: Any
    deliveries: Any
    waits: Any
    views: Any
    consumer_id: str
    closed: bool

    def queue(self, name: str) -> Consumer: ...


logger = logging.getLogger(__name__)


class Unreadable(Exception):
    """kombu could not build a delivered message (its body does not decode)."""


class Message(virtual.Message):
    def __init__(self, payload, channel=None, **kwargs):
        try:
            super().__init__(payload, channel=channel, **kwargs)
        except Exception as exc:
            raise Unreadable(f"{exc!r}") from exc


class QoS(virtual.QoS):
    """Prefetch accounting of kombu, with acks and rejects going to the lease scripts."""

    channel: ReceivingChannel

    def ack(self, delivery_tag):
        deliveries = self.channel.deliveries
        deliveries.ack(delivery_tag)
        super().ack(delivery_tag)
        deliveries.pop_ahead()

    def reject(self, delivery_tag, requeue=False):
        self.channel.deliveries.reject(delivery_tag, requeue)
        self._quick_ack(delivery_tag)

    def restore_unacked(self):
        """Give back every delivered, unacked message; after a lost connection, a task running here
        keeps its lease (renewed, acked when it ends: ``Transport._collect``), or it would start again."""
        self._flush()
        channel = self.channel
        keep = running_tags() if channel.transport.connection_lost else set()
        forgotten = running_tags(forgotten_too=True) - keep if channel.transport.connection_lost else set()
        if forgotten & self._delivered.keys():
            logger.warning(
                "celery-pq: %d running task(s) given back at the lost connection: Celery before 5.6.3 "
                "forgets the tasks its prefork pool runs then (never acked), so they run again",
                len(forgotten & self._delivered.keys()),
            )
        errors = []
        lost_link = kept = 0
        while self._delivered:
            tag, message = self._delivered.popitem()
            if tag in keep:
                kept += 1
                continue
            try:
                channel.deliveries.give_back(tag)
            except channel.transport.connection_errors:
                lost_link += 1  # still leased in Redis: it comes back when the lease expires
            except Exception as exc:
                errors.append((exc, message))
        if lost_link:
            _not_given_back(lost_link, "unacked")
        if kept:
            logger.info("celery-pq: %d running task(s) keep their leases across the lost connection", kept)
        return errors


class Deliveries:
    """A channel's receiving side: pop, deliver, and end each delivery (ack, reject, give back)."""

    def __init__(self, channel: ReceivingChannel):
        self.channel = channel
        self.leases = channel.leases
        self.no_ack: set[str] = set()  # queues consumed with no_ack: acked as handed over
        self._rotation = 0
        self._pop: tuple[PopInFlight, str] | None = None  # the pop on the wire, its queue name
        #: The last message ran in this thread, not in a pool (None before the first delivery).
        self._inline: bool | None = None
        #: The tags of the batch being delivered not handed over yet, last first (empty between batches).
        self._rest: list[str] = []
        #: Broadcast ids received lately, oldest first (one sent again is dropped).
        self._broadcasts: dict[str, None] = {}

    # -- popping and delivering -----------------------------------------------------------------
    def pop_and_deliver(self, *, send_only: bool = False, wait: bool = False) -> int:
        """Lease and deliver what the prefetch window allows (waiting acks ride along); the number delivered.
        Unless ``wait``, where ``_sends`` the pop is sent (``land`` delivers its reply); ``send_only``: only that."""
        if self._pop is not None:  # a pop on the wire: its reply delivers
            pop = self._pop[0]
            timeout = pop.flight.conn.socket_timeout
            if timeout is not None and monotonic() - pop.sent > timeout:  # a silent connection: land raises
                pop.flight.give_up()
            if self._inline:  # (sent at a solo pool's late ack) nothing runs meanwhile: wait for it here
                pop.flight.wait()
            return self.land() if pop.flight.ready() else 0
        channel = self.channel
        queues = channel.active_queues
        if not queues or not channel.waits.should_pop() or not channel.qos.can_consume():
            if not send_only:
                self.leases.flush()
            return 0
        want = max(1, min(channel.qos.can_consume_max_estimate() or C.MAX_POP_BATCH, C.MAX_POP_BATCH))
        n = len(queues)
        start = self._rotation % n
        delivered = 0
        sends = not wait and (send_only or self._sends())
        for i in range(n):
            name = queues[(start + i) % n]
            q = channel.queue(name)
            channel.waits.counters["pops"] += 1
            view = channel.views.range_of(name)
            if sends:
                sent = self.leases.send_pop(q, want, consumer=channel.consumer_id, view=view)
                if sent is not None:
                    self._pop = (sent, name)
                    return 0
                if send_only:
                    return 0
            leases = self.leases.pop(q, want, consumer=channel.consumer_id, view=view)
            channel.waits.note_due(name, leases.due_in)
            if not leases:
                continue
            self._rotation = start + i + 1
            delivered = self._deliver_batch(name, leases)
            break
        if not delivered:
            channel.waits.need_pop = False
        return delivered

    def _sends(self, *, at_ack: bool = False) -> bool:
        """Whether a pop goes without waiting for its reply: in Celery's event loop, one queue, last task
        not inline; ``at_ack``, inline too when the ack ended the batch's last task (a solo pool's late
        ack: the rest of Celery's work on it overlaps the round trip; an early ack comes before the task)."""
        channel = self.channel
        if len(channel.active_queues) != 1 or not channel.transport.poller.in_event_loop():
            return False
        return self._inline is False or (at_ack and self._inline is True and not self._rest and nothing_running())

    def pop_ahead(self) -> None:
        """After an ack, where ``_sends``: the next pop, carrying the ack, sent now."""
        if self._pop is None and self._sends(at_ack=True):
            self.pop_and_deliver(send_only=True)

    def popping(self) -> Wait | None:
        """The wait for the reply of the pop on the wire (its connection readable), or None."""
        return None if self._pop is None else Wait(self._pop[0].flight.conn, self.pop_and_deliver, True)

    def land(self, *, deliver: bool = True) -> int:
        """Deliver (or with ``deliver`` false give back) what the pop on the wire took; the number
        delivered. A script's error falls to a waiting pop; a connection error is raised (its acks wait again)."""
        assert self._pop is not None
        (pop, name), self._pop = self._pop, None
        channel = self.channel
        try:
            leases = self.leases.land(pop)
        except ResponseError:
            return self.pop_and_deliver(wait=True) if deliver else 0
        channel.waits.note_due(name, leases.due_in)
        if not leases:
            channel.waits.need_pop = False
            return 0
        if not deliver or channel.closed or name not in channel.active_queues:
            self.give_back_all([lease.token for lease in leases])
            return 0
        return self._deliver_batch(name, leases)

    def settle(self) -> None:
        """At the channel's close: the pop on the wire read, and what it took given back."""
        if self._pop is not None:
            with suppress(Exception):  # its leases, if any, expire
                self.land(deliver=False)

    def get(self, queue: str) -> dict:
        """kombu's basic_get: lease one message now, or raise Empty."""
        channel = self.channel
        channel.transport.ensure_keeper()
        view = channel.views.range_of(queue)
        leases = self.leases.pop(channel.queue(queue), 1, consumer=channel.consumer_id, view=view)
        msg = self._to_message(leases[0], queue, int(time() * 1000)) if leases else None
        if msg is None:
            raise virtual.Empty()
        return msg

    def _deliver_batch(self, name: str, leases: Sequence[Delivery]) -> int:
        """Deliver a popped batch (all held in the lease book first: renewed while a solo pool runs
        each task); the number delivered. The rest is given back uncounted or dead-lettered."""
        channel = self.channel
        rest = self._rest = [lease.token for lease in reversed(leases)]  # not delivered yet, last first
        delivered = 0
        now_ms = int(time() * 1000)
        try:
            for lease in leases:
                if channel.closed or worker_stopping():  # a task of this batch began a shutdown
                    break
                rest.pop()
                message = self._to_message(lease, name, now_ms)
                if message is None:
                    continue
                try:
                    if name in self.no_ack:
                        self.ack(lease.token)
                    before = celery_counts()
                    channel.connection._deliver(message, name)
                    after = celery_counts()
                    # handed to a pool that runs it elsewhere: one more reserved, none started (solo runs it inline)
                    self._inline = not (before and after and after[0] == before[0] and after[1] > before[1])
                except Unreadable as exc:
                    self._dead_letter_malformed(lease.token, exc.__cause__)
                    continue
                delivered += 1
        finally:
            self._rest = []
            if rest:  # a shutdown began, or the callback raised: the others wait again
                self.give_back_all(rest)
        return delivered

    def _to_message(self, lease: Delivery, queue: str, now_ms: int) -> dict | None:
        """The kombu message of a lease, or None (dead-lettered as ``malformed``). Its
        delivery_info also carries ``DELIVERED_ENTRY``: ``(queue, the entry's stored header,
        Unix ms of the delivery)``, which ``celery_pq.ops.otel`` reads (docs/operations.md)."""
        try:
            message = decode(lease.payload, raw_body=True)
            props = message["properties"]
            info = props.setdefault("delivery_info", {})
            headers = message.get("headers")
            if not isinstance(info, dict) or not isinstance(headers, (dict, type(None))):
                raise TypeError("its delivery_info or headers are not mappings")
        except Exception as exc:
            self._dead_letter_malformed(lease.token, exc)
            return None
        # a redelivery carries the deliveries before it as the header x-delivery-count (as RabbitMQ's quorum queues)
        props["delivery_tag"] = lease.token
        info["delivery_count"] = lease.deliveries
        info["redelivered"] = lease.deliveries > 1
        info[DELIVERED_ENTRY] = (queue, lease.head, now_ms)
        if lease.deliveries > 1:
            message["redelivered"] = True
            if headers is not None:
                headers["x-delivery-count"] = lease.deliveries - 1
        return message

    def _dead_letter_malformed(self, tag: str, exc: BaseException | None) -> None:
        held = self.leases.drop(tag)
        if held is None:
            return
        shard, eid = held
        where = "left there" if shard.is_dead else f"moved to {shard.name}.dead"
        logger.error("celery-pq: entry %r of queue %r is not a kombu message (%r); %s", eid, shard.name, exc, where)
        if not shard.is_dead:  # a dead-letter queue has none: the lease expires, it stays
            shard.dead_letter((eid, tag), "malformed")

    def fanout(self, channel_name: str, queue: str, data: Any) -> int:
        """Deliver a message received on a fanout exchange's pub/sub channel (it holds no lease)."""
        try:
            message = decode(data)
        except Exception:
            logger.warning("celery-pq: unreadable fanout message on %r dropped", channel_name)
            return 0
        props = message.get("properties")
        sent = props.pop(BROADCAST_ID, None) if isinstance(props, dict) else None
        if sent is not None:  # kombu's retry of one publish call after a lost reply
            if sent in self._broadcasts:
                return 0
            self._broadcasts[sent] = None
            if len(self._broadcasts) > C.BROADCASTS_REMEMBERED:
                del self._broadcasts[next(iter(self._broadcasts))]
        self.channel.connection._deliver(message, queue)
        return 1

    # -- acks, rejects, give-backs ----------------------------------------------------------------
    def ack(self, tag: str) -> None:
        """Ack now, or with the next pop while draining or in Celery's event loop (lost: a redelivery)."""
        self.leases.ack(tag, defer=self.channel.transport.poller.defers_acks())

    def reject(self, tag: str, requeue: bool) -> None:
        held = self.leases.drop(tag)
        if held is None:
            return
        q, eid = held
        result = q.requeue((eid, tag)) if requeue else q.dead_letter((eid, tag), "rejected")
        if result is None:
            logger.warning("celery-pq: reject of %s in %r came after its lease expired", eid, q.name)
        self.channel.waits.need_pop = True

    def give_back(self, tag: str) -> None:
        held = self.leases.drop(tag)
        if held is not None:
            q, eid = held
            try:
                q.requeue((eid, tag), count_delivery=False)
            except self.channel.transport.connection_errors:
                # It comes back when the lease expires; but its task may have started unreported
                # (a pool child), so an ack that comes for it is still sent (LeaseBook.unreturned).
                self.leases.unreturned(tag, held)
                raise

    def give_back_all(self, tags: Sequence[str]) -> None:
        try:
            for tag in tags:
                self.give_back(tag)
        except self.channel.transport.connection_errors:
            _not_given_back(len(tags), "undelivered")


def _not_given_back(n: int, what: str) -> None:
    logger.warning(
        "celery-pq: could not give back %d %s message(s) (Redis unreachable); "
        "their leases expire and they are delivered again",
        n,
        what,
    )


def running_tags(*, forgotten_too: bool = False) -> set:
    """Tags of the messages whose tasks a Celery worker in this process runs, not acked yet, and
    whose end this process will hear of. Before Celery 5.6.3 a lost connection makes the prefork
    pool forget the jobs it runs (``Consumer.on_close`` -> ``AsynPool.flush``: ``self._cache.clear()``):
    their results find no job, so neither their acks nor their ends come; those are left out
    (unless ``forgotten_too``)."""
    state = sys.modules.get("celery.worker.state")  # (a Celery worker runs in this process)
    if state is None:
        return set()
    running = [r for r in list(state.active_requests) if not getattr(r, "acknowledged", True)]
    if not forgotten_too and _pool_forgets_running_jobs() and green_runtime() is None:
        # (a green pool's worker_pid is a greenlet's id: its tasks run in this process)
        running = [r for r in running if getattr(r, "worker_pid", None) in (None, os.getpid())]
    return {r.message.delivery_tag for r in running if getattr(r, "message", None) is not None}


def _pool_forgets_running_jobs() -> bool:
    celery = sys.modules.get("celery")
    return tuple(getattr(celery, "VERSION", (5, 6, 3))[:3]) < (5, 6, 3)


def celery_counts() -> tuple[int, int] | None:
    """``(tasks started, requests reserved)`` of a Celery worker in this process, or None."""
    state = sys.modules.get("celery.worker.state")
    started = getattr(state, "all_total_count", None)
    reserved = getattr(state, "reserved_requests", None)
    return None if started is None or reserved is None else (started[0], len(reserved))


def nothing_running() -> bool:
    """No task of a Celery worker in this process is under way (none without one)."""
    state = sys.modules.get("celery.worker.state")
    return not getattr(state, "active_requests", ())


def worker_stopping() -> bool:
    """True while a Celery worker in this process is shutting down."""
    state = sys.modules.get("celery.worker.state")
    return bool(state is not None and (state.should_stop is not None or state.should_terminate is not None))
