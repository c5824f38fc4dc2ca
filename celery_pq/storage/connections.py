"""How the transport reaches Redis: the one pool (or ``RedisCluster`` client) of a kombu connection
(one server, TLS, the master Sentinels name, or a Redis Cluster); which node holds a key; waiting out
a moving slot. Every connection is from that pool or made like its own, so after a failover all of
them find the new master. docs/deployments.md, docs/cluster.md ("How it works")."""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from contextlib import contextmanager, suppress
from typing import NoReturn
from urllib.parse import urlsplit

import redis
from redis import exceptions as rex
from redis.cluster import ClusterNode
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

from . import constants as C
from .errors import ClusterUnsettled, ConfigError
from .redact import redact
from .retrying import again_while_refused

logger = logging.getLogger(__name__)

#: Eviction policies that may drop any key (volatile-* ones touch only our sweep guard).
EVICTING_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})

#: The port of a sentinel named without one.
SENTINEL_PORT = 26379

#: The TLS arguments redis-py's SSL connection takes (``broker_use_ssl`` may name only these).
SSL_ARGUMENTS = frozenset(n for n in inspect.signature(redis.SSLConnection.__init__).parameters if n.startswith("ssl_"))


def broker_db(conninfo) -> int:
    """The broker URL's database (0 when none; several hosts may name it, alike; else ConfigError)."""
    named = [
        _db(conninfo.virtual_host),
        *(_db(urlsplit(url).path) for url in conninfo.alt or [] if isinstance(url, str)),
    ]
    given = {db for db in named if db is not None}
    if len(given) > 1:
        raise ConfigError(f"the hosts of the broker URL name different databases: {sorted(given)}")
    return given.pop() if given else 0


def _db(vhost) -> int | None:
    if isinstance(vhost, int):
        return vhost
    text = (vhost or "").strip("/")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"the database in the broker URL must be a number, got {vhost!r}") from None


def tls_arguments(ssl) -> dict:
    """redis-py's TLS arguments from kombu's ``ssl`` (True, or a dict of ``ssl_*`` names)."""
    if ssl is True or not ssl:
        return {}
    if not isinstance(ssl, dict):
        raise ConfigError(f"broker_use_ssl must be True or a dict of redis-py ssl_* arguments, got {redact(ssl)}")
    unknown = sorted(set(ssl) - SSL_ARGUMENTS)
    if unknown:
        raise ConfigError(
            f"broker_use_ssl: {', '.join(map(repr, unknown))} not known to redis-py; "
            f"it takes {', '.join(sorted(SSL_ARGUMENTS))}"
        )
    return dict(ssl)


def make_pool(conninfo, options, tls: bool) -> redis.ConnectionPool:
    """The pool of a kombu ``Connection``: plain, or with ``master_name`` one whose connections go to
    the master the sentinels name."""
    tls = tls or bool(conninfo.ssl)
    params = {
        "db": broker_db(conninfo),
        "username": conninfo.userid or None,
        "password": conninfo.password or None,
        **options.redis_kwargs(),
        **tls_arguments(conninfo.ssl),
    }
    if options.master_name is None:
        if tls:
            params["connection_class"] = redis.SSLConnection
        return redis.ConnectionPool(host=conninfo.hostname or "127.0.0.1", port=conninfo.port or C.REDIS_PORT, **params)
    sentinel_kwargs = options.sentinel_kwargs
    if sentinel_kwargs is None:
        sentinel_kwargs = {
            "socket_timeout": min(options.socket_timeout or C.SENTINEL_SOCKET_TIMEOUT, C.SENTINEL_SOCKET_TIMEOUT),
            "socket_connect_timeout": options.socket_connect_timeout or C.SENTINEL_SOCKET_TIMEOUT,
        }
    sentinels = url_addresses(conninfo, SENTINEL_PORT)
    manager = Sentinel(sentinels, min_other_sentinels=options.min_other_sentinels, sentinel_kwargs=sentinel_kwargs)
    cls = SentinelManagedSSLConnection if tls else SentinelManagedConnection
    return SentinelConnectionPool(options.master_name, manager, connection_class=cls, **params)


def make_cluster(conninfo, options, tls: bool) -> redis.RedisCluster:
    """The Redis Cluster client of a kombu connection whose URL names a seed node."""
    tls = tls or bool(conninfo.ssl)
    if options.master_name is not None:
        raise ConfigError(
            "cluster and master_name exclude each other: a Redis Cluster fails over by itself, without sentinels"
        )
    db = broker_db(conninfo)
    if db != 0:
        raise ConfigError(f"a Redis Cluster has only database 0; the broker URL names database {db}")
    params = {k: v for k, v in options.redis_kwargs().items() if v is not None}
    params.pop("health_check_interval", None)  # not a cluster argument (its nodes' connections check on use)
    if tls:
        params.update(ssl=True, **tls_arguments(conninfo.ssl))
    seeds = [ClusterNode(host, port) for host, port in url_addresses(conninfo, C.REDIS_PORT)]
    try:
        return redis.RedisCluster(
            startup_nodes=seeds, username=conninfo.userid or None, password=conninfo.password or None, **params
        )
    except rex.RedisClusterException as exc:
        if "Cluster mode is not enabled" in str(exc):
            raise ConfigError(
                "the transport option cluster is set, but the broker URL names a Redis that is not "
                "a cluster node (cluster-enabled no): drop the option for a single Redis"
            ) from None
        raise rex.ConnectionError(str(exc)) from exc  # no seed answered: retried as a lost connection


def check_not_a_cluster_node(client) -> None:
    """ConfigError when a client made for one Redis reached a cluster node; nothing without INFO rights."""
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except rex.ResponseError:
        return
    if enabled in (1, "1", b"1"):
        raise ConfigError(
            "the broker URL names a node of a Redis Cluster: set the transport option "
            '{"cluster": True} (broker_transport_options, or --transport-options for python -m celery_pq)'
        )


def is_cluster(client: object) -> bool:
    """Is ``client`` a Redis Cluster client? (Cached per class: asked on every call.)"""
    cls = type(client)
    known = _CLUSTER_CLASSES.get(cls)
    if known is None:
        known = _CLUSTER_CLASSES[cls] = issubclass(cls, redis.RedisCluster)
    return known


_CLUSTER_CLASSES: dict[type, bool] = {}


#: Failures after which a key's node may have changed: the call goes again through ``RedisCluster``.
REROUTE = (rex.AskError, rex.TryAgainError, rex.ClusterDownError, rex.ConnectionError, rex.TimeoutError, OSError)


#: redis-py's errors of a cluster whose slot is moving or layout changing (with the slot guard's
#: error replies, lua/includes/queue.lua): the call wrote nothing and may be made again.
UNSETTLED = (rex.TryAgainError, rex.AskError, rex.ClusterError, rex.SlotNotCoveredError)

#: How those begin as a script's error reply (a plain ResponseError).
_UNSETTLED_TEXT = (
    "Script attempted to access a non local key",
    "Script attempted to execute a command while the cluster is down",
    "Script attempted to execute a write command while the cluster is down",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "Multiple keys request during rehashing",
)


def unsettled(exc: BaseException) -> bool:
    """Is ``exc`` a cluster's "not now, the slot is moving" (see UNSETTLED)?"""
    return isinstance(exc, UNSETTLED) or (
        isinstance(exc, rex.ResponseError) and str(exc).removeprefix("ERR ").startswith(_UNSETTLED_TEXT)
    )


#: This process's counts: "rerouted", cluster calls sent again through ``RedisCluster``;
#: "refused", tries refused by a moving slot and made again.
settling = {"rerouted": 0, "refused": 0}

_cluster_retry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_cluster_retry(cluster, seconds: float) -> None:
    """Seconds a call through ``cluster`` retries a moving slot before ``ClusterUnsettled``."""
    _cluster_retry[cluster] = float(seconds)


_patience = threading.local()


@contextmanager
def impatient():
    """Within the block this thread's calls do not wait for a moving slot: the first refusal
    raises ``ClusterUnsettled`` (the lease keeper retries on its own timer instead)."""
    _patience.bound = 0.0
    try:
        yield
    finally:
        _patience.bound = None


def until_settled(cluster, key, attempt):
    """``attempt(n)``'s reply, made again while it fails ``unsettled`` (nothing written) for at most
    ``cluster_retry_seconds``; then ``ClusterUnsettled`` naming ``key``."""

    def refused(exc: Exception) -> bool:
        if not unsettled(exc):
            return False
        settling["refused"] += 1
        return True

    def bound() -> float:
        given = getattr(_patience, "bound", None)
        return _cluster_retry.get(cluster, C.CLUSTER_RETRY_SECONDS) if given is None else given

    def give_up(exc: Exception, waited: float) -> NoReturn:
        raise ClusterUnsettled(key, waited, exc) from exc

    return again_while_refused(
        attempt, refused, bound=bound, first=C.SETTLE_PAUSE_FIRST, most=C.SETTLE_PAUSE_MAX, give_up=give_up
    )


def node_client(client, key) -> redis.Redis:
    """The plain client of the server holding ``key`` (on a cluster, its slot's master now)."""
    if not is_cluster(client):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


class NodePipeline:
    """redis-py's pipeline on the keys of one hash tag, sent to the server holding ``key`` (TIME
    and MULTI allowed, unlike a cluster pipeline). On a cluster it is sent once more after a
    moved slot or failed node, and waits out a moving slot: ``with NodePipeline(c, key) as p:
    p.get(k); p.execute()``."""

    def __init__(self, client, key: str, transaction: bool = False):
        self.client, self.key, self.transaction = client, key, transaction
        self.calls: list[tuple] = []

    def __enter__(self) -> NodePipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.calls.clear()

    def __getattr__(self, name: str):
        def queued(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self

        return queued

    def execute(self) -> list:
        if is_cluster(self.client):
            return until_settled(self.client, self.key, lambda n: self._execute())
        return self._execute()

    def _execute(self) -> list:
        for attempt in (1, 2):
            with node_client(self.client, self.key).pipeline(transaction=self.transaction) as pipe:
                for name, args, kwargs in self.calls:
                    getattr(pipe, name)(*args, **kwargs)
                try:
                    return pipe.execute()
                except REROUTE:
                    if attempt == 2 or not is_cluster(self.client):
                        raise
            with suppress(rex.RedisError, OSError):  # the cluster client reads its layout again, if a node answers
                self.client.nodes_manager.initialize()
        raise AssertionError("unreachable")


def by_node(client, items, key_of) -> dict:
    """``{node client: [item, ...]}``, each item by the node of ``key_of(item)``, in order."""
    out: dict = {}
    for item in items:
        out.setdefault(node_client(client, key_of(item)), []).append(item)
    return out


def slot_groups(client, keys) -> dict:
    """``{group: [key, ...]}`` of keys one multi-key command may name (one per slot on a cluster)."""
    if not is_cluster(client):
        return {None: list(keys)} if keys else {}
    out: dict = {}
    for key in keys:
        out.setdefault(client.keyslot(key), []).append(key)
    return out


def url_addresses(conninfo, default_port: int) -> list[tuple[str, int]]:
    """(host, port) of the URL's ``;``-separated hosts (sentinels, or a cluster's seeds)."""
    urls = [u for u in (conninfo.alt or []) if isinstance(u, str)]
    if not urls:
        return [(conninfo.hostname or "127.0.0.1", conninfo.port or default_port)]
    out = []
    for url in urls:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            raise ConfigError(f"address {redact(url)} in the broker URL: {exc}") from None
        if not host:
            raise ConfigError(f"address {redact(url)} in the broker URL names no host")
        out.append((host, port or default_port))
    return out


def new_connection(pool: redis.ConnectionPool):
    """A connection made like the pool's, not from it (a blocking read holds it as it waits)."""
    return pool.connection_class(**pool.connection_kwargs)


def close_pool(pool) -> None:
    """Close the pool's connections (those to the sentinels, or to every cluster node, too)."""
    if is_cluster(pool):  # the client stays usable (they reconnect on use)
        for node in pool.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
        return
    pool.disconnect()
    manager = getattr(pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.connection_pool.disconnect()


def explained(exc: rex.ConnectionError, tls: bool) -> rex.ConnectionError:
    """A connection error at channel creation, said plainly when it is a refused certificate."""
    text = str(exc)
    if tls and ("CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text):
        return rex.ConnectionError(
            f"TLS: the Redis server's certificate was refused ({text}); check ssl_ca_certs in broker_use_ssl "
            "(the CA that signed the server's certificate) and the host name the URL names"
        )
    return exc


def warn_if_evicting(client) -> None:
    """Warn when the server (a cluster's master) may evict any key, losing messages; nothing without INFO rights."""
    nodes = [client.get_redis_connection(n) for n in client.get_primaries()] if is_cluster(client) else [client]
    for node in nodes:
        try:
            policy = node.info("memory").get("maxmemory_policy")
        except rex.ResponseError:
            return
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy in EVICTING_POLICIES:
            logger.warning(
                "celery-pq: Redis evicts keys when full (maxmemory-policy %s): any queue key may be "
                "dropped, losing messages or leaving a queue's tables out of step. Set maxmemory-policy "
                "noeviction for the broker: a full Redis then refuses a publish with an error instead",
                policy,
            )
            return
