"""How the transport reaches Redis: the one connection pool of a kombu connection.

The broker URL names one server (``pq://HOST:PORT/DB``, ``pqs://`` for TLS), or, with the
transport option ``master_name``, the Redis Sentinels that know which server is the master now
(``pq://s1:26379;pq://s2:26379;pq://s3:26379/0``: kombu splits the URL at ``;``, and every host
is then a sentinel). In the second form the pool is redis-py's ``SentinelConnectionPool``: each
new connection asks the sentinels for the master, and a connection that meets a demoted master
(its reply is READONLY) is closed and raises a connection error, so that the next attempt goes
to the new master. Every connection the transport opens comes from this pool or is made like
its connections (``new_connection``: the blocking reads of ``poller.py``), so after a failover
the shared client, the blocking reads, pub/sub and the lease keeper all find the new master.

With the transport option ``cluster``, the broker URL names any seed node of a Redis Cluster
(``pq://HOST:PORT``; several, ``pq://n1:7000;pq://n2:7000``, so that a reconnection finds one
alive when a seed is down): the client is then redis-py's ``RedisCluster`` (``make_cluster``), which
learns the nodes and their slots from it. Every key of one queue shares one hash tag, so each
script call, pipeline or blocking read about one queue goes to one node: ``node_client`` gives
the plain client of the master serving a key now (its own pool, so scripts are loaded per node
and run on a connection of that node), ``new_connection`` a blocking connection to it. A call
that meets a moved slot or a dead node goes through ``RedisCluster`` itself (``REROUTE``), which
learns the new layout and retries.

TLS settings come the kombu way: Celery's ``broker_use_ssl`` (kombu's ``ssl=``), a dict of
redis-py's ``ssl_*`` arguments (``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``, ...),
checked here when the pool is made.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from contextlib import contextmanager
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

#: Eviction policies that may drop any key, a queue's included. (The volatile-* policies evict
#: only keys with a time to live: of ours, only the sweep guard, whose loss costs one extra sweep.)
EVICTING_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})

#: The port of a sentinel named without one (Redis Sentinel's own default).
SENTINEL_PORT = 26379

#: The TLS arguments redis-py's SSL connection takes (``broker_use_ssl`` may name only these).
SSL_ARGUMENTS = frozenset(n for n in inspect.signature(redis.SSLConnection.__init__).parameters if n.startswith("ssl_"))


def broker_db(conninfo) -> int:
    """The database number of the broker URL (``/0`` when none). A URL of several hosts
    (``pq://s1;pq://s2/2``) may name it on any of them, the same on each."""
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
    """The pool of a kombu connection (``conninfo``: kombu's ``Connection``) with the channel's
    ``options``: a plain pool, or a sentinel-managed one when ``options.master_name`` is set."""
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
    return sentinel_pool(sentinel_addresses(conninfo), options, params, tls)


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
        raise rex.ConnectionError(str(exc)) from exc  # no seed answered: retried like any lost connection


def check_not_a_cluster_node(client) -> None:
    """ConfigError when a client made for one Redis reached a node of a Redis Cluster: its
    queues' scripts would meet MOVED replies (the option ``cluster`` is missing). Nothing when
    this user may not run INFO."""
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
    """Is ``client`` a Redis Cluster client? (Asked on every script call: known per class.)"""
    cls = type(client)
    known = _CLUSTER_CLASSES.get(cls)
    if known is None:
        known = _CLUSTER_CLASSES[cls] = issubclass(cls, redis.RedisCluster)
    return known


#: Client class -> is it a cluster client (a handful of classes in a process).
_CLUSTER_CLASSES: dict[type, bool] = {}


#: Replies and failures after which a key's node, as the cluster client knows it, may be wrong:
#: the call goes again through ``RedisCluster``, which refreshes the layout and retries.
REROUTE = (rex.AskError, rex.TryAgainError, rex.ClusterDownError, rex.ConnectionError, rex.TimeoutError, OSError)


#: Errors of a Redis Cluster whose slot is moving or whose layout is changing, raised by
#: redis-py (``TryAgainError``, an ``AskError``/``MovedError`` redirect it did not follow,
#: ``ClusterDownError``, ``ClusterError("TTL exhausted.")`` after its own retries,
#: ``SlotNotCoveredError``), and the error a script's slot guard gets while its queue's slot
#: migrates (lua/includes/queue.lua): the call wrote nothing, and may be made again once the
#: slot settles (``unsettled``).
UNSETTLED = (rex.TryAgainError, rex.AskError, rex.ClusterError, rex.SlotNotCoveredError)

#: How those errors begin when they come back as a script's error reply (a plain ResponseError):
#: Redis's refusal of a command a script ran (an ASK or TRYAGAIN inside it), and the replies.
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
    if isinstance(exc, UNSETTLED):
        return True
    if not isinstance(exc, rex.ResponseError):
        return False
    text = str(exc)
    return text.removeprefix("ERR ").startswith(_UNSETTLED_TEXT)


#: Counts of this process, for tests and metrics: "rerouted", script calls on a cluster that met
#: a moved or moving slot or a lost node on the node they went to, and went through redis-py's
#: cluster client (which follows ASK and MOVED, and tries TRYAGAIN again for a moment);
#: "refused", tries of a call refused because its slot was moving, after which it was made again.
settling = {"rerouted": 0, "refused": 0}

#: Per Redis Cluster client: seconds a call waits for a moving slot (``set_cluster_retry``); a
#: client not named here, C.CLUSTER_RETRY_SECONDS.
_cluster_retry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_cluster_retry(cluster, seconds: float) -> None:
    """How long a call through ``cluster`` (a ``RedisCluster``) is made again while its queue's
    slot migrates, before it fails with ``ClusterUnsettled`` (the transport option
    ``cluster_retry_seconds``)."""
    _cluster_retry[cluster] = float(seconds)


_patience = threading.local()


@contextmanager
def impatient():
    """Calls of this thread within the block do not wait for a moving slot: the first refusal
    raises ``ClusterUnsettled``. For the lease keeper, which tries again on its own timer: one
    queue's moving slot then holds up neither the renewals of the other queues nor its own
    renewals behind a sweep or an ack that cannot run until the slot settles."""
    _patience.bound = 0.0
    try:
        yield
    finally:
        _patience.bound = None


def until_settled(cluster, key, attempt):
    """``attempt(n)`` (n: the tries before it), made again while it fails with an ``unsettled``
    error (it wrote nothing: the slot guard, or Redis refused the call whole), after a pause that
    doubles from C.SETTLE_PAUSE_FIRST to C.SETTLE_PAUSE_MAX seconds, for at most
    ``cluster_retry_seconds``; then ``ClusterUnsettled`` naming ``key``. Its reply otherwise."""

    def refused(exc: Exception) -> bool:
        if not unsettled(exc):
            return False
        settling["refused"] += 1
        return True

    def bound() -> float:
        given = getattr(_patience, "bound", None)
        return _cluster_retry.get(cluster, C.CLUSTER_RETRY_SECONDS) if given is None else given

    def give_up(exc: Exception, waited: float) -> NoReturn:
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        raise ClusterUnsettled(name, waited, exc) from exc

    return again_while_refused(
        attempt, refused, bound=bound, first=C.SETTLE_PAUSE_FIRST, most=C.SETTLE_PAUSE_MAX, give_up=give_up
    )


def node_client(client, key) -> redis.Redis:
    """The plain client of the server that holds ``key``: ``client`` itself on one server, the
    master serving the key's slot (as the cluster client knows it now) on a cluster."""
    if not is_cluster(client):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def relearn(client) -> None:
    """Have a cluster client read the layout of the cluster again (after a failover or a moved
    slot); nothing on one server, nor when no node answers now (the next call tries again)."""
    if is_cluster(client):
        try:
            client.nodes_manager.initialize()
        except (rex.RedisError, OSError):
            pass


class NodePipeline:
    """A pipeline of commands on the keys of one hash tag, sent to the server that holds
    ``key`` (with TIME, or in MULTI, which a cluster client's own pipeline refuses). On a
    cluster, a pipeline that met a moved slot or a failed node is sent once more after the
    layout is read again, so a long-lived reader (the metrics exporter, ``stats --watch``)
    follows a failover; one that meets its slot moving waits for it (``until_settled``). Used
    as redis-py's: ``with NodePipeline(c, key) as p: p.get(k); p.execute()``."""

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
            relearn(self.client)
        raise AssertionError("unreachable")


def by_node(client, items, key_of) -> dict:
    """``{node client: [item, ...]}`` of ``items``, each by the node of ``key_of(item)``, in order."""
    out: dict = {}
    for item in items:
        out.setdefault(node_client(client, key_of(item)), []).append(item)
    return out


def slot_groups(client, keys) -> dict:
    """``{group: [key, ...]}``: keys one multi-key command (a BLPOP) may name together, in
    order. One group on a single server; one per hash slot on a cluster."""
    if not is_cluster(client):
        return {None: list(keys)} if keys else {}
    out: dict = {}
    for key in keys:
        out.setdefault(client.keyslot(key), []).append(key)
    return out


def primaries(client) -> list[redis.Redis]:
    """The plain client of every master (one, for a single server)."""
    if not is_cluster(client):
        return [client]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def sentinel_addresses(conninfo) -> list[tuple[str, int]]:
    """(host, port) of every sentinel the broker URL names (its ``;``-separated hosts)."""
    return url_addresses(conninfo, SENTINEL_PORT)


def url_addresses(conninfo, default_port: int) -> list[tuple[str, int]]:
    """(host, port) of every host the broker URL names (its ``;``-separated hosts): the
    sentinels of ``master_name``, the seed nodes of ``cluster``."""
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


def sentinel_pool(addresses, options, params: dict, tls: bool) -> SentinelConnectionPool:
    """A pool whose connections go to the master that the sentinels at ``addresses`` name."""
    sentinel_kwargs = options.sentinel_kwargs
    if sentinel_kwargs is None:
        # A sentinel that does not answer must not hold up the discovery of the master: the
        # next sentinel is asked after this long (or the shorter socket_timeout).
        sentinel_kwargs = {
            "socket_timeout": min(options.socket_timeout or C.SENTINEL_SOCKET_TIMEOUT, C.SENTINEL_SOCKET_TIMEOUT),
            "socket_connect_timeout": options.socket_connect_timeout or C.SENTINEL_SOCKET_TIMEOUT,
        }
    manager = Sentinel(addresses, min_other_sentinels=options.min_other_sentinels, sentinel_kwargs=sentinel_kwargs)
    cls = SentinelManagedSSLConnection if tls else SentinelManagedConnection
    return SentinelConnectionPool(options.master_name, manager, connection_class=cls, **params)


def new_connection(pool: redis.ConnectionPool):
    """A connection made like the pool's own, but not taken from it (a blocking read holds
    its connection for as long as it waits). A sentinel-managed one finds the master itself."""
    return pool.connection_class(**pool.connection_kwargs)


def close_pool(pool) -> None:
    """Close the pool's connections (and, for a sentinel pool, those to the sentinels; for a
    cluster client, those to every node)."""
    if is_cluster(pool):  # its nodes' pools; the client stays usable (they reconnect on use)
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


def eviction_policy(client: redis.Redis) -> str | None:
    """The server's ``maxmemory-policy`` (from ``INFO memory``; on a cluster, the first master's
    that evicts, else any master's), or None when this user may not ask (an ACL user without
    INFO) or the server does not say."""
    policy = None
    for node in primaries(client):
        try:
            policy = node.info("memory").get("maxmemory_policy")
        except rex.ResponseError:
            return None
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy in EVICTING_POLICIES:
            break
    return policy


def warn_if_evicting(client: redis.Redis) -> str | None:
    """Warn (loudly: an evicted key is a lost message, or a queue whose tables disagree) when
    the server may evict any key. Returns the policy found."""
    policy = eviction_policy(client)
    if policy in EVICTING_POLICIES:
        logger.warning(
            "celery-pq: Redis evicts keys when full (maxmemory-policy %s): any queue key may be "
            "dropped, losing messages or leaving a queue's tables out of step. Set maxmemory-policy "
            "noeviction for the broker: a full Redis then refuses a publish with an error instead",
            policy,
        )
    return policy
