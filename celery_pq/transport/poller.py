"""How a consumer waits and is woken: each channel's ``Waits`` (BLPOPs on wake lists, pub/sub for fanout) and
each connection's ``Poller``, behind kombu's ``drain_events`` and Celery's event loop. docs/key-layout.md."""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from time import monotonic, sleep
from typing import TYPE_CHECKING, Any

from redis import exceptions as rex
from redis.client import PubSub
from redis.connection import AbstractConnection

from ..queue.values import as_text
from ..storage import constants as C
from ..storage.connections import by_node, is_cluster, node_client, slot_groups
from . import signal_wake

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

logger = logging.getLogger(__name__)

#: Seconds past block_seconds a blocking wait may stay unanswered before its connection counts as dead.
SILENCE_SECONDS = 15


@dataclass
class Wait:
    """A connection to read and its handler; ``once``: a blocking read, re-armed after its answer."""

    conn: Any  # a redis-py connection or a pub/sub's
    handler: Callable[[], int]
    once: bool


@dataclass
class Blocking:
    """One blocking connection and the BLPOP in flight on it (``keys`` None when none is)."""

    conn: AbstractConnection
    id: int | None
    keys: list | None = None
    sent: float = 0.0


@dataclass
class Subscription:
    """One pub/sub connection (per master on a cluster) and its channels."""

    pubsub: PubSub
    channels: set = field(default_factory=set)


class Waits:
    """One channel's blocking reads and pub/sub."""

    def __init__(self, channel):
        self.channel = channel
        self.need_pop = True  # there may be work: pop, don't block
        #: pop script calls; blocking waits answered by a wake token; those that ran out
        self.counters = {"pops": 0, "wakeups": 0, "timeouts": 0}
        self._blocks: dict[object, Blocking] = {}  # slot group -> its blocking read
        self._subs: dict[object, Subscription] = {}  # node client -> its pub/sub
        self._pubsub_waits: tuple | None = None  # the last _arm_pubsub: (channels, [(subscription, wait)])
        #: queue -> monotonic time its next delayed entry is due, as its last pop said: a wait
        #: ends then (``due_at``), for a pop that promotes it (docs/views-and-delays.md)
        self._due: dict[str, float] = {}

    def should_pop(self) -> bool:
        """Whether there may be work (a wake-up, a change, a sweep that returned entries, a
        delayed entry come due)."""
        if self.channel.leases.returned:
            self.channel.leases.returned = False
            self.need_pop = True
        if self._due and min(self._due.values()) <= monotonic():
            now = monotonic()
            self._due = {name: at for name, at in self._due.items() if at > now}
            self.need_pop = True
        return self.need_pop

    def note_due(self, queue: str, due_in: float | None) -> None:
        """A pop of ``queue`` said its next delayed entry is due in ``due_in`` ms (None: none)."""
        if due_in is None:
            self._due.pop(queue, None)
        else:
            self._due[queue] = monotonic() + due_in / 1000

    def due_at(self) -> float | None:
        """The monotonic time the first delayed entry of the consumed queues is due, or None
        (one whose time has passed counts no more: ``should_pop`` pops for it)."""
        if not self._due:
            return None
        now = monotonic()
        return min((at for at in self._due.values() if at > now), default=None)

    def arm(self) -> list[Wait]:
        """Put the blocking reads in flight; the waits to watch."""
        channel = self.channel
        popping = channel.deliveries.popping()
        if popping is not None:  # a pop on the wire (Celery's event loop): its reply is the wait
            return [popping, *self._blocking_waits(), *self._arm_pubsub(channel.active_fanout)]
        channel.leases.flush()  # never block with acks unsent
        silent_since = monotonic() - channel.options.block_seconds - SILENCE_SECONDS
        if any(b.keys is not None and b.sent < silent_since for b in self._blocks.values()):
            self.drop()
            raise rex.ConnectionError("celery-pq: no reply to a blocking wait; the connection is dead")
        if channel.active_queues and channel.qos.can_consume() and not self.should_pop():
            groups = slot_groups(channel.client, channel.wake_keys())
            for group in set(self._blocks) - set(groups):  # no longer consumed
                if self._blocks[group].keys is None:
                    _quietly(self._blocks.pop(group).conn.disconnect)
            for group, keys in groups.items():
                block = self._blocks.get(group)
                if block is None:
                    conn = channel.transport.new_connection(keys[0])
                    conn.connect()
                    block = self._blocks[group] = Blocking(conn, _client_id(conn))
                if block.keys is None:
                    block.conn.send_command("BLPOP", *keys, channel.options.block_seconds)
                    block.keys, block.sent = keys, monotonic()
        return [*self._blocking_waits(), *self._arm_pubsub(channel.active_fanout)]

    def _blocking_waits(self) -> list[Wait]:
        return [Wait(b.conn, partial(self._on_blpop, b), True) for b in self._blocks.values() if b.keys is not None]

    def _arm_pubsub(self, wanted: dict) -> list[Wait]:
        """Subscribe to the fanout channels wanted (sharded per master on a cluster); cached while unchanged."""
        if not wanted and not self._subs:
            return []
        known = self._pubsub_waits
        if known and known[0] == wanted.keys() and all(w.conn is sub.pubsub.connection for sub, w in known[1]):
            return [w for _, w in known[1]]
        self._pubsub_waits = None
        client = self.channel.client
        sharded = is_cluster(client)
        groups = {node: set(names) for node, names in by_node(client, sorted(wanted), lambda n: n).items()}
        for node in set(self._subs) - set(groups):
            _quietly(self._subs.pop(node).pubsub.close)
        made = []
        for node, names in groups.items():
            sub = self._subs.get(node)
            if sub is None:
                sub = self._subs[node] = Subscription(node.pubsub(ignore_subscribe_messages=True))
            if names - sub.channels:  # (the stubs lack the sharded calls)
                (sub.pubsub.ssubscribe if sharded else sub.pubsub.subscribe)(*sorted(names - sub.channels))  # type: ignore[attr-defined]
            if sub.channels - names:
                (sub.pubsub.sunsubscribe if sharded else sub.pubsub.unsubscribe)(*sorted(sub.channels - names))  # type: ignore[attr-defined]
            sub.channels = names
            made.append((sub, Wait(sub.pubsub.connection, partial(self._on_pubsub, sub.pubsub), False)))
        self._pubsub_waits = (set(wanted), made)
        return [w for _, w in made]

    def _on_blpop(self, block: Blocking) -> int:
        try:
            reply = block.conn.read_response()
        except rex.ResponseError as exc:
            moved = isinstance(exc, (rex.AskError, rex.ClusterDownError, rex.TryAgainError))
            if not moved and not str(exc).startswith("UNBLOCKED"):
                self.drop()
                raise
            # a slot moved, or a failover let the blocked clients go: reconnect, look now (the new master next)
            self._drop_block(block)
            self.need_pop = True
            logger.info("celery-pq: blocking wait ended by a failover (%s); waiting again", exc)
            return self.channel.deliveries.pop_and_deliver()
        except Exception:
            self.drop()
            raise
        block.keys = None
        self.need_pop = True  # a wake token, or the timeout: look again either way
        self.counters["wakeups" if reply else "timeouts"] += 1
        if reply and not self.channel.qos.can_consume():
            # the prefetch window filled meanwhile: the token goes back for the next wait
            key, token = reply
            self.channel.client.lpush(key, token)
            return 0
        return self.channel.deliveries.pop_and_deliver()

    def _on_pubsub(self, pubsub) -> int:
        delivered = 0
        while True:
            msg = pubsub.get_message(timeout=0)
            if msg is None:
                if not pubsub.connection or not pubsub.connection.can_read(timeout=0):
                    return delivered
                continue
            if msg.get("type") not in ("message", "smessage"):
                continue
            name = as_text(msg["channel"])
            queue = self.channel.active_fanout.get(name)
            if queue is not None:
                delivered += self.channel.deliveries.fanout(name, queue, msg["data"])

    def unblock(self):
        """End our BLPOPs (the consumed queues changed), so they re-arm at once."""
        for block in self._blocks.values():
            if block.keys is not None and block.id is not None:
                # (refused to an ACL-confined user: the wait ends within block_seconds)
                with suppress(rex.RedisError):
                    node_client(self.channel.client, block.keys[0]).execute_command("CLIENT", "UNBLOCK", block.id)

    def _drop_block(self, block: Blocking):
        _quietly(block.conn.disconnect)
        self._blocks = {g: b for g, b in self._blocks.items() if b is not block}

    def drop(self):
        """Close the blocking connections (made again when needed)."""
        for block in list(self._blocks.values()):
            self._drop_block(block)
        self.need_pop = True

    def close(self):
        self.drop()
        for sub in self._subs.values():
            _quietly(sub.pubsub.close)
        self._subs.clear()
        self._pubsub_waits = None


class Poller:
    """The wait loop of one connection over its channels (``transport.cycle_channels``)."""

    def __init__(self, transport):
        self.transport = transport
        self._loop: Hub | None = None
        self._readers: dict[int, tuple[socket.socket, Wait]] = {}
        self._draining = False
        self._wake_pipe: tuple[int, int] | None = None  # (read, write): the loop wakes itself
        self._idle_wake: Any = None  # a timer that wakes it where signals cannot
        self._loop_thread: int | None = None
        self._due_timer: tuple[float, Any] | None = None  # (when, the hub's timer) for the first due time

    def in_event_loop(self) -> bool:
        """Whether this thread runs the Celery event loop this poller serves."""
        return self._loop is not None and self._loop_thread == threading.get_ident()

    def defers_acks(self) -> bool:
        """Acks may wait for the next pop: one is sure to come soon."""
        return self._draining or self._loop is not None

    def _step(self, *, until_delivered: bool) -> tuple[int, list[Wait]]:
        """One pass, (delivered, waits): each channel pops, else arms; ``until_delivered`` stops at one."""
        delivered = 0
        waits: list[Wait] = []
        for channel in list(self.transport.cycle_channels):
            got = channel.deliveries.pop_and_deliver()
            delivered += got
            if delivered and until_delivered:
                return delivered, []
            if not got:  # (one that delivered pops again next pass)
                waits += channel.waits.arm()
        return delivered, waits

    # -- kombu's drain_events ---------------------------------------------------------------
    def drain(self, timeout=None) -> None:
        """Deliver at least one message, or raise socket.timeout after ``timeout`` seconds."""
        self._draining = True
        deadline = monotonic() + (math.inf if timeout is None else timeout)
        try:
            while True:
                delivered, waits = self._step(until_delivered=True)
                if delivered:
                    return
                remaining = deadline - monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                if not waits:  # prefetch window full: look again shortly
                    sleep(min(0.05, remaining))
                    continue
                ready = [w for w in waits if w.conn.can_read(timeout=0)]
                if not ready:
                    socks = {w.conn._sock: w for w in waits if w.conn._sock is not None}
                    wait = min(remaining, 1.0, self._until_due())
                    readable, _, _ = select.select(list(socks), [], [], wait)
                    ready = [socks[s] for s in readable]
                if sum(w.handler() or 0 for w in ready):
                    return
        finally:
            self._draining = False

    def _due_at(self) -> float | None:
        """The monotonic time the first delayed entry of this connection's queues is due."""
        dues = [t for t in (c.waits.due_at() for c in self.transport.cycle_channels) if t is not None]
        return min(dues) if dues else None

    def _until_due(self) -> float:
        """Seconds until then (0 when passed, inf when nothing is delayed)."""
        at = self._due_at()
        return math.inf if at is None else max(0.0, at - monotonic())

    # -- Celery's event loop ----------------------------------------------------------------
    def register_with_event_loop(self, loop: Hub) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        if self._wake_pipe is None:
            self._wake_pipe = os.pipe()
            for fd in self._wake_pipe:
                os.set_blocking(fd, False)
        loop.add_reader(self._wake_pipe[0], self._on_self_wake, self._wake_pipe[0])
        loop.on_tick.add(self.on_tick)
        if self._idle_wake is not None:
            self._idle_wake.cancel()
            self._idle_wake = None
        if not signal_wake.take(self._wake_pipe[1]):
            # where signals cannot wake the idle loop, a shutdown would wait out its poll
            self._idle_wake = loop.call_repeatedly(C.IDLE_WAKE_SECONDS, lambda: None)  # (the loop wakes for it)

    def _on_self_wake(self, fd: int) -> None:
        with suppress(BlockingIOError):
            os.read(fd, 4096)

    def _self_wake(self) -> None:
        assert self._wake_pipe is not None  # (made with the loop's registration)
        with suppress(BlockingIOError):  # (one is pending already)
            os.write(self._wake_pipe[1], b"x")

    def on_tick(self):
        # The hub runs its deferred acks just before this tick: they ride with the pop. Those a delivery
        # causes come later: _drain_in_tick runs them and pops again, then the loop wakes itself (a pipe).
        loop = self._loop
        assert loop is not None
        delivered, waits = self._step(until_delivered=False)
        if delivered:
            delivered, waits = self._drain_in_tick(delivered, waits)
        for wait in waits:
            sock = wait.conn._sock
            if sock is None:
                continue
            fd = sock.fileno()
            known = self._readers.get(fd)
            if known is None or known[0] is not sock:
                self._readers[fd] = (sock, wait)
                loop.add_reader(fd, self._on_readable, fd)
        if delivered:
            # even with the window full: what it delivered may have missed this tick's other
            # callbacks (the prefork pool writes to its children in its own on_tick)
            self._self_wake()
        self._time_the_due(loop)

    def _time_the_due(self, loop: Hub) -> None:
        """A hub timer at the first due time of a delayed entry (the tick after it pops, and the
        pop promotes it); the loop woken at once so that its next poll counts with the timer (the
        hub computed this pass's poll timeout before the tick)."""
        at = self._due_at()
        if at is None or (self._due_timer is not None and self._due_timer[0] <= at):
            return
        if self._due_timer is not None:
            self._due_timer[1].cancel()
        self._due_timer = (at, loop.call_later(max(0.0, at - monotonic()), self._on_due))
        self._self_wake()

    def _on_due(self) -> None:
        self._due_timer = None  # (the tick that follows pops: should_pop sees the time passed)

    def _drain_in_tick(self, delivered: int, waits: list[Wait]) -> tuple[int, list[Wait]]:
        """Pop on in this tick while each pass delivers (up to TICK_DRAIN_SECONDS, the hub's deferred
        acks run first): a backlog costs no self-wake per message. (delivered in the tick, last waits)."""
        pop_ready = getattr(self._loop, "_pop_ready", None)
        if pop_ready is None:
            return delivered, waits
        deadline = monotonic() + C.TICK_DRAIN_SECONDS
        got = delivered
        while got and monotonic() < deadline:
            for item in pop_ready():
                if item:
                    item()
            got, waits = self._step(until_delivered=False)
            delivered += got
        return delivered, waits

    def _on_readable(self, fd: int) -> None:
        entry = self._readers.get(fd)
        if entry is None:
            return
        sock, wait = entry
        loop = self._loop
        assert loop is not None
        stale = wait.conn._sock is not sock  # reconnected: the next tick registers the new socket
        if stale or wait.once:  # (a blocking read is re-armed on the next tick)
            self._readers.pop(fd, None)
            loop.remove_reader(fd)
        if not stale:
            wait.handler()

    def close(self):
        if self._loop is not None:
            for fd in list(self._readers) + ([self._wake_pipe[0]] if self._wake_pipe else []):
                _quietly(self._loop.remove_reader, fd)
            _quietly(self._loop.on_tick.discard, self.on_tick)
        if self._idle_wake is not None:
            _quietly(self._idle_wake.cancel)
            self._idle_wake = None
        if self._due_timer is not None:
            _quietly(self._due_timer[1].cancel)
            self._due_timer = None
        self._readers.clear()
        self._loop = None
        # a pipe signals still wake stays open: a signal would write to a closed or reused fd
        if self._wake_pipe is not None and signal_wake.give_back(self._wake_pipe[1]):
            for fd in self._wake_pipe:
                os.close(fd)
            self._wake_pipe = None


def _quietly(call, *args) -> None:
    with suppress(Exception):
        call(*args)


def _client_id(conn) -> int | None:
    """The id of a blocking connection, for CLIENT UNBLOCK; None when the user may not run CLIENT."""
    conn.send_command("CLIENT", "ID")
    try:
        return conn.read_response()
    except rex.ResponseError as exc:
        logger.info(
            "celery-pq: CLIENT ID refused (%s); changes to the consumed queues take effect within block_seconds", exc
        )
        return None
