"""kombu transport for celery-pq: a thin adapter over ``queue.PriorityQueue``.

Features
========
* Exact priorities 0..255, FIFO within a priority (``priority_order`` picks which end wins).
* Leases: a delivered message is leased to this process in the same script that pops it; the
  process renews its leases while it lives; expired leases return within ``lease_seconds``
  plus about one second; after ``max_deliveries`` a message goes to ``<queue>.dead``.
* Prompt delivery without polling: an insert leaves a wake token that an idle consumer is
  blocked on (BLPOP), inside Celery's event loop or in ``drain_events``.
* Fanout (``celery inspect``, ``celery control``, events) over Redis pub/sub, like kombu's
  Redis transport (sharded pub/sub on a Redis Cluster).
* Redis Cluster with the option ``cluster`` (``connections.py``, docs/cluster.md).

Connection string
=================
``pq://[USER:PASSWORD@]HOST[:PORT][/DB]`` (``pqs://`` for TLS; TLS settings come from
Celery's ``broker_use_ssl`` / kombu's ``ssl=``), or ``redis://...`` with
``broker_transport = "celery_pq.transport:Transport"``. With the option ``master_name``, the
hosts of ``pq://s1:26379;pq://s2:26379`` are Redis Sentinels (see ``connections.py``).

Transport options
=================
``broker_transport_options``: every option, with its type, unit, default and check, is a field
of ``celery_pq.options.Options`` (README.md's table shows the same). Each is checked once, when a
channel is made: a bad one raises ``celery_pq.ConfigError`` naming the option and the value.

Where the rest lives
====================
``poller.py``: how a consumer waits and is woken (the blocking read, pub/sub, the one wait
loop). ``leasebook.py``: which leases a channel holds and which acks wait to be sent.
``leases.py``: the thread that renews them and sweeps expired ones. ``queue.py``: the queue
itself (pop with acks in one round trip, ack, requeue, ...). ``shards.py``: a queue split into
``shards`` full queues, popped as the relaxed priority queue (the best of ``peek`` shards).

After a connection error (Celery reconnecting), messages whose tasks run now keep their
leases, renewed until the tasks end and ack; the others are given back uncounted. Acks whose
round trip fails are kept and sent again.

A task sent with ``countdown``/``eta`` waits in Redis (not in a worker) until due, then joins
the queue at its priority. A consumer of ``NAME[OP VALUE]`` (``default[>=200]``) receives only
entries of ``NAME`` whose priority satisfies the predicate, and is woken only by those.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading

import redis
from kombu.transport import virtual
from redis import exceptions as rex

from . import connections
from . import constants as C
from .codec import Base64Body, decode
from .errors import ConfigError, NotReplicated
from .keys import fanout_channel
from .leasebook import LeaseBook
from .messages import STAMP, PublishStamp, prepare_message, serialized, stored_item
from .leases import LeaseKeeper
from .options import Options
from .poller import Poller, Waits
from .queue import Queue, default_consumer_id, open_queue
from .routing import RoutingTables
from .scripts import set_spin_wait
from .views import View, Views, is_view

logger = logging.getLogger(__name__)

DEFAULT_PORT = C.REDIS_PORT


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

    def ack(self, delivery_tag):
        self.channel._ack(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        self.channel._reject(delivery_tag, requeue)
        self._quick_ack(delivery_tag)

    def restore_unacked(self):
        """Give back every delivered, unacked message (the delivery is undone), at shutdown or
        when kombu tears the connection down.

        After a lost connection (kombu's ``collect``: Celery reconnecting, kombu's ``ensure``),
        a message whose task a Celery worker in this process is running now keeps its lease:
        the lease keeper renews it and its ack goes to Redis when the task ends (see
        ``Transport._collect``). Given back, it would start again while it still runs.
        """
        self._flush()
        keep = _running_tags() if self.channel.transport.connection_lost else set()
        errors = []
        lost_link = 0
        while self._delivered:
            tag, message = self._delivered.popitem()
            if tag in keep:
                continue
            try:
                self.channel._give_back(tag)
            except Transport.connection_errors:
                lost_link += 1  # still leased in Redis: the lease runs out and it comes back
            except Exception as exc:  # noqa: BLE001 - kombu collects and reports these
                errors.append((exc, message))
        if lost_link:
            logger.warning("celery-pq: could not give back %d unacked message(s) (Redis unreachable); "
                           "their leases run out and they are delivered again", lost_link)
        kept = self.channel.leases.holding(keep)
        if kept:
            logger.info("celery-pq: %d running task(s) keep their leases across the lost connection", kept)
        self._delivered.clear()
        return errors


class Channel(virtual.Channel):
    """kombu's hooks over ``PriorityQueue``; ``leases`` (a LeaseBook) holds what this channel
    delivered, ``waits`` (poller.Waits) its blocking read and pub/sub."""

    QoS = QoS
    Message = Message
    supports_fanout = True
    do_restore = True
    min_priority = C.MIN_PRIORITY
    max_priority = C.MAX_PRIORITY
    #: The options every channel starts from (a channel reads its own at creation).
    options = Options()
    #: ``active_queues``, made when first asked after a change of the consumed queues.
    _consumed: list[str] | None = None

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self.options = Options.from_transport_options(connection.client.transport_options)
        self.transport = connection
        self.client = connection.redis_client(self)
        self.consumer_id = connection.consumer_id
        self.leases = LeaseBook(self.options)
        self.waits = Waits(self)
        self.counters = self.waits.counters
        self._queues: dict[str, Queue] = {}
        self.views = Views(self.queue)  # consumed view name -> rank range (views.py)
        self.routing = RoutingTables(self.client, self.options)  # declared queues, bindings
        self._no_ack_queues: set[str] = set()  # consumed with no_ack: acked as delivered
        self._fanout_queues = connection.fanout_queues  # queue -> exchange, per connection
        self._active_fanout: dict[str, str] = {}  # pub/sub channel name -> queue
        self._rotation = 0
        try:
            self.client.ping()  # fail at channel creation, not at the first publish
        except rex.ConnectionError as exc:
            raise connections.explained(exc, connection.tls) from exc
        if not connection.eviction_checked:  # once per connection: at start, not per channel
            if not self.options.cluster:
                connections.check_not_a_cluster_node(self.client)
            connection.eviction_checked = True
            connections.warn_if_evicting(self.client)
        connection.cycle_channels.append(self)

    # -- queues and views -----------------------------------------------------------------------
    def queue(self, name: str) -> Queue:
        """The queue of a name (a view's name gives the queue it views)."""
        q = self._queues.get(name)
        if q is None:
            _check_queue_name(name)
            view = View.parse(name)
            if view is not None:
                q = self.queue(view.base)
            else:
                q = open_queue(self.client, name, self.options.queue_settings(name))
            self._queues[name] = q
        return q

    def decode_body(self, body, encoding=None):
        """kombu's body decoding; a delivered body the codec gave as bytes (``Base64Body``) is
        decoded already."""
        if type(body) is Base64Body:
            return bytes(body)
        return super().decode_body(body, encoding)

    # -- publishing ---------------------------------------------------------------------------
    def prepare_message(self, body, priority=None, content_type=None, content_encoding=None,
                        headers=None, properties=None):
        return prepare_message(self.options, body, priority, content_type, content_encoding, headers, properties)

    def _inplace_augment_message(self, message, exchange, routing_key):
        """kombu's, less two steps the stored form makes needless: a body to be base64 text stays
        its bytes (a ``Base64Body``: the codec stores it so anyway) and no delivery tag is made
        (a delivery carries its lease token as tag; a fanout message gets one in ``_put_fanout``)."""
        body = message["body"]
        if self.body_encoding == "base64" and isinstance(body, (bytes, str)):
            message["body"] = Base64Body(body.encode() if isinstance(body, str) else body)
            encoding = "base64"
        else:
            message["body"], encoding = self.encode_body(body, self.body_encoding)
        props = message["properties"]
        props["body_encoding"] = encoding
        props["delivery_info"].update(exchange=exchange, routing_key=routing_key)

    def _put(self, queue, message, **kwargs):
        # one publish call, one publish id: its own retries (kombu's ensure) carry the same one
        publish_id, first_send = PublishStamp.take(message)
        item = stored_item(queue, message, self.options, self.decode_body, publish_id_=publish_id)
        self.queue(queue).insert(item.payload, item.priority, id=item.id, tenant=item.tenant, due_ms=item.due_ms,
                                 publish_id=item.publish_id, first_send=first_send, remember=False, task=item.task)

    def _put_fanout(self, exchange, message, routing_key, **kwargs):
        # a cluster's sharded pub/sub: the message goes to the master of the channel's slot only
        publish = self.client.spublish if connections.is_cluster(self.client) else self.client.publish
        props = {k: v for k, v in message["properties"].items() if k != STAMP}  # (the publisher's alone)
        props.setdefault("delivery_tag", self._next_delivery_tag())  # each receiver's own
        publish(self._fanout_channel(exchange), serialized(exchange, {**message, "properties": props}, self.options))

    def _fanout_channel(self, exchange):
        return fanout_channel(exchange, self.transport.db, self.options.key_prefix)

    # -- declarations (routing.py: shared in Redis, cached here) ----------------------------------
    def _new_queue(self, queue, **kwargs):
        _check_queue_name(queue)
        if is_view(queue):
            return  # a view consumes its queue; it holds nothing of its own
        self.routing.add_queue(queue)

    def _has_queue(self, queue, **kwargs):
        return self.routing.has_queue(queue)

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        if is_view(queue):
            return  # never a routing destination: publishing goes to the queue it views
        if self.typeof(exchange).type == "fanout":
            self._fanout_queues[queue] = exchange
        self.routing.bind(exchange, routing_key, pattern, queue)

    def get_table(self, exchange):
        return self.routing.table(exchange)

    def _lookup(self, exchange, routing_key, default=None):
        found = super()._lookup(exchange, routing_key, default)
        if not found and self.routing.forget(exchange):  # a binding made elsewhere since we cached
            found = super()._lookup(exchange, routing_key, default)
        return found

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        """Drop one binding of a deleted queue (kombu calls this per binding)."""
        self.routing.unbind(exchange, routing_key, pattern, queue)

    def queue_delete(self, queue, if_unused=False, if_empty=False, **kwargs):
        if is_view(queue):
            return  # deleting a view must not delete the queue it views
        if if_empty and self._size(queue):
            return
        super().queue_delete(queue, if_unused=if_unused, if_empty=if_empty, **kwargs)
        self.queue(queue).delete()
        self.routing.remove_queue(queue)

    def _size(self, queue):
        return self.queue(queue).size()

    def _purge(self, queue):
        if is_view(queue):
            raise ValueError(f"{queue!r} is a view of a queue; purge the queue itself")
        return self.queue(queue).purge()

    # -- consuming ----------------------------------------------------------------------------
    def basic_consume(self, queue, no_ack, *args, **kwargs):
        view = self.views.range_of(queue)
        if view is not None:
            self.queue(queue).register_view(*view)
        if queue in self._fanout_queues:
            self._active_fanout[self._fanout_channel(self._fanout_queues[queue])] = queue
        if no_ack:
            self._no_ack_queues.add(queue)
        ret = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.transport.ensure_keeper()
        self._consumed_changed()
        self.waits.need_pop = True
        return ret

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        ret = super().basic_cancel(consumer_tag)
        self._no_ack_queues.discard(queue)
        if queue is not None and queue in self._fanout_queues:
            self._active_fanout.pop(self._fanout_channel(self._fanout_queues[queue]), None)
        self._consumed_changed()
        return ret

    def _consumed_changed(self):
        """The lease keeper sweeps the consumed queues (each shard); our blocking read waits on them."""
        self._consumed = None  # active_queues is made again
        self.leases.watch([s for name in self.active_queues for s in self.queue(name).shards])
        self.waits.unblock()

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:  # nobody acks it: done once handed over
            self._ack(message.delivery_tag)
        return message

    @property
    def active_queues(self) -> list[str]:
        """The consumed queues, fanout queues left out (those come by pub/sub); made again after
        each change of them (``_consumed_changed``)."""
        queues = self._consumed
        if queues is None:
            fan = set(self._active_fanout.values())
            queues = self._consumed = [q for q in dict.fromkeys(self._active_queues) if q not in fan]
        return queues

    def _get(self, queue, timeout=None):
        """basic_get: lease one message now, or raise Empty."""
        self.transport.ensure_keeper()
        q = self.queue(queue)
        leases = self.leases.pop(q, 1, consumer=self.consumer_id, view=self.views.range_of(queue))
        msg = self._to_message(q, leases[0]) if leases else None
        if msg is None:
            raise virtual.Empty()
        return msg

    def pop_and_deliver(self) -> int:
        """Lease and deliver what the prefetch window allows; the number delivered. Acks
        waiting to be sent go in the same round trip as the pop (the lease book's ``pop``)."""
        queues = self.active_queues
        if not queues or not self.waits.should_pop() or not self.qos.can_consume():
            self.leases.flush()
            return 0
        want = self.qos.can_consume_max_estimate() or C.MAX_POP_BATCH
        want = max(1, min(want, C.MAX_POP_BATCH))
        n = len(queues)
        start = self._rotation % n
        delivered = 0
        for i in range(n):
            name = queues[(start + i) % n]
            q = self.queue(name)
            self.counters["pops"] += 1
            leases = self.leases.pop(q, want, consumer=self.consumer_id, view=self.views.range_of(name))
            if not leases:
                continue
            self._rotation = start + i + 1  # the next call starts after the queue served
            delivered = self._deliver_batch(q, name, leases)
            break
        if not delivered:
            self.waits.need_pop = False
        return delivered

    def _deliver_batch(self, q, name, leases) -> int:
        """Deliver a popped batch; the number delivered. Every lease of it ends delivered,
        given back (not counted) or dead-lettered as malformed: none is left leased to nobody.

        Every lease is in the lease book (renewed) before any message is delivered: a solo
        pool runs each task inside ``_deliver``, while the rest of the batch waits.
        """
        rest = [lease.token for lease in reversed(leases)]  # not yet delivered, last first
        delivered = 0
        try:
            for lease in leases:
                if self.closed or _worker_stopping():  # a task of this batch began a shutdown
                    break
                rest.pop()
                message = self._to_message(q, lease)
                if message is None:
                    continue
                try:
                    if name in self._no_ack_queues:  # nobody acks these: done once handed over
                        self._ack(lease.token)
                    self.connection._deliver(message, name)
                except Unreadable as exc:  # kombu could not build the message (its body)
                    self._dead_letter_malformed(q, lease.token, exc.__cause__)
                    continue
                delivered += 1
        finally:
            if rest:  # a shutdown began, or the callback raised: the others wait again
                self._give_back_all(rest)
        return delivered

    def _to_message(self, q, lease):
        """The kombu message of a lease, or None when it is not one (then moved to the
        dead-letter queue with reason ``malformed``)."""
        try:
            message = decode(lease.payload, raw_body=True)
            props = message["properties"]
            info = props.setdefault("delivery_info", {})
            headers = message.get("headers")
            if not isinstance(info, dict) or not isinstance(headers, (dict, type(None))):
                raise TypeError("its delivery_info or headers are not mappings")
        except Exception as exc:  # noqa: BLE001 - anything unreadable goes to the dead-letter queue
            self._dead_letter_malformed(q, lease.token, exc)
            return None
        # The headers are the published headers. The delivery count (1 on the first delivery)
        # is kombu's delivery_info["delivery_count"]; a redelivery also carries the deliveries
        # before it as the header x-delivery-count, as RabbitMQ's quorum queues do (a Celery
        # task reads self.request.get("x-delivery-count"): its request keeps no delivery count).
        props["delivery_tag"] = lease.token
        info["delivery_count"] = lease.deliveries
        info["redelivered"] = lease.deliveries > 1
        if lease.deliveries > 1:
            message["redelivered"] = True
            if headers is not None:
                headers["x-delivery-count"] = lease.deliveries - 1
        return message

    def _dead_letter_malformed(self, q, tag, exc):
        held = self.leases.drop(tag)
        if held is None:
            return
        q, eid = held  # the shard it came from, for a sharded queue
        if q.is_dead:  # a dead-letter queue has none of its own: the lease runs out, it stays
            logger.error("celery-pq: entry %r of dead-letter queue %r is not a kombu message (%r); left there",
                         eid, q.name, exc)
            return
        logger.error("celery-pq: entry %r of queue %r is not a kombu message (%r); moved to %s.dead",
                     eid, q.name, exc, q.name)
        q.dead_letter((eid, tag), "malformed")

    # -- acks, rejects, give-backs -------------------------------------------------------------
    def _ack(self, tag):
        """Ack now, or (while this connection is draining, or in Celery's event loop) with the
        next pop: one round trip for both. A deferred ack that never reaches Redis (the
        process dies first) only means a redelivery: at least once holds."""
        self.leases.ack(tag, defer=self.transport.poller.defers_acks())

    def _reject(self, tag, requeue):
        held = self.leases.drop(tag)
        if held is None:
            return
        q, eid = held
        result = q.requeue((eid, tag)) if requeue else q.dead_letter((eid, tag), "rejected")
        if result is None:
            logger.warning("celery-pq: reject of %s in %r came after its lease ran out", eid, q.name)
        self.waits.need_pop = True

    def _give_back(self, tag):
        held = self.leases.drop(tag)
        if held is not None:
            q, eid = held
            q.requeue((eid, tag), count_delivery=False)

    def _give_back_all(self, tags):
        try:
            for tag in tags:
                self._give_back(tag)
        except Transport.connection_errors:
            logger.warning("celery-pq: could not give back %d undelivered message(s) (Redis unreachable); "
                           "their leases run out and they are delivered again", len(tags))

    # -- what the poller asks ----------------------------------------------------------------
    def wake_keys(self) -> list[str]:
        """The wake lists of the consumed queues (a view's own list for a view), of every shard
        of a sharded queue: an insert into any shard wakes its consumers."""
        keys = []
        for name in self.active_queues:
            view = self.views.range_of(name)
            for s in self.queue(name).shards:
                keys.append(s.keys.wake if view is None else s.keys.view_wake(*view))
        return keys

    def fanout_channels(self) -> dict[str, str]:
        """{pub/sub channel: queue} of the consumed fanout queues."""
        return self._active_fanout

    def deliver_fanout(self, channel: str, queue: str, data) -> int:
        try:
            message = decode(data)
        except Exception:  # noqa: BLE001
            logger.warning("celery-pq: unreadable fanout message on %r dropped", channel)
            return 0
        self.connection._deliver(message, queue)
        return 1

    def close(self):
        if self.closed:
            return
        try:
            try:
                self.leases.flush()
            except Transport.connection_errors:
                pass  # still leased in Redis: the leases run out and the messages come back
            self.leases.closed = True  # acks from now on wait for the keeper
            super().close()
        finally:
            self.waits.close()
            if self in self.transport.cycle_channels:
                self.transport.cycle_channels.remove(self)
            if self.transport.connection_lost and self.leases.holds_work():
                self.transport.retire(self.leases)


class Transport(virtual.Transport):
    Channel = Channel

    polling_interval = None
    default_port = DEFAULT_PORT
    driver_type = "redis"
    driver_name = "redis"
    use_tls = False
    eviction_checked = False  # set by the first channel (connections.warn_if_evicting)

    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    connection_errors = virtual.Transport.connection_errors + (
        rex.ConnectionError,
        rex.TimeoutError,
        rex.BusyLoadingError,
        rex.AuthenticationError,
        NotReplicated,  # a publish retried (same publish id: stored once) until the replicas have it
        # A Redis Cluster whose slot is moving or whose layout changes (a resharding, a failover):
        # the calls of this transport wait that out first (cluster_retry_seconds, ClusterUnsettled,
        # itself a ConnectionError); any of these that still reach kombu is one too, never fatal.
        rex.ClusterError,
        rex.TryAgainError,
        rex.AskError,
        rex.SlotNotCoveredError,
        rex.ReadOnlyError,  # a master demoted under us: reconnect (to the new master)
        ConnectionError,
        socket.error,
        OSError,
    )
    channel_errors = virtual.Transport.channel_errors + (
        rex.DataError,
        rex.InvalidResponse,
        rex.ResponseError,
    )

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.consumer_id = default_consumer_id()
        self.cycle_channels: list[Channel] = []
        self.fanout_queues: dict[str, str] = {}
        self.poller = Poller(self)
        self._pool = None
        self._pool_lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None
        self.db = 0
        #: Set by kombu's teardown after a connection error (``_collect``).
        self.connection_lost = False
        self._closed = False
        #: Lease books of channels closed by a lost connection that still hold leases of
        #: running tasks or acks not yet sent; the lease keeper serves them until they hold nothing.
        self.retired: list[LeaseBook] = []
        self._retired_lock = threading.Lock()

    def driver_version(self):
        return redis.__version__

    # -- connections (connections.py: one server, TLS, or the master Sentinel names) -----------
    @property
    def tls(self) -> bool:
        return self.use_tls or bool(self.client.ssl)

    def redis_client(self, channel) -> redis.Redis:
        """A client of this connection's pool; with ``cluster``, the connection's one
        ``RedisCluster`` (shared by its channels: it holds the pools of every node)."""
        with self._pool_lock:
            if self._pool is None:
                self.db = connections.broker_db(self.client)
                make = connections.make_cluster if channel.options.cluster else connections.make_pool
                self._pool = make(self.client, channel.options, self.tls)
                if connections.is_cluster(self._pool):
                    connections.set_cluster_retry(self._pool, channel.options.cluster_retry_seconds)
                else:
                    set_spin_wait(self._pool, channel.options.spin_wait_us)
        if connections.is_cluster(self._pool):
            return self._pool
        return redis.Redis(connection_pool=self._pool)

    def new_connection(self, key: str):
        """A connection of our own (not from the pool) for a blocking read of ``key`` (on a
        cluster, to the master serving the key now)."""
        if connections.is_cluster(self._pool):
            return connections.new_connection(connections.node_client(self._pool, key).connection_pool)
        return connections.new_connection(self._pool)

    def ensure_keeper(self):
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = LeaseKeeper(self)
            self._keeper.start()

    def close_connection(self, connection):
        self.poller.close()
        try:
            super().close_connection(connection)  # (a channel closed by a lost connection retires)
        finally:
            self._closed = True  # only now: the keeper stops when nothing retired
            self.release_pool()  # (a retired channel reconnects when it needs to)
            if self.keeper_books() is None and self._keeper is not None:
                self._keeper.stop()
                self._keeper = None

    def _collect(self, connection):
        """kombu's teardown after a connection error (Celery's consumer reconnecting, kombu's
        ``Connection.ensure``), in place of a close: messages whose tasks are running keep
        their leases (``QoS.restore_unacked``), and the lease books of the channels holding
        them, or holding acks not yet sent, retire: this transport's lease keeper goes on
        renewing those leases and sending those acks, on connections of this transport's pool,
        until nothing is left. The new connection consumes meanwhile."""
        self.connection_lost = True
        self.close_connection(connection)

    def keeper_books(self) -> list[LeaseBook] | None:
        """The lease books the keeper serves now; None when it has nothing left (the
        connection is closed and no retired book holds anything)."""
        with self._retired_lock:
            self.retired = [book for book in self.retired if book.holds_work()]
            if self._closed and not self.retired:
                return None
            retired = list(self.retired)
        return [c.leases for c in self.cycle_channels if not c.closed] + retired

    def retire(self, book: LeaseBook):
        """Keep serving the lease book of a channel closed by a lost connection: its running
        tasks' leases, its acks not yet sent."""
        with self._retired_lock:
            self.retired.append(book)

    def release_pool(self):
        if self._pool is not None:
            connections.close_pool(self._pool)

    # -- waiting: kombu's drain_events, Celery's event loop (poller.py) --------------------------
    def drain_events(self, connection, timeout=None):
        return self.poller.drain(timeout)

    def register_with_event_loop(self, connection, loop):
        self.poller.register_with_event_loop(loop)


def _celery_state():
    """celery.worker.state when a Celery worker runs in this process, else None."""
    return sys.modules.get("celery.worker.state")


def _running_tags() -> set:
    """Delivery tags of the messages whose tasks a Celery worker in this process runs now and
    has not acked (``task_acks_late``)."""
    state = _celery_state()
    if state is None:
        return set()
    tags = set()
    for request in list(state.active_requests):
        message = getattr(request, "message", None)
        if message is not None and not getattr(request, "acknowledged", True):
            tags.add(message.delivery_tag)
    return tags


def _worker_stopping() -> bool:
    """True while a Celery worker in this process is shutting down (the rest of a popped batch
    is then given back, not run)."""
    state = _celery_state()
    return bool(state is not None and (state.should_stop is not None or state.should_terminate is not None))


def _check_queue_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a queue name must be a non-empty string, got {name!r}")


class TLSTransport(Transport):
    """``pqs://``: the same transport over TLS."""

    use_tls = True
