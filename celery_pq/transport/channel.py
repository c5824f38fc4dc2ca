"""The kombu transport (``pq://``, ``pqs://`` for TLS) and its channel: kombu's hooks over the queue, the
work handed to the helpers beside this module. docs/architecture.md, docs/leases.md, docs/deployments.md."""

from __future__ import annotations

import threading
from contextlib import suppress

import redis
from kombu import Connection
from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from redis import exceptions as rex

from ..queue import Queue, declare_tables, default_consumer_id, open_queue
from ..scripts import set_spin_wait
from ..storage import connections
from ..storage import constants as C
from ..storage.codec import Base64Body
from ..storage.errors import ConfigError, NotReplicated
from .batches import PublishBatch
from .delivery import Deliveries, Message, QoS, running_tags
from .leasebook import LeaseBook
from .leases import LeaseKeeper
from .messages import message_ttl_ms, prepare_message
from .options import Options
from .poller import Poller, Waits
from .publishing import Publisher
from .routing import RoutingTables
from .views import View, Views


class Channel(virtual.Channel):
    """kombu's hooks: the queues and views it opens, the declarations, what it consumes."""

    QoS = QoS
    Message = Message
    supports_fanout = True
    min_priority = C.MIN_PRIORITY
    max_priority = C.MAX_PRIORITY
    options = Options()  # (each channel reads its own at creation)
    _consumed: list[str] | None = None

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self.options = Options.from_transport_options(connection.client.transport_options)
        self.transport = connection
        self.client = connection.redis_client(self)
        self.consumer_id = connection.consumer_id
        self.leases = LeaseBook(self.options)
        self.waits = Waits(self)
        self.deliveries = Deliveries(self)
        self.publisher = Publisher(self)
        self._queues: dict[str, Queue] = {}
        self._consumed_queues: set[str] = set()  # queues whose settings this channel declared
        self.views = Views(self.queue)
        self.routing = RoutingTables(self.client, self.options)
        self._fanout_queues = connection.fanout_queues  # queue -> exchange, per connection
        self.active_fanout: dict[str, str] = {}  # pub/sub channel -> consumed fanout queue
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
            else:  # declared by a consumer (basic_consume), else its stored settings followed
                declare = name in self._consumed_queues
                q = open_queue(self.client, name, self.options.queue_settings(name), declare=declare)
            self._queues[name] = q
        return q

    def reopen(self, name: str) -> Queue:
        """The queue ``name`` (and its views) opened again, following its mode record (a ``ModeMismatch``)."""
        for cached in [n for n in self._queues if n == name or getattr(View.parse(n), "base", None) == name]:
            del self._queues[cached]
        return self.queue(name)

    def decode_body(self, body, encoding=None):
        """kombu's; a ``Base64Body`` (what the codec gives) is decoded already."""
        return bytes(body) if type(body) is Base64Body else super().decode_body(body, encoding)

    # -- publishing ---------------------------------------------------------------------------
    def prepare_message(
        self, body, priority=None, content_type=None, content_encoding=None, headers=None, properties=None
    ):
        return prepare_message(self.options, body, priority, content_type, content_encoding, headers, properties)

    def _inplace_augment_message(self, message, exchange, routing_key):
        """kombu's, but a base64 body stays ``Base64Body`` bytes and no delivery tag is made (the lease token is it)."""
        body = message["body"]
        if self.body_encoding == "base64" and isinstance(body, (bytes, str)):
            message["body"] = Base64Body(body.encode() if isinstance(body, str) else body)
            encoding = "base64"
        else:
            message["body"], encoding = self.encode_body(body, self.body_encoding)
        props = message["properties"]
        props["body_encoding"] = encoding
        props["delivery_info"].update(exchange=exchange, routing_key=routing_key)

    def _put(self, queue, message, _publish_batch=None, **kwargs):
        self.publisher.put(queue, message, _publish_batch)

    def create_publish_batch(self, max_size: int) -> PublishBatch:
        return PublishBatch(self, max_size)

    def _put_fanout(self, exchange, message, routing_key, _publish_batch=None, **kwargs):
        self.publisher.put_fanout(exchange, message)  # in a batch too: pub/sub keeps nothing to batch

    # -- declarations (routing.py: shared in Redis, cached here) ----------------------------------
    def prepare_queue_arguments(self, arguments, **kwargs):
        """Declaration arguments as AMQP names them (``message_ttl`` -> ``x-message-ttl`` in ms),
        as kombu's Redis transport does: a declared TTL holds for every publisher (docs/expiry.md)."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _new_queue(self, queue, **kwargs):
        _check_queue_name(queue)
        if View.parse(queue):
            return  # a view consumes its queue; it holds nothing of its own
        self.routing.add_queue(queue, message_ttl_ms(kwargs.get("arguments")))

    def _has_queue(self, queue, **kwargs):
        return self.routing.has_queue(queue)

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        if View.parse(queue):
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
        """One binding of a deleted queue (kombu calls this per binding)."""
        self.routing.unbind(exchange, routing_key, pattern, queue)

    def queue_delete(self, queue, if_unused=False, if_empty=False, **kwargs):
        if View.parse(queue) or (if_empty and self._size(queue)):
            return  # (deleting a view must not delete the queue it views)
        super().queue_delete(queue, if_unused=if_unused, if_empty=if_empty, **kwargs)
        self.queue(queue).delete()
        self.routing.remove_queue(queue)

    def _size(self, queue):
        return self.queue(queue).size()

    def _purge(self, queue):
        if View.parse(queue):
            raise ValueError(f"{queue!r} is a view of a queue; purge the queue itself")
        return self.queue(queue).purge()

    # -- consuming ----------------------------------------------------------------------------
    def basic_consume(self, queue, no_ack, *args, **kwargs):
        view_of = View.parse(queue)
        base = queue if view_of is None else view_of.base
        if base not in self._consumed_queues:  # a consumer declares its queue's settings (queue/opening.py)
            self._consumed_queues.add(base)
            if base in self._queues:  # opened to publish before: declared now
                declare_tables(self._queues[base], self.options.queue_settings(base))
        view = self.views.range_of(queue)
        if view is not None:
            self.queue(queue).register_view(*view)
        if queue in self._fanout_queues:
            self.active_fanout[self.publisher.fanout_channel(self._fanout_queues[queue])] = queue
        if no_ack:
            self.deliveries.no_ack.add(queue)
        ret = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.transport.ensure_keeper()
        self._consumed_changed()
        self.waits.need_pop = True
        return ret

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        ret = super().basic_cancel(consumer_tag)
        self.deliveries.no_ack.discard(queue)
        if queue is not None and queue in self._fanout_queues:
            self.active_fanout.pop(self.publisher.fanout_channel(self._fanout_queues[queue]), None)
        self._consumed_changed()
        return ret

    def _consumed_changed(self):
        """The lease keeper sweeps the consumed queues (each shard); our blocking read waits on them."""
        self._consumed = None
        self.leases.queues = tuple(dict.fromkeys(s for name in self.active_queues for s in self.queue(name).shards))
        self.waits.unblock()

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:  # nobody acks it: done once handed over
            self.deliveries.ack(message.delivery_tag)
        return message

    @property
    def active_queues(self) -> list[str]:
        """The consumed queues but the fanout ones (those come by pub/sub)."""
        queues = self._consumed
        if queues is None:
            fan = set(self.active_fanout.values())
            queues = self._consumed = [q for q in dict.fromkeys(self._active_queues) if q not in fan]
        return queues

    def _get(self, queue, timeout=None):
        return self.deliveries.get(queue)

    # -- what the poller asks ----------------------------------------------------------------
    def wake_keys(self) -> list[str]:
        """The wake lists of the consumed queues (a view's own for a view), of every shard."""
        keys: list[str] = []
        for name in self.active_queues:
            view = self.views.range_of(name)
            keys.extend(s.keys.wake if view is None else s.keys.view_wake(*view) for s in self.queue(name).shards)
        return keys

    def close(self):
        if self.closed:
            return
        try:
            with suppress(*Transport.connection_errors):  # still leased in Redis: they expire and come back
                self.deliveries.settle()
                self.leases.flush()
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

    driver_type = "redis"
    driver_name = "redis"
    use_tls = False
    eviction_checked = False  # set by the first channel

    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        batch_publish=True,  # Producer.batch(): Channel.create_publish_batch
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    # (kombu's annotations take its one-element tuples for the type)
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        rex.ConnectionError,
        rex.TimeoutError,
        rex.BusyLoadingError,
        rex.AuthenticationError,
        NotReplicated,  # a publish retried (same publish id: stored once) until the replicas have it
        # a cluster's moving slot or changing layout, waited out first: a connection error too, never fatal
        *connections.UNSETTLED,
        rex.ReadOnlyError,  # a master demoted under us: reconnect (to the new master)
        OSError,  # (ConnectionError, socket.error)
    )
    channel_errors = (  # type: ignore[assignment]
        *virtual.Transport.channel_errors,
        rex.DataError,
        rex.InvalidResponse,
        rex.ResponseError,
    )

    client: Connection

    def __init__(self, client: Connection, **kwargs):
        super().__init__(client, **kwargs)
        self.consumer_id = default_consumer_id()
        self.cycle_channels: list[Channel] = []
        self.fanout_queues: dict[str, str] = {}
        self.poller = Poller(self)
        self._pool: redis.ConnectionPool | redis.RedisCluster | None = None
        self._pool_lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None
        self.db = 0
        self.connection_lost = False  # set by ``_collect``
        self._closed = False
        #: Lease books of channels closed by a lost connection, served by the keeper until empty.
        self.retired: list[LeaseBook] = []
        self._retired_lock = threading.Lock()

    def driver_version(self):
        return redis.__version__

    @property
    def default_connection_params(self) -> dict:
        return {"port": C.REDIS_PORT, "hostname": "localhost"}

    # -- connections (storage/connections.py) ------------------------------------------------
    @property
    def tls(self) -> bool:
        return self.use_tls or bool(self.client.ssl)

    def redis_client(self, channel) -> redis.Redis | redis.RedisCluster:
        """A client of this connection's pool (with ``cluster``, its one shared ``RedisCluster``)."""
        with self._pool_lock:
            pool = self._pool
            if pool is None:
                self.db = connections.broker_db(self.client)
                options = channel.options
                if options.cluster:
                    pool = connections.make_cluster(self.client, options, self.tls)
                    connections.set_cluster_retry(pool, options.cluster_retry_seconds)
                else:
                    pool = connections.make_pool(self.client, options, self.tls)
                    set_spin_wait(pool, options.spin_wait_us)
                self._pool = pool
        return pool if isinstance(pool, redis.RedisCluster) else redis.Redis(connection_pool=pool)

    def new_connection(self, key: str) -> redis.connection.AbstractConnection:
        """A connection outside the pool for a blocking read of ``key`` (on a cluster, to its master)."""
        pool = self._pool
        assert pool is not None  # (made with the first channel)
        if isinstance(pool, redis.RedisCluster):
            return connections.new_connection(connections.node_client(pool, key).connection_pool)
        return connections.new_connection(pool)

    def ensure_keeper(self):
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = LeaseKeeper(self)
            self._keeper.start()

    def close_connection(self, connection):
        self.poller.close()
        try:
            super().close_connection(connection)
        finally:
            self._closed = True  # only now: the keeper stops when nothing retired
            self.release_pool()  # (a retired book reconnects when it needs to)
            if self.keeper_books() is None and self._keeper is not None:
                self._keeper.stop()
                self._keeper = None

    def _collect(self, connection):
        """kombu's teardown after a connection error: running tasks keep their leases, and the lease
        books holding them (or unsent acks) retire: the keeper serves them while the new connection consumes."""
        self.connection_lost = True
        self.close_connection(connection)

    def keeper_books(self) -> list[LeaseBook] | None:
        """The lease books the keeper serves now; None once closed with no retired book left. A
        retired book renews only the leases of tasks still running (``LeaseBook.release_ended``)."""
        with self._retired_lock:
            self.retired = [book for book in self.retired if book.holds_work()]
            if self._closed and not self.retired:
                return None
            retired = list(self.retired)
        if retired:
            with suppress(RuntimeError):  # (Celery's set of requests changed as it was read)
                running = running_tags()
                for book in retired:
                    book.release_ended(running)
        return [c.leases for c in self.cycle_channels if not c.closed] + retired

    def retire(self, book: LeaseBook):
        """Keep serving the lease book of a channel closed by a lost connection."""
        with self._retired_lock:
            self.retired.append(book)

    def release_pool(self):
        if self._pool is not None:
            connections.close_pool(self._pool)

    # -- waiting (poller.py) -------------------------------------------------------------------
    def drain_events(self, connection, timeout=None, **kwargs):
        return self.poller.drain(timeout)

    def register_with_event_loop(self, connection, loop):
        self.poller.register_with_event_loop(loop)


def _check_queue_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a queue name must be a non-empty string, got {name!r}")


class TLSTransport(Transport):
    """``pqs://``: the same transport over TLS."""

    use_tls = True
