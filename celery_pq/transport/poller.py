"""How a consumer waits and is woken: every socket it reads from, and the one wait loop.

Each channel has a ``Waits``: a blocking connection of its own (BLPOP on the wake lists of the
queues it consumes: an insert leaves a wake token there) and a pub/sub connection for fanout
exchanges. A channel pops while there may be work (``need_pop``); when a pop finds nothing it
blocks on its wake lists instead, so an idle consumer costs one call per ``block_seconds``.

On a Redis Cluster one BLPOP cannot name keys of two slots, so a channel blocks once per hash
tag of the queues it consumes, each on a connection to the master serving that tag, all at once:
whichever is answered first wakes the channel, which then pops every queue. Fanout goes by
sharded pub/sub there (SPUBLISH, SSUBSCRIBE on the master serving each channel's slot), one
pub/sub connection per master.

The ``Poller`` of a connection runs the loop over its channels, in one of two ways:
``drain`` (kombu's ``drain_events``: select on the sockets) or ``on_tick`` (Celery's event
loop: the sockets are the loop's readers). Both take the same steps: each channel pops and
delivers what its prefetch window allows; if nothing came, each arms its waits and the loop
waits for a socket.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from time import monotonic, sleep
from typing import TYPE_CHECKING, Any, Protocol

from redis import exceptions as rex
from redis.connection import AbstractConnection

from ..storage import constants as C
from ..storage.connections import by_node, is_cluster, node_client, slot_groups
from . import signal_wake

if TYPE_CHECKING:
    from kombu.asynchronous import Hub
    from redis.connection import Connection

logger = logging.getLogger(__name__)

#: Seconds past block_seconds that a blocking wait may stay unanswered before its connection
#: counts as dead (the server answers a BLPOP within block_seconds).
SILENCE_SECONDS = 15


@dataclass
class Wait:
    """A connection to read from and what to do when it is readable; ``once``: a blocking read
    that is sent again (re-armed) after its answer."""

    conn: Any  # a redis-py connection (``AbstractConnection``) or a pub/sub's one
    handler: Callable[[], int]
    once: bool


@dataclass
class Blocking:
    """One blocking connection and the BLPOP in flight on it (``keys`` None when none is)."""

    conn: AbstractConnection
    id: int | None
    keys: list | None = None
    sent: float = 0.0


class PubSub(Protocol):
    """What a subscription uses of redis-py's ``PubSub`` (its sharded calls included, which
    the type stubs lack)."""

    connection: Connection | None

    def subscribe(self, *channels: str) -> None: ...
    def unsubscribe(self, *channels: str) -> None: ...
    def ssubscribe(self, *channels: str) -> None: ...
    def sunsubscribe(self, *channels: str) -> None: ...
    def get_message(self, ignore_subscribe_messages: bool = False, timeout: float = 0.0) -> dict | None: ...
    def close(self) -> None: ...


@dataclass
class Subscription:
    """One pub/sub connection (per master on a cluster) and its channels."""

    pubsub: PubSub
    channels: set = field(default_factory=set)


class Waits:
    """One channel's blocking reads (one per hash tag on a cluster, else one) and pub/sub.

    The channel gives: ``active_queues``, ``qos``, ``wake_keys()``, ``fanout_channels()``
    ({pub/sub channel: queue}), ``pop_and_deliver()``, ``deliver_fanout(queue, data)``,
    ``leases`` (its lease book), ``client``, ``options`` and ``transport``.
    """

    def __init__(self, channel):
        self.channel = channel
        #: Pop when there may be work; otherwise block on the wake lists.
        self.need_pop = True
        #: Redis calls made to receive: "pops" (pop scripts), "wakeups" (blocking waits
        #: answered by a wake token), "timeouts" (blocking waits that ran out).
        self.counters = {"pops": 0, "wakeups": 0, "timeouts": 0}
        self._blocks: dict[object, Blocking] = {}  # slot group -> its blocking read
        self._subs: dict[object, Subscription] = {}  # node client -> its pub/sub
        self._pubsub_waits: tuple | None = None  # (channels, [(subscription, wait)]) of the last _arm_pubsub

    def should_pop(self) -> bool:
        """Whether there may be work (a wake-up, a change, a sweep that returned entries)."""
        if self.channel.leases.returned:
            self.channel.leases.returned = False
            self.need_pop = True
        return self.need_pop

    def arm(self) -> list[Wait]:
        """Make sure the blocking reads are in flight; the waits to watch."""
        channel = self.channel
        popping = channel.deliveries.popping()
        if popping is not None:  # a pop on the wire (Celery's event loop): its reply is the wait
            return [popping, *self._blocking_waits(), *self._arm_pubsub(channel.fanout_channels())]
        channel.leases.flush()  # never block with acks unsent
        waits = []
        for pending in self._blocks.values():
            if (
                pending.keys is not None
                and monotonic() - pending.sent > channel.options.block_seconds + SILENCE_SECONDS
            ):
                self.drop()
                raise rex.ConnectionError("celery-pq: no reply to a blocking wait; the connection is dead")
        if channel.active_queues and channel.qos.can_consume() and not self.should_pop():
            groups = slot_groups(channel.client, channel.wake_keys())
            for group in set(self._blocks) - set(groups):  # queues no longer consumed
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
        waits += self._blocking_waits()
        waits += self._arm_pubsub(channel.fanout_channels())
        return waits

    def _blocking_waits(self) -> list[Wait]:
        """The waits of the blocking reads in flight."""
        return [Wait(b.conn, partial(self._on_blpop, b), True) for b in self._blocks.values() if b.keys is not None]

    def _arm_pubsub(self, wanted: dict) -> list[Wait]:
        """Subscribe to the fanout channels wanted (sharded, per master, on a cluster). The waits
        of the last call are given again while the channels wanted are the same and every
        subscription still has its connection (most calls: nothing changed)."""
        if not wanted and not self._subs:
            return []
        known = self._pubsub_waits
        if (
            known is not None
            and known[0] == wanted.keys()
            and all(w.conn is sub.pubsub.connection for sub, w in known[1])
        ):
            return [w for _, w in known[1]]
        self._pubsub_waits = None
        client = self.channel.client
        sharded = is_cluster(client)
        groups = {node: set(names) for node, names in by_node(client, sorted(wanted), lambda n: n).items()}
        for node in set(self._subs) - set(groups):
            _quietly(self._subs.pop(node).pubsub.close)
        made = []  # (subscription, its wait)
        for node, names in groups.items():
            sub = self._subs.get(node)
            if sub is None:
                sub = self._subs[node] = Subscription(node.pubsub(ignore_subscribe_messages=True))
            if names - sub.channels:
                (sub.pubsub.ssubscribe if sharded else sub.pubsub.subscribe)(*sorted(names - sub.channels))
            if sub.channels - names:
                (sub.pubsub.sunsubscribe if sharded else sub.pubsub.unsubscribe)(*sorted(sub.channels - names))
            sub.channels = names
            made.append((sub, Wait(sub.pubsub.connection, partial(self._on_pubsub, sub.pubsub), False)))
        self._pubsub_waits = (set(wanted), made)
        return [w for _, w in made]

    def _on_blpop(self, block: Blocking) -> int:
        try:
            reply = block.conn.read_response()
        except (rex.AskError, rex.ClusterDownError, rex.TryAgainError) as exc:
            # A cluster slot moved (a failover): look at once; the next wait goes to its new master
            self._drop_block(block)
            self.need_pop = True
            logger.info("celery-pq: blocking wait ended by the cluster (%s); waiting again", exc)
            return self.channel.pop_and_deliver()
        except rex.ResponseError as exc:
            if not str(exc).startswith("UNBLOCKED"):
                self.drop()
                raise
            # The server stopped being the master (a failover demoted it): its blocked clients
            # are let go. Connect again (to the master the sentinels name now) and look.
            self._drop_block(block)
            self.need_pop = True
            return self.channel.pop_and_deliver()
        except Exception:
            self.drop()
            raise
        block.keys = None
        self.need_pop = True  # a wake token, or the timeout: look again either way
        self.counters["wakeups" if reply else "timeouts"] += 1
        if reply and not self.channel.qos.can_consume():
            # The prefetch window filled while we were blocked: leave the token for the next
            # wait (ours or another consumer's), or the work would sit until block_seconds.
            key, token = reply
            self.channel.client.lpush(key, token)
            return 0
        return self.channel.pop_and_deliver()

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
            name = msg["channel"].decode() if isinstance(msg["channel"], bytes) else msg["channel"]
            queue = self.channel.fanout_channels().get(name)
            if queue is not None:
                delivered += self.channel.deliver_fanout(name, queue, msg["data"])

    def unblock(self):
        """Wake our own BLPOPs (the consumed queues changed), so they re-arm at once."""
        for block in self._blocks.values():
            if block.keys is not None and block.id is not None:
                try:
                    node_client(self.channel.client, block.keys[0]).execute_command("CLIENT", "UNBLOCK", block.id)
                except rex.RedisError:
                    pass  # not allowed (an ACL-confined user): the wait ends within block_seconds

    def _drop_block(self, block: Blocking):
        _quietly(block.conn.disconnect)
        self._blocks = {g: b for g, b in self._blocks.items() if b is not block}

    def drop(self):
        """Close the blocking connections (they are made again when needed)."""
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
        self._readers: dict[int, tuple[socket.socket, Wait]] = {}  # fd -> (socket, Wait)
        self._draining = False
        self._wake_pipe: tuple[int, int] | None = None  # (read end, write end): the loop wakes itself
        self._idle_wake: Any = None  # the loop's timer that wakes it where signals cannot
        self._loop_thread: int | None = None

    def in_event_loop(self) -> bool:
        """Whether this thread runs the Celery event loop this poller is registered with."""
        return self._loop is not None and self._loop_thread == threading.get_ident()

    def defers_acks(self) -> bool:
        """Acks can wait for the next pop while something here is sure to pop again soon."""
        return self._draining or self._loop is not None

    def _step(self, *, until_delivered: bool) -> tuple[int, list[Wait]]:
        """One pass of the loop: each channel pops and delivers what its prefetch window
        allows, then arms its waits; ``until_delivered`` ends the pass at the first delivery.
        (delivered, waits)."""
        delivered = 0
        waits: list[Wait] = []
        for channel in list(self.transport.cycle_channels):
            got = channel.pop_and_deliver()
            delivered += got
            if delivered and until_delivered:
                return delivered, []
            if not got:  # (a channel that delivered pops again on the next pass: nothing to arm)
                waits += channel.waits.arm()
        return delivered, waits

    # -- kombu's drain_events ---------------------------------------------------------------
    def drain(self, timeout=None) -> None:
        """Deliver at least one message, or raise socket.timeout after ``timeout`` seconds."""
        self._draining = True
        try:
            self._drain(timeout)
        finally:
            self._draining = False

    def _drain(self, timeout):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            delivered, waits = self._step(until_delivered=True)
            if delivered:
                return
            remaining = None if deadline is None else deadline - monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError()
            if not waits:  # nothing to block on (prefetch window full): look again shortly
                sleep(min(0.05, remaining) if remaining is not None else 0.05)
                continue
            ready = [w for w in waits if w.conn.can_read(timeout=0)]
            if not ready:
                socks = {w.conn._sock: w for w in waits if w.conn._sock is not None}
                wait = 1.0 if remaining is None else min(remaining, 1.0)
                readable, _, _ = select.select(list(socks), [], [], wait)
                ready = [socks[s] for s in readable]
            if sum(w.handler() or 0 for w in ready):
                return

    # -- Celery's event loop ----------------------------------------------------------------
    def register_with_event_loop(self, loop: Hub) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        if self._wake_pipe is None:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._wake_pipe = (r, w)
        loop.add_reader(self._wake_pipe[0], self._on_self_wake, self._wake_pipe[0])
        loop.on_tick.add(self.on_tick)
        if self._idle_wake is not None:
            self._idle_wake.cancel()
            self._idle_wake = None
        if not signal_wake.take(self._wake_pipe[1]):
            # An idle loop sleeps in its poll until a timer or a socket is due (up to
            # block_seconds, or ten seconds), and a shutdown asked for meanwhile waits for it:
            # where signals cannot wake the loop, it wakes itself every IDLE_WAKE_SECONDS.
            self._idle_wake = loop.call_repeatedly(C.IDLE_WAKE_SECONDS, _nothing)

    def _on_self_wake(self, fd: int) -> None:
        try:
            os.read(fd, 4096)
        except BlockingIOError:
            pass

    def _self_wake(self) -> None:
        assert self._wake_pipe is not None  # (made with the loop's registration)
        try:
            os.write(self._wake_pipe[1], b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def on_tick(self):
        # Celery's hub runs the acks it deferred (call_soon) at the top of each loop pass, just
        # before this tick: the prefetch window is up to date, and those acks ride along with
        # the pop. After a delivery the acks it causes arrive as call_soon callbacks: the tick
        # runs them itself and pops again (_drain_in_tick), and once its time is up, or where
        # the hub cannot be asked, the loop wakes itself (a pipe) so the next pass comes at
        # once, not after a timer. A backlog costs one round trip per pop, never a wait in Redis.
        loop = self._loop
        assert loop is not None  # (on_tick is called by the loop it was registered with)
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
            # Even when the tick's last pass found the prefetch window full: what it delivered
            # may have missed this tick's other callbacks (the prefork pool schedules its writes
            # to the children in its own on_tick), and must not wait for the next timer.
            self._self_wake()

    def _drain_in_tick(self, delivered: int, waits: list[Wait]) -> tuple[int, list[Wait]]:
        """Go on popping within this tick while each pass delivers, for up to TICK_DRAIN_SECONDS:
        the hub's ready callbacks (the acks the deliveries deferred with call_soon) run first, as
        the hub's next pass would run them, so a backlog costs no self-wake, poll and pipe read
        per message. What the loop waits for besides (timers, other sockets) waits at most that
        long, as behind a task of that length in the solo pool. A hub without ``_pop_ready``
        (older kombu) leaves it to the self-wake. ``delivered``: by the tick's first pass.
        Returns (delivered in the whole tick, the last pass's waits)."""
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
        assert loop is not None  # (readers are registered with the loop, and cleared without it)
        if wait.conn._sock is not sock:  # reconnected: the next tick registers the new socket
            self._readers.pop(fd, None)
            loop.remove_reader(fd)
            return
        if wait.once:  # a blocking read that has been answered is re-armed on the next tick
            self._readers.pop(fd, None)
            loop.remove_reader(fd)
        wait.handler()

    def close(self):
        if self._loop is not None:
            fds = list(self._readers) + ([self._wake_pipe[0]] if self._wake_pipe else [])
            for fd in fds:
                _quietly(self._loop.remove_reader, fd)
            _quietly(self._loop.on_tick.discard, self.on_tick)
        if self._idle_wake is not None:
            _quietly(self._idle_wake.cancel)
            self._idle_wake = None
        self._readers.clear()
        self._loop = None
        # A pipe that signals still wake (closed from another thread) stays open, for this
        # poller's next loop or the process's end: a signal would write to a closed or reused fd.
        if self._wake_pipe is not None and (
            not signal_wake.holds(self._wake_pipe[1]) or signal_wake.give_back(self._wake_pipe[1])
        ):
            for fd in self._wake_pipe:
                os.close(fd)
            self._wake_pipe = None


def _nothing() -> None:
    """A timer's call whose only work is that the loop woke for it."""


def _quietly(call, *args) -> None:
    """Tear something down; a failure there changes nothing (it is being dropped)."""
    try:
        call(*args)
    except Exception:
        pass


def _client_id(conn) -> int | None:
    """The id of a blocking connection, for CLIENT UNBLOCK; None when this Redis user may not
    run CLIENT (an ACL without it): a change of the consumed queues then takes effect when the
    blocking read times out (within block_seconds)."""
    conn.send_command("CLIENT", "ID")
    try:
        return conn.read_response()
    except rex.ResponseError as exc:
        logger.info(
            "celery-pq: CLIENT ID refused (%s); changes to the consumed queues take effect within block_seconds", exc
        )
        return None
