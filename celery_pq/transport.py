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
  Redis transport.

Connection string
=================
``pq://[USER:PASSWORD@]HOST[:PORT][/DB]`` (``pqs://`` for TLS; TLS settings come from
Celery's ``broker_use_ssl`` / kombu's ``ssl=``), or ``redis://...`` with
``broker_transport = "celery_pq.transport:Transport"``.

Transport options
=================
* ``key_prefix`` (str, ``"pq"``): prefix of every key and channel.
* ``priority_order`` (``"higher_first"``): or ``"lower_first"`` (kombu Redis meaning).
* ``default_priority`` (int 0..255, 0): priority of a message published without one.
* ``lease_seconds`` (float seconds, 60): lease length; ``visibility_timeout`` is an alias.
* ``max_deliveries`` (int, 10): deliveries without an ack before ``<queue>.dead``; 0 = no limit.
* ``max_length`` (int or None): waiting entries per queue; beyond it publish raises QueueFull.
* ``technique`` (``"T"`` or ``"S"``, ``"T"``): the patent technique for every queue;
  ``queue_techniques`` ({queue: technique}) sets it per queue.
* ``sweep_interval`` (float seconds > 0, 1.0): how often expired leases are swept (one sweeper
  per queue per interval across all consumers).
* ``renew_interval`` (float seconds, lease_seconds / 3, at most 20): how often held leases are
  renewed; shorter than ``lease_seconds``. A failed renewal is tried again within 0.1 to 2 s.
* ``block_seconds`` (float seconds > 0, 5): server-side BLPOP timeout of an idle consumer.
* ``binding_cache_seconds`` (float seconds >= 0, 5): how long a routing table is cached.
* ``socket_timeout``, ``socket_connect_timeout`` (seconds > 0 or None), ``socket_keepalive``
  (bool or None), ``health_check_interval`` (seconds >= 0), ``max_connections`` (int >= 1 or
  None), ``client_name`` (str without spaces): passed to redis-py.
* ``max_message_bytes`` (int or None): a message whose stored form is larger is refused at
  publish with ``celery_pq.errors.MessageTooLarge``; nothing is written.
* ``dedupe_seconds`` (float seconds >= 0, 300): each publish carries a publish id (for a Celery
  task: made from its task id, retries count, eta and body, so kombu's and Celery's publish
  retries carry the same one); a queue stores nothing for an id it has seen within this
  window. Those retries only come when no reply came, so an answered id is forgotten by the
  next publish and the window costs memory only for unanswered publishes. 0 turns it off.
* ``max_dead_length`` (int or None): entries a dead-letter queue ``<queue>.dead`` holds at
  most (None: the queue's ``max_length``, else no bound); when full, the oldest is dropped
  with a warning.
* ``fair_key`` (None): fairness off; a header name (``apply_async(headers={"tenant": "acme"})``
  with ``fair_key="tenant"``), or ``"module:function"`` taking the kombu message dict and
  returning the tenant (a string, or None for the shared default tenant).
* ``fair_weights`` ({tenant: weight}, weight 1 for tenants not named).
* ``fair_scope`` (``"within_priority"``): strict priority, tenants share each level; or
  ``"tenant_first"``: tenants share the queue, each tenant's entries go by priority.
* ``tenant_concurrency`` (int, or {tenant: int} with ``"*"`` as the default): leased messages
  per tenant at once; ``tenant_rate`` (same forms, deliveries per second per tenant).
* ``max_length_per_tenant`` (int): waiting messages per tenant; beyond it publish raises QueueFull.

Every option is checked (type and range) when a channel is made: a bad one raises
``celery_pq.ConfigError`` naming the option and the value.

After a connection error (Celery reconnecting), messages whose tasks run now keep their
leases, renewed until the tasks end and ack; the others are given back uncounted. Acks whose
round trip fails are kept and sent again.

A task sent with ``countdown``/``eta`` waits in Redis (not in a worker) until due, then joins
the queue at its priority. A consumer of ``NAME[OP VALUE]`` (``default[>=200]``) receives only
entries of ``NAME`` whose priority satisfies the predicate, and is woken only by those.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import re
import select
import socket
import threading
from datetime import datetime, timezone
from hashlib import blake2b
from time import monotonic, sleep

import redis
from kombu.transport import virtual
from kombu.utils.imports import symbol_by_name
from kombu.utils.json import dumps, loads
from redis import exceptions as rex

from . import constants as C
from .errors import ConfigError, ErrorCode, MessageTooLarge
from .ids import encode_id
from .keys import BINDING_SEP, binding_key, fanout_channel, queues_key
from .leases import LeaseKeeper
from .queue import FAIR_SCOPES, PriorityQueue, default_consumer_id, validate_priority
from .scripts import run_calls

logger = logging.getLogger(__name__)

DEFAULT_PORT = 6379

#: A consumer's view of part of a queue: NAME[OP VALUE] (the collated keyed queue).
_PREDICATE = re.compile(r"^(?P<base>.+)\[\s*(?P<op><=|>=|=|<|>)\s*(?P<value>-?\d+)\s*\]$")
_OPS = {"=": operator.eq, "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}

_OPTION_NAMES = (
    "key_prefix",
    "priority_order",
    "default_priority",
    "lease_seconds",
    "visibility_timeout",
    "max_deliveries",
    "max_length",
    "technique",
    "queue_techniques",
    "sweep_interval",
    "renew_interval",
    "block_seconds",
    "binding_cache_seconds",
    "fair_key",
    "fair_weights",
    "fair_scope",
    "tenant_concurrency",
    "tenant_rate",
    "max_length_per_tenant",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "health_check_interval",
    "max_connections",
    "client_name",
    "max_message_bytes",
    "dedupe_seconds",
    "max_dead_length",
)


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
        if keep & self.channel._leases.keys():
            logger.info("celery-pq: %d running task(s) keep their leases across the lost connection",
                        len(keep & self.channel._leases.keys()))
        self._delivered.clear()
        return errors


class Channel(virtual.Channel):
    QoS = QoS
    Message = Message
    supports_fanout = True
    do_restore = True
    from_transport_options = virtual.Channel.from_transport_options + _OPTION_NAMES

    key_prefix = C.KEY_PREFIX
    priority_order = C.HIGHER_FIRST
    default_priority = 0
    lease_seconds = None
    visibility_timeout = None
    max_deliveries = C.MAX_DELIVERIES
    max_length = None
    technique = C.TECHNIQUE_T
    queue_techniques = None
    sweep_interval = C.SWEEP_INTERVAL
    renew_interval = None
    block_seconds = C.BLOCK_SECONDS
    binding_cache_seconds = 5.0
    fair_key = None
    fair_weights = None
    fair_scope = "within_priority"
    tenant_concurrency = None
    tenant_rate = None
    max_length_per_tenant = None
    socket_timeout = None
    socket_connect_timeout = None
    socket_keepalive = None
    health_check_interval = 25
    max_connections = 50
    client_name = None
    max_message_bytes = None
    dedupe_seconds = 300.0
    max_dead_length = None
    min_priority = C.MIN_PRIORITY
    max_priority = C.MAX_PRIORITY

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self._check_options()
        self.transport = connection
        self.client = connection.redis_client(self)
        self.consumer_id = connection.consumer_id
        self._queues: dict[str, PriorityQueue] = {}
        self._views: dict[str, tuple[int, int]] = {}  # consumed name -> rank range of its view
        self._leases: dict[str, tuple[str, str]] = {}  # delivery tag -> (queue, entry id)
        self._pending_acks: dict[str, list[tuple[str, str]]] = {}  # queue -> [(entry id, tag)]
        self._pending_count = 0
        self._no_ack_queues: set[str] = set()  # consumed with no_ack: acked as delivered
        self._leases_lock = threading.Lock()
        self._tables: dict[str, tuple[float, list]] = {}
        self._fanout_queues = connection.fanout_queues  # queue -> exchange, per connection
        self._active_fanout: dict[str, str] = {}  # channel name -> queue
        self._rotation = 0
        # Poll state: pop when there may be work; otherwise block on the wake lists.
        self._need_pop = True
        #: Redis calls this channel made to receive: "pops" (pop scripts), "wakeups" (blocking
        #: waits answered by a wake token), "timeouts" (blocking waits that ran out).
        self.counters = {"pops": 0, "wakeups": 0, "timeouts": 0}
        self._bconn = None
        self._bconn_id = None
        self._blpop_keys = None
        self._blpop_sent = 0.0
        self._pubsub = None
        self._subscribed: set[str] = set()
        self.client.ping()  # fail at channel creation, not at the first publish
        connection.cycle_channels.append(self)

    # -- options ------------------------------------------------------------------------------
    def _check_options(self):
        """Every option's type and range, once, at channel creation: a ConfigError names the
        option and the value."""
        if self.priority_order not in C.PRIORITY_ORDERS:
            raise ConfigError(f"priority_order must be one of {C.PRIORITY_ORDERS}, got {self.priority_order!r}")
        try:
            validate_priority(self.default_priority)
        except ValueError as exc:
            raise ConfigError(f"default_priority: {exc}") from None
        lease = self.lease_seconds if self.lease_seconds is not None else self.visibility_timeout
        self.lease_seconds = _seconds("lease_seconds", C.LEASE_SECONDS if lease is None else lease)
        if self.renew_interval is None:
            self.renew_interval = min(max(0.1, self.lease_seconds / 3.0), 20.0, self.lease_seconds / 2.0)
        self.renew_interval = _seconds("renew_interval", self.renew_interval)
        if self.renew_interval >= self.lease_seconds:
            raise ConfigError(f"renew_interval must be shorter than lease_seconds ({self.lease_seconds:g}), "
                              f"got {self.renew_interval!r}: leases would run out between renewals")
        self.sweep_interval = _seconds("sweep_interval", self.sweep_interval)
        self.block_seconds = _seconds("block_seconds", self.block_seconds)  # 0 would block for ever
        self.binding_cache_seconds = _seconds("binding_cache_seconds", self.binding_cache_seconds, zero=True)
        self.dedupe_seconds = _seconds("dedupe_seconds", self.dedupe_seconds, zero=True)
        for name in ("socket_timeout", "socket_connect_timeout"):
            if getattr(self, name) is not None:
                setattr(self, name, _seconds(name, getattr(self, name)))
        self.health_check_interval = _seconds("health_check_interval", self.health_check_interval or 0, zero=True)
        if self.socket_keepalive is not None and not isinstance(self.socket_keepalive, bool):
            raise ConfigError(f"socket_keepalive must be True, False or None, got {self.socket_keepalive!r}")
        if self.client_name is not None and (not isinstance(self.client_name, str) or not self.client_name
                                             or any(c.isspace() for c in self.client_name)):
            raise ConfigError(f"client_name must be a non-empty string without spaces, got {self.client_name!r}")
        _count("max_deliveries", self.max_deliveries, minimum=0, none=False)
        for name in ("max_length", "max_length_per_tenant", "max_connections", "max_message_bytes",
                     "max_dead_length"):
            _count(name, getattr(self, name), minimum=1)
        if self.queue_techniques is not None and not isinstance(self.queue_techniques, dict):
            raise ConfigError(f"queue_techniques must be a dict {{queue: technique}}, got {self.queue_techniques!r}")
        techniques = {None: self.technique, **(self.queue_techniques or {})}
        for name, tech in techniques.items():
            if tech not in C.TECHNIQUES:
                raise ConfigError(f"technique for {name or 'all queues'!r} must be 'T' or 'S', got {tech!r}")
        if not self.key_prefix or not isinstance(self.key_prefix, str):
            raise ConfigError(f"key_prefix must be a non-empty string, got {self.key_prefix!r}")
        self._tenant_fn = None
        if self.fair_key is not None:
            if not isinstance(self.fair_key, str) or not self.fair_key:
                raise ConfigError(f"fair_key must be a header name or 'module:function', got {self.fair_key!r}")
            if ":" in self.fair_key:
                try:
                    self._tenant_fn = symbol_by_name(self.fair_key)
                except Exception as exc:  # noqa: BLE001
                    raise ConfigError(f"fair_key {self.fair_key!r} cannot be imported: {exc!r}") from None
                if not callable(self._tenant_fn):
                    raise ConfigError(f"fair_key {self.fair_key!r} is not callable")
        if self.fair_scope not in FAIR_SCOPES:
            raise ConfigError(f"fair_scope must be one of {tuple(FAIR_SCOPES)}, got {self.fair_scope!r}")
        self._tenant_conc, self._conc_default = _per_tenant("tenant_concurrency", self.tenant_concurrency, int)
        self._tenant_rate, self._rate_default = _per_tenant("tenant_rate", self.tenant_rate, (int, float))
        weights = self.fair_weights or {}
        if not isinstance(weights, dict):
            raise ConfigError(f"fair_weights must be a dict {{tenant: weight}}, got {weights!r}")
        _per_tenant("fair_weights", weights, (int, float))
        fair_only = {"fair_weights": weights, "tenant_concurrency": self.tenant_concurrency,
                     "tenant_rate": self.tenant_rate, "max_length_per_tenant": self.max_length_per_tenant}
        if self.fair_key is None and any(fair_only.values()):
            named = ", ".join(k for k, v in fair_only.items() if v)
            raise ConfigError(f"{named} need fair_key (a tenant for each message)")

    def _queue(self, name: str) -> PriorityQueue:
        """The queue of a name (a view's name gives the queue it views)."""
        q = self._queues.get(name)
        if q is None:
            _check_queue_name(name)
            m = _PREDICATE.match(name)
            if m:
                q = self._queues[name] = self._queue(m.group("base"))
                return q
            fair = self.fair_key is not None and not name.endswith(".dead")
            q = PriorityQueue(
                self.client,
                name,
                key_prefix=self.key_prefix,
                technique=(self.queue_techniques or {}).get(name, self.technique),
                priority_order=self.priority_order,
                lease_seconds=self.lease_seconds,
                max_deliveries=0 if name.endswith(".dead") else self.max_deliveries,
                max_length=self.max_length,
                fair=fair,
                fair_scope=self.fair_scope,
                tenant_concurrency=self._conc_default if fair else None,
                tenant_rate=self._rate_default if fair else None,
                max_length_per_tenant=self.max_length_per_tenant if fair else None,
                dedupe_seconds=self.dedupe_seconds,
                max_dead_length=self.max_dead_length,
            )
            if fair:
                q.configure_tenants(weights=self.fair_weights, concurrency=self._tenant_conc, rate=self._tenant_rate)
            self._queues[name] = q
        return q

    def _view(self, name: str) -> tuple[int, int] | None:
        """The rank range of a consumed view name like ``default[>=200]``, or None."""
        if name in self._views:
            return self._views[name]
        m = _PREDICATE.match(name)
        if not m:
            return None
        test, value = _OPS[m.group("op")], int(m.group("value"))
        q = self._queue(name)
        ranks = [q.rank(p) for p in range(C.MIN_PRIORITY, C.MAX_PRIORITY + 1) if test(p, value)]
        if not ranks:
            raise ConfigError(f"queue view {name!r}: no priority 0..255 satisfies it")
        if q.fair and q.scope != "P":
            raise ConfigError(f"queue view {name!r}: views need fair_scope='within_priority' on a fair queue")
        self._views[name] = (min(ranks), max(ranks))
        return self._views[name]

    def _tenant_of(self, message) -> str | None:
        """The tenant of an outgoing message (None: the shared default tenant)."""
        if self.fair_key is None:
            return None
        if self._tenant_fn is not None:
            try:
                # the function sees the message with its body decoded (the serialized payload)
                props = message.get("properties") or {}
                body = self.decode_body(message.get("body"), props.get("body_encoding"))
                tenant = self._tenant_fn({**message, "body": body})
            except Exception as exc:  # noqa: BLE001 - named and re-raised; nothing is written
                raise ValueError(f"fair_key function {self.fair_key!r} raised {exc!r}; "
                                 "the message was not published") from exc
        else:
            tenant = (message.get("headers") or {}).get(self.fair_key)
        if tenant is not None and not isinstance(tenant, str):
            raise ValueError(f"fair_key {self.fair_key!r} gave {tenant!r} ({type(tenant).__name__}), "
                             "not a string; the message was not published")
        return tenant

    # -- publishing ---------------------------------------------------------------------------
    def prepare_message(self, body, priority=None, content_type=None, content_encoding=None,
                        headers=None, properties=None):
        # kombu's Producer.publish and Celery pass 0 when no priority was given (the kombu
        # convention, as in kombu's virtual transports): 0 and None take default_priority.
        if priority is None or (type(priority) is int and priority == 0):
            priority = self.default_priority
        validate_priority(priority)  # before anything is written
        properties = properties or {}
        properties.setdefault("delivery_info", {})
        properties["priority"] = priority
        return {
            "body": body,
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers or {},
            "properties": properties,
        }

    def _put(self, queue, message, **kwargs):
        props = message["properties"]
        priority = props.get("priority")
        if priority is None:
            priority = self.default_priority  # a message that did not come through prepare_message
        headers = message.get("headers") or {}
        task_id = headers.get("id") or props.get("correlation_id") or None
        tenant = self._tenant_of(message)
        due_ms = _eta_ms(headers.get("eta"))
        self._queue(queue).insert(self._serialized(queue, message), priority,
                                  id=str(task_id) if task_id else None, tenant=tenant, due_ms=due_ms,
                                  publish_id=publish_id(message), remember=False)

    def _put_fanout(self, exchange, message, routing_key, **kwargs):
        self.client.publish(self._fanout_channel(exchange), self._serialized(exchange, message))

    def _serialized(self, queue, message) -> bytes:
        """The message as stored; MessageTooLarge (nothing written) when over max_message_bytes."""
        data = dumps(message).encode()
        if self.max_message_bytes is not None and len(data) > self.max_message_bytes:
            raise MessageTooLarge(queue, len(data), self.max_message_bytes)
        return data

    def _fanout_channel(self, exchange):
        return fanout_channel(exchange, self.transport.db, self.key_prefix)

    # -- routing tables (shared in Redis, cached here) ------------------------------------------
    def _new_queue(self, queue, **kwargs):
        _check_queue_name(queue)
        if _PREDICATE.match(queue):
            return  # a view consumes its queue; it holds nothing of its own
        self.client.sadd(queues_key(self.key_prefix), queue)

    def _has_queue(self, queue, **kwargs):
        return bool(self.client.sismember(queues_key(self.key_prefix), queue))

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        if _PREDICATE.match(queue):
            return  # never a routing destination: publishing goes to the queue it views
        if self.typeof(exchange).type == "fanout":
            self._fanout_queues[queue] = exchange
        member = BINDING_SEP.join([routing_key or "", pattern or "", queue or ""])
        self.client.sadd(binding_key(exchange, self.key_prefix), member)
        self._tables.pop(exchange, None)

    def get_table(self, exchange):
        hit = self._tables.get(exchange)
        now = monotonic()
        if hit and now - hit[0] < self.binding_cache_seconds:
            return hit[1]
        rows = [tuple(m.decode().split(BINDING_SEP)) for m in self.client.smembers(binding_key(exchange, self.key_prefix))]
        self._tables[exchange] = (now, rows)
        return rows

    def _lookup(self, exchange, routing_key, default=None):
        found = super()._lookup(exchange, routing_key, default)
        if not found and exchange in self._tables:  # a binding made elsewhere since we cached
            self._tables.pop(exchange, None)
            found = super()._lookup(exchange, routing_key, default)
        return found

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        """Drop one binding of a deleted queue (kombu calls this per binding)."""
        member = BINDING_SEP.join([routing_key or "", pattern or "", queue or ""])
        self.client.srem(binding_key(exchange, self.key_prefix), member)
        self._tables.pop(exchange, None)

    def queue_delete(self, queue, if_unused=False, if_empty=False, **kwargs):
        if _PREDICATE.match(queue):
            return  # deleting a view must not delete the queue it views
        if if_empty and self._size(queue):
            return
        super().queue_delete(queue, if_unused=if_unused, if_empty=if_empty, **kwargs)
        self._queue(queue).delete()
        self.client.srem(queues_key(self.key_prefix), queue)

    def _size(self, queue):
        return self._queue(queue).size()

    def _purge(self, queue):
        if _PREDICATE.match(queue):
            raise ValueError(f"{queue!r} is a view of a queue; purge the queue itself")
        return self._queue(queue).purge()

    # -- consuming ----------------------------------------------------------------------------
    def basic_consume(self, queue, no_ack, *args, **kwargs):
        view = self._view(queue)
        if view is not None:
            self._queue(queue).register_view(*view)
        if queue in self._fanout_queues:
            self._active_fanout[self._fanout_channel(self._fanout_queues[queue])] = queue
        if no_ack:
            self._no_ack_queues.add(queue)
        ret = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.transport.ensure_keeper()
        self._need_pop = True
        self._unblock()
        return ret

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        ret = super().basic_cancel(consumer_tag)
        self._no_ack_queues.discard(queue)
        if queue is not None and queue in self._fanout_queues:
            self._active_fanout.pop(self._fanout_channel(self._fanout_queues[queue]), None)
        self._unblock()
        return ret

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:  # nobody acks it: done once handed over
            self._ack(message.delivery_tag)
        return message

    @property
    def active_queues(self):
        fan = set(self._active_fanout.values())
        return [q for q in dict.fromkeys(self._active_queues) if q not in fan]

    def _get(self, queue, timeout=None):
        """basic_get: lease one message now, or raise Empty."""
        self.transport.ensure_keeper()
        q = self._queue(queue)
        leases = q.pop(1, consumer=self.consumer_id, view=self._view(queue))
        if not leases:
            raise virtual.Empty()
        self._register(q, leases)
        msg = self._to_message(q, leases[0])
        if msg is None:
            raise virtual.Empty()
        return msg

    def _to_message(self, q, lease):
        """The kombu message of a lease, or None when it is not one (then moved to the
        dead-letter queue with reason ``malformed``)."""
        try:
            message = loads(lease.payload)
            props = message["properties"]
            info = props.setdefault("delivery_info", {})
            headers = message.get("headers")
            if not isinstance(info, dict) or not isinstance(headers, (dict, type(None))):
                raise TypeError("its delivery_info or headers are not mappings")
        except Exception as exc:  # noqa: BLE001 - anything unreadable goes to the dead-letter queue
            self._dead_letter_malformed(q, lease.token, exc)
            return None
        tag = lease.token
        props["delivery_tag"] = tag
        info["delivery_count"] = lease.deliveries
        info["redelivered"] = lease.deliveries > 1
        if lease.deliveries > 1:
            message["redelivered"] = True
        # RabbitMQ's name for it; a Celery task reads self.request.get("x-delivery-count")
        if headers is not None:
            headers["x-delivery-count"] = lease.deliveries
            if headers.get("eta"):  # the broker held it until due: the worker runs it now
                headers["x-pq-eta"], headers["eta"] = headers["eta"], None
        return message

    def _dead_letter_malformed(self, q, tag, exc):
        with self._leases_lock:
            held = self._leases.pop(tag, None)
        if held is None:
            return
        if q.is_dead:  # a dead-letter queue has none of its own: the lease runs out, it stays
            logger.error("celery-pq: entry %r of dead-letter queue %r is not a kombu message (%r); left there",
                         held[1], q.name, exc)
            return
        logger.error("celery-pq: entry %r of queue %r is not a kombu message (%r); moved to %s.dead",
                     held[1], q.name, exc, q.name)
        q.dead_letter((held[1], tag), "malformed")

    def _register(self, q, leases):
        with self._leases_lock:
            for lease in leases:
                self._leases[lease.token] = (q.name, lease.id)

    def _pop_and_deliver(self) -> int:
        """Lease and deliver what the prefetch window allows; the number delivered.

        Acks waiting to be sent go in the same round trip as the pop.
        """
        queues = self.active_queues
        if not queues or not self._need_pop or not self.qos.can_consume():
            self.flush_acks()
            return 0
        want = self.qos.can_consume_max_estimate() or C.MAX_POP_BATCH
        want = max(1, min(want, C.MAX_POP_BATCH))
        n = len(queues)
        start = self._rotation % n
        delivered = 0
        for i in range(n):
            name = queues[(start + i) % n]
            q = self._queue(name)
            self.counters["pops"] += 1
            pending = self._take_acks()
            own = pending.pop(name, [])  # this queue's acks ride in the pop script itself
            calls = self._ack_calls(pending)
            calls.append(q.pop_call(want, consumer=self.consumer_id, view=self._view(name), acks=own))
            if own:
                pending[name] = own
            try:
                replies = run_calls(self.client, calls)
            except BaseException:
                self._keep_acks(pending)
                raise
            reply = replies[-1]
            if own:
                replies[-1] = q.ack_codes(reply)
            self._check_acks(pending, replies)
            leases = q.parse_pop(reply)
            if not leases:
                continue
            self._rotation = start + i + 1  # the next call starts after the queue served
            delivered = self._deliver_batch(q, name, leases)
            break
        if not delivered:
            self._need_pop = False
        return delivered

    def _deliver_batch(self, q, name, leases) -> int:
        """Deliver a popped batch; the number delivered. Every lease of it ends delivered,
        given back (not counted) or dead-lettered as malformed: none is left leased to nobody.

        Every lease joins the renewals before any message is delivered: a solo pool runs each
        task inside ``_deliver``, while the rest of the batch waits.
        """
        self._register(q, leases)
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

    def _ack(self, tag):
        """Ack now, or (while this connection is draining, or in Celery's event loop) with the
        next pop: one round trip for both. A deferred ack that never reaches Redis (the
        process dies first) only means a redelivery: at least once holds."""
        with self._leases_lock:
            held = self._leases.pop(tag, None)
            if held is None:  # fanout messages and no_ack deliveries carry no lease
                return
            queue, eid = held
            # a channel closed with running tasks' leases (a lost connection): the keeper sends it
            defer = self.closed or self.transport.defer_acks()
            if defer:
                self._pending_acks.setdefault(queue, []).append((eid, tag))
                self._pending_count += 1
                full = not self.closed and self._pending_count >= C.MAX_POP_BATCH
        if not defer:
            self._send_acks({queue: [(eid, tag)]})
        elif full:
            self.flush_acks()

    def _take_acks(self) -> dict[str, list[tuple[str, str]]]:
        with self._leases_lock:
            pending, self._pending_acks, self._pending_count = self._pending_acks, {}, 0
        return pending

    def _ack_calls(self, pending) -> list[tuple]:
        return [self._queue(queue).ack_call(pairs) for queue, pairs in pending.items()]

    def _keep_acks(self, pending):
        """Acks whose round trip failed go back in front of the waiting ones and are sent again
        with the next round trip; until then their leases are renewed."""
        with self._leases_lock:
            for queue, pairs in pending.items():
                self._pending_acks[queue] = pairs + self._pending_acks.get(queue, [])
                self._pending_count += len(pairs)

    def _check_acks(self, pending, replies):
        for (queue, pairs), codes in zip(pending.items(), replies):
            for (eid, _), code in zip(pairs, codes):
                if code == 1:
                    continue
                if code == ErrorCode.NOT_LEASED and self._gone(queue, eid):
                    # an ack sent again after the reply to its first sending was lost
                    logger.debug("celery-pq: ack of %s in %r: already done", eid, queue)
                    continue
                logger.warning("celery-pq: ack of %s in %r came after its lease ran out; it may run again",
                               eid, queue)

    def _gone(self, queue, eid) -> bool:
        """Whether an entry is no longer in its queue (acked, or removed)."""
        try:
            return not self.client.hexists(self._queue(queue).keys.ii, encode_id(eid))
        except rex.RedisError:
            return False

    def flush_acks(self):
        """Send the acks waiting for the next pop (before blocking, on a timer, at close); an
        error leaves them waiting."""
        pending = self._take_acks()
        if pending:
            self._send_acks(pending)

    def _send_acks(self, pending):
        try:
            replies = run_calls(self.client, self._ack_calls(pending))
        except BaseException:
            self._keep_acks(pending)
            raise
        self._check_acks(pending, replies)

    def _reject(self, tag, requeue):
        with self._leases_lock:
            held = self._leases.pop(tag, None)
        if held is None:
            return
        queue, eid = held
        q = self._queue(queue)
        result = q.requeue((eid, tag)) if requeue else q.dead_letter((eid, tag), "rejected")
        if result is None:
            logger.warning("celery-pq: reject of %s in %r came after its lease ran out", eid, queue)
        self._need_pop = True

    def _give_back(self, tag):
        with self._leases_lock:
            held = self._leases.pop(tag, None)
        if held is not None:
            queue, eid = held
            self._queue(queue).requeue((eid, tag), count_delivery=False)

    def _give_back_all(self, tags):
        try:
            for tag in tags:
                self._give_back(tag)
        except Transport.connection_errors:
            logger.warning("celery-pq: could not give back %d undelivered message(s) (Redis unreachable); "
                           "their leases run out and they are delivered again", len(tags))

    def held_leases(self) -> dict[str, list[tuple[str, str]]]:
        """{queue: [(entry id, token), ...]} of the leases this channel holds now (acked ones
        whose ack waits for the next round trip included: they must not lapse meanwhile)."""
        out: dict[str, list] = {}
        with self._leases_lock:
            for tag, (queue, eid) in self._leases.items():
                out.setdefault(queue, []).append((eid, tag))
            for queue, pairs in self._pending_acks.items():
                out.setdefault(queue, []).extend(pairs)
        return out

    # -- waiting without polling --------------------------------------------------------------
    def _wake_keys(self):
        keys = []
        for name in self.active_queues:
            view = self._view(name)
            q = self._queue(name)
            keys.append(q.keys.wk if view is None else q.keys.view_wake(*view))
        return keys

    def _arm(self):
        """Make sure the blocking reads are in flight; return [(connection, handler)]."""
        self.flush_acks()  # never block with acks unsent
        waits = []
        if self._bconn is not None and self._blpop_keys is not None:
            if monotonic() - self._blpop_sent > self.block_seconds + 15:
                # The server answers a BLPOP within block_seconds; silence means a dead link.
                self._drop_bconn()
                raise rex.ConnectionError("celery-pq: no reply to a blocking wait; the connection is dead")
            waits.append((self._bconn, self._on_blpop))
        elif self.active_queues and self.qos.can_consume() and not self._need_pop:
            if self._bconn is None:
                self._bconn = self.transport.new_connection()
                self._bconn.connect()
                self._bconn_id = _client_id(self._bconn)
            keys = self._wake_keys()
            self._bconn.send_command("BLPOP", *keys, self.block_seconds)
            self._blpop_keys = keys
            self._blpop_sent = monotonic()
            waits.append((self._bconn, self._on_blpop))
        if self._active_fanout:
            if self._pubsub is None:
                self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            wanted = set(self._active_fanout)
            if wanted - self._subscribed:
                self._pubsub.subscribe(*sorted(wanted - self._subscribed))
            if self._subscribed - wanted:
                self._pubsub.unsubscribe(*sorted(self._subscribed - wanted))
            self._subscribed = wanted
            waits.append((self._pubsub.connection, self._on_pubsub))
        return waits

    def _on_blpop(self) -> int:
        try:
            reply = self._bconn.read_response()
        except Exception:
            self._drop_bconn()
            raise
        self._blpop_keys = None
        self._need_pop = True  # a wake token, or the timeout: look again either way
        self.counters["wakeups" if reply else "timeouts"] += 1
        if reply and not self.qos.can_consume():
            # The prefetch window filled while we were blocked: leave the token for the next
            # wait (ours or another consumer's), or the work would sit until block_seconds.
            key, token = reply
            self.client.lpush(key, token)
            return 0
        return self._pop_and_deliver()

    def _on_pubsub(self) -> int:
        delivered = 0
        while True:
            msg = self._pubsub.get_message(timeout=0)
            if msg is None:
                if not self._pubsub.connection or not self._pubsub.connection.can_read(timeout=0):
                    return delivered
                continue
            if msg.get("type") != "message":
                continue
            channel = msg["channel"].decode() if isinstance(msg["channel"], bytes) else msg["channel"]
            queue = self._active_fanout.get(channel)
            if queue is None:
                continue
            try:
                message = loads(msg["data"])
            except Exception:  # noqa: BLE001
                logger.warning("celery-pq: unreadable fanout message on %r dropped", channel)
                continue
            self.connection._deliver(message, queue)
            delivered += 1

    def _unblock(self):
        """Wake our own BLPOP when the set of queues changed, so it re-arms at once."""
        if self._bconn is not None and self._blpop_keys is not None and self._bconn_id is not None:
            try:
                self.client.execute_command("CLIENT", "UNBLOCK", self._bconn_id)
            except rex.RedisError:
                pass  # not allowed (an ACL-confined user): the wait ends within block_seconds

    def holds_work(self) -> bool:
        """Leases or acks not yet sent that the lease keeper must serve."""
        with self._leases_lock:
            return bool(self._leases or self._pending_acks)

    def _drop_bconn(self):
        if self._bconn is not None:
            try:
                self._bconn.disconnect()
            except Exception:  # noqa: BLE001
                pass
        self._bconn = None
        self._blpop_keys = None
        self._need_pop = True

    def close(self):
        if self.closed:
            return
        try:
            try:
                self.flush_acks()
            except Transport.connection_errors:
                pass  # still leased in Redis: the leases run out and the messages come back
            super().close()
        finally:
            self._drop_bconn()
            if self._pubsub is not None:
                try:
                    self._pubsub.close()
                except Exception:  # noqa: BLE001
                    pass
                self._pubsub = None
            if self in self.transport.cycle_channels:
                self.transport.cycle_channels.remove(self)
            if self.transport.connection_lost and self.holds_work():
                self.transport.retire(self)


class Transport(virtual.Transport):
    Channel = Channel

    polling_interval = None
    default_port = DEFAULT_PORT
    driver_type = "redis"
    driver_name = "redis"
    use_tls = False

    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    connection_errors = virtual.Transport.connection_errors + (
        rex.ConnectionError,
        rex.TimeoutError,
        rex.BusyLoadingError,
        rex.AuthenticationError,
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
        self._pool = None
        self._pool_lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None
        self._loop = None
        self._readers: dict[int, tuple] = {}
        self._draining = False
        self._wake_pipe = None
        self.db = 0
        #: Set by kombu's teardown after a connection error (``_collect``).
        self.connection_lost = False
        self._closed = False
        #: Channels closed by a lost connection that still hold leases of running tasks or
        #: acks not yet sent; the lease keeper serves them until they hold nothing.
        self.retired: list[Channel] = []
        self._retired_lock = threading.Lock()

    def driver_version(self):
        return redis.__version__

    # -- connections --------------------------------------------------------------------------
    def _connparams(self, channel) -> dict:
        conninfo = self.client
        vhost = conninfo.virtual_host
        if isinstance(vhost, int):
            db = vhost
        else:
            text = (vhost or "").strip("/") or "0"
            try:
                db = int(text)
            except ValueError:
                raise ConfigError(f"the database in the broker URL must be a number, got {vhost!r}") from None
        self.db = db
        params = {
            "host": conninfo.hostname or "127.0.0.1",
            "port": conninfo.port or self.default_port,
            "db": db,
            "username": conninfo.userid or None,
            "password": conninfo.password or None,
            "socket_timeout": channel.socket_timeout,
            "socket_connect_timeout": channel.socket_connect_timeout,
            "socket_keepalive": channel.socket_keepalive,
            "health_check_interval": channel.health_check_interval,
            "client_name": channel.client_name,
            "max_connections": channel.max_connections,
        }
        ssl = conninfo.ssl
        if self.use_tls or ssl:
            params["connection_class"] = redis.SSLConnection
            if isinstance(ssl, dict):
                params.update(ssl)
        return params

    def redis_client(self, channel) -> redis.Redis:
        with self._pool_lock:
            if self._pool is None:
                self._pool = redis.ConnectionPool(**self._connparams(channel))
        return redis.Redis(connection_pool=self._pool)

    def new_connection(self):
        """A connection of our own (not from the pool) for a blocking read."""
        return self._pool.connection_class(**self._pool.connection_kwargs)

    def ensure_keeper(self):
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = LeaseKeeper(self)
            self._keeper.start()

    def close_connection(self, connection):
        self._unregister_readers()
        try:
            super().close_connection(connection)  # (a channel closed by a lost connection retires)
        finally:
            self._closed = True  # only now: the keeper stops when nothing retired
            self.release_pool()  # (a retired channel reconnects when it needs to)
            if self.keeper_channels() is None and self._keeper is not None:
                self._keeper.stop()
                self._keeper = None

    def _collect(self, connection):
        """kombu's teardown after a connection error (Celery's consumer reconnecting, kombu's
        ``Connection.ensure``), in place of a close: messages whose tasks are running keep
        their leases (``QoS.restore_unacked``), and the channels holding them, or holding acks
        not yet sent, retire: this transport's lease keeper goes on renewing those leases and
        sending those acks, on connections of this transport's pool, until nothing is left.
        The new connection consumes meanwhile."""
        self.connection_lost = True
        self.close_connection(connection)

    def keeper_channels(self) -> list[Channel] | None:
        """The channels whose leases the keeper serves now; None when it has nothing left
        (the connection is closed and no retired channel holds anything)."""
        with self._retired_lock:
            self.retired = [c for c in self.retired if c.holds_work()]
            if self._closed and not self.retired:
                return None
            retired = list(self.retired)
        return [c for c in self.cycle_channels if not c.closed] + retired

    def retire(self, channel):
        """Keep serving a channel closed by a lost connection: its running tasks' leases, its
        acks not yet sent."""
        with self._retired_lock:
            self.retired.append(channel)

    def release_pool(self):
        if self._pool is not None:
            self._pool.disconnect()

    def defer_acks(self) -> bool:
        """Acks can wait for the next pop while something here is sure to pop again soon."""
        return self._draining or self._loop is not None

    # -- draining without an event loop ---------------------------------------------------------
    def drain_events(self, connection, timeout=None):
        self._draining = True
        try:
            return self._drain(timeout)
        finally:
            self._draining = False

    def _drain(self, timeout):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            for channel in list(self.cycle_channels):
                if channel._pop_and_deliver():
                    return
            waits = {}
            for channel in list(self.cycle_channels):
                for conn, handler in channel._arm():
                    waits[conn] = handler
            remaining = None if deadline is None else deadline - monotonic()
            if remaining is not None and remaining <= 0:
                raise socket.timeout()
            if not waits:  # nothing to block on (prefetch window full): look again shortly
                sleep(min(0.05, remaining) if remaining is not None else 0.05)
                continue
            ready = [c for c in waits if c.can_read(timeout=0)]
            if not ready:
                socks = {c._sock: c for c in waits if c._sock is not None}
                wait = 1.0 if remaining is None else min(remaining, 1.0)
                readable, _, _ = select.select(list(socks), [], [], wait)
                ready = [socks[s] for s in readable]
            delivered = 0
            for conn in ready:
                delivered += waits[conn]() or 0
            if delivered:
                return

    # -- Celery's event loop --------------------------------------------------------------------
    def register_with_event_loop(self, connection, loop):
        self._loop = loop
        if self._wake_pipe is None:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._wake_pipe = (r, w)
        loop.add_reader(self._wake_pipe[0], self._on_self_wake)
        loop.on_tick.add(self._on_tick)

    def _on_self_wake(self):
        try:
            os.read(self._wake_pipe[0], 4096)
        except BlockingIOError:
            pass

    def _self_wake(self):
        try:
            os.write(self._wake_pipe[1], b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def _on_tick(self):
        # Celery's hub runs the acks it deferred (call_soon) at the top of each loop pass, just
        # before this tick: the prefetch window is up to date, and those acks ride along with
        # the pop. While work remains, the loop wakes itself (a pipe) instead of blocking in
        # Redis, so a backlog costs one round trip per pop.
        more = False
        for channel in list(self.cycle_channels):
            # After a delivery the acks it causes arrive as call_soon callbacks, which only run
            # on the next pass: wake once so that pass comes at once (not after a timer).
            if channel._pop_and_deliver():
                more = True
            for conn, handler in channel._arm():
                sock = conn._sock
                if sock is None:
                    continue
                fd = sock.fileno()
                known = self._readers.get(fd)
                if known is None or known[0] is not sock:
                    self._readers[fd] = (sock, conn, handler)
                    self._loop.add_reader(fd, self._on_readable, fd)
        if more:
            self._self_wake()

    def _on_readable(self, fd):
        entry = self._readers.get(fd)
        if entry is None:
            return
        sock, conn, handler = entry
        if conn._sock is not sock:  # reconnected: the next tick registers the new socket
            self._readers.pop(fd, None)
            self._loop.remove_reader(fd)
            return
        handler()
        # a blocking read that has been answered is re-armed on the next tick
        if getattr(handler, "__func__", None) is Channel._on_blpop:
            self._readers.pop(fd, None)
            self._loop.remove_reader(fd)

    def _unregister_readers(self):
        if self._loop is not None:
            fds = list(self._readers) + ([self._wake_pipe[0]] if self._wake_pipe else [])
            for fd in fds:
                try:
                    self._loop.remove_reader(fd)
                except Exception:  # noqa: BLE001
                    pass
            try:
                self._loop.on_tick.discard(self._on_tick)
            except Exception:  # noqa: BLE001
                pass
        self._readers.clear()
        self._loop = None
        if self._wake_pipe is not None:
            for fd in self._wake_pipe:
                os.close(fd)
            self._wake_pipe = None


def _celery_state():
    """celery.worker.state when a Celery worker runs in this process, else None."""
    import sys

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


def _per_tenant(label, value, kind):
    """An option given as one number for every tenant or as {tenant: number, "*": default}."""
    if value is None:
        return {}, None
    if isinstance(value, dict):
        table = dict(value)
        default = table.pop("*", None)
    else:
        table, default = {}, value
    for tenant, v in list(table.items()) + [("*", default)]:
        if not isinstance(tenant, str):
            raise ConfigError(f"{label}: tenant names are strings, got {tenant!r}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, kind) or not 0 < v < math.inf):
            raise ConfigError(f"{label} for {tenant!r} must be a positive number, got {v!r}")
    return table, default


def _seconds(name, value, *, zero=False) -> float:
    """A finite number of seconds, > 0 (or >= 0 with ``zero``), as a float; else ConfigError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        kind = "a number of seconds >= 0" if zero else "a positive number of seconds"
        raise ConfigError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    return float(value)


def _count(name, value, *, minimum, none=True) -> None:
    """An integer >= minimum (or None, with ``none``); else ConfigError."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        also = " or None" if none else ""
        raise ConfigError(f"{name} must be an integer >= {minimum}{also}, got {value!r} ({type(value).__name__})")


def _check_queue_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a queue name must be a non-empty string, got {name!r}")


def _client_id(conn) -> int | None:
    """The id of a blocking connection, for CLIENT UNBLOCK; None when this Redis user may not
    run CLIENT (an ACL without it): a change of the consumed queues then takes effect when the
    blocking read times out (within block_seconds)."""
    conn.send_command("CLIENT", "ID")
    try:
        return conn.read_response()
    except rex.ResponseError as exc:
        logger.info("celery-pq: CLIENT ID refused (%s); changes to the consumed queues take effect "
                    "within block_seconds", exc)
        return None


def publish_id(message) -> bytes | None:
    """The publish id of a message: the queue stores nothing for an id it has seen within
    ``dedupe_seconds``, so a publish retried after a lost reply is stored once.

    A Celery task message (its headers name ``id`` and ``task``) gets an id made from its task
    id, retries count, eta and body: kombu's and Celery's own publish retries prepare and put
    the message again, and carry the same id, while Celery's retry of a task (one more in
    ``retries``) is a publish of its own. Any other message: None, and the queue makes a random
    one for the insert call, which covers a retry within that call.
    """
    headers = message.get("headers") or {}
    if not (headers.get("id") and headers.get("task")):
        return None
    h = blake2b(digest_size=16)
    for part in (headers["id"], headers.get("retries"), headers.get("eta"), message.get("body")):
        text = str(part).encode()
        h.update(b"%d:" % len(text) + text)
    return h.digest()


def _eta_ms(eta) -> int | None:
    """Celery's ``eta`` header (ISO 8601) as Unix ms; naive times are UTC."""
    if not eta:
        return None
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        raise ValueError(f"message eta {eta!r} is not an ISO 8601 time; the message was not published") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0, int(when.timestamp() * 1000))


class TLSTransport(Transport):
    """``pqs://``: the same transport over TLS."""

    use_tls = True
