"""The transport's options (``broker_transport_options``), each once with its default and check, all checked
when a channel is made. README.md ("Options") shows the same table (a test keeps them in step)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..queue import QueueSettings
from ..storage import constants as C
from ..storage.errors import ConfigError
from ..storage.keys import split_dead
from ..storage.redact import redact
from . import option_checks as ck
from .task_rates import celery_own_queue, on_queue
from .task_rates import check as _task_rate


class _FitsTheLease(float):
    """A default of seconds that is lowered to fit the lease (socket_timeout's)."""


def _option(default, check: Callable[[str, Any], Any] | None, doc: str, *, shown: str | None = None, redis=False):
    """One option: default, check, meaning (``shown``: README's default if other; ``redis``: a redis-py argument)."""
    return field(default=default, metadata={"check": check, "doc": doc, "shown": shown, "redis": redis})


def _setting(default, doc: str):
    """An option that is a queue's setting under the same name, checked by ``QueueSettings``."""
    return _option(default, None, doc)


@dataclass(frozen=True)
class Options:
    """Every transport option, checked (each field's ``doc``; README.md's table says more)."""

    key_prefix: str = _setting(C.KEY_PREFIX, "prefix of every Redis key and pub/sub channel")
    priority_order: str = _setting(C.HIGHER_FIRST, '"higher_first" (255 first, AMQP) or "lower_first" (0 first)')
    default_priority: int = _option(0, ck.priority, "priority 0..255 of a message published without one")
    lease_seconds: float = _setting(C.LEASE_SECONDS, "seconds a delivery stays leased unrenewed (visibility_timeout)")
    max_deliveries: int = _setting(C.MAX_DELIVERIES, "deliveries without an ack before <queue>.dead; 0: no limit")
    fair_key: str | None = _option(None, ck.key(none=True), 'None: fairness off; a header, or "module:function"')
    fair_weights: dict | None = _option(None, ck.weights, "{tenant: weight}; 1 for tenants not named", shown="{}")
    fair_scope: str = _setting("within_priority", '"within_priority" or "tenant_first"')
    fair_cost: str = _setting("tasks", 'what a delivery costs its tenant: "tasks", "time" or "declared"')
    max_length: int | None = _setting(None, "waiting entries per queue; beyond it QueueFull")
    max_length_per_tenant: int | None = _setting(None, "waiting entries per tenant; beyond it QueueFull")
    tenant_concurrency: int | dict | None = _option(
        None, ck.per_tenant(int), 'leased per tenant: n or {tenant: n, "*": n}'
    )
    tenant_rate: float | dict | None = _option(None, ck.per_tenant((int, float)), "deliveries per second per tenant")
    task_rate: dict | None = _option(None, _task_rate, "deliveries per second of a task, all workers", shown="{}")
    technique: str = _setting(C.TECHNIQUE_T, 'the patent technique of every queue, "T" or "S"')
    queue_techniques: dict | None = _option(None, ck.queue_techniques, "{queue: technique}, per queue")
    sweep_interval: float = _option(C.SWEEP_INTERVAL, ck.seconds, "seconds between sweeps of expired leases")
    renew_interval: float | None = _option(
        None, ck.seconds_or_none, "seconds between renewals of held leases", shown="lease_seconds / 3"
    )
    block_seconds: float = _option(C.BLOCK_SECONDS, ck.seconds, "server-side BLPOP timeout of an idle consumer")
    binding_cache_seconds: float = _option(5.0, ck.seconds_or_zero, "seconds a routing table is cached")
    batch_send: int = _option(
        C.BATCH_SEND, ck.count_up_to(C.BULK_CHUNK, low=0), "messages of a queue a producer batch sends as one call"
    )
    spin_wait_us: int = _option(
        C.SPIN_WAIT_US, ck.count_up_to(100_000, low=0), "microseconds a script call polls for its reply; 0: none"
    )
    socket_timeout: float = _option(
        _FitsTheLease(C.SOCKET_TIMEOUT),
        ck.seconds_or_none,
        "redis-py, seconds a reply may take",
        shown="30",
        redis=True,
    )
    socket_connect_timeout: float | None = _option(None, ck.seconds_or_none, "redis-py, seconds", redis=True)
    socket_keepalive: bool | None = _option(None, ck.flag(none=True), "redis-py", redis=True)
    health_check_interval: float = _option(25, ck.seconds_or_zero, "redis-py, seconds (None: 0)", redis=True)
    max_connections: int | None = _option(50, ck.count_or_none, "redis-py pool size, per connection", redis=True)
    client_name: str | None = _option(None, ck.name_or_none, "redis-py CLIENT SETNAME, no spaces", redis=True)
    max_message_bytes: int | None = _option(None, ck.count_or_none, "a larger message is refused (MessageTooLarge)")
    dedupe_seconds: float = _setting(C.DEDUPE_SECONDS, "a publish retried within this window stores nothing; 0: off")
    max_dead_length: int | None = _setting(None, "entries of <queue>.dead at most (None: max_length)")
    event_log: int | None = _setting(None, "None/0: no event log; else each queue's stream's length (docs/events.md)")
    expired: str = _setting(C.EXPIRED_DEAD_LETTER, 'an expired message: "dead_letter" or "drop" (docs/expiry.md)')
    cluster: bool = _option(
        False, ck.flag(none=False), "Redis Cluster: the broker URL names a seed node (docs/cluster.md)"
    )
    cluster_retry_seconds: float = _option(
        C.CLUSTER_RETRY_SECONDS, ck.seconds, "Redis Cluster: seconds a call waits out a moving slot"
    )
    master_name: str | None = _option(None, ck.name_or_none, "Redis Sentinel: the monitored master's name")
    sentinel_kwargs: dict | None = _option(None, ck.mapping_or_none, "redis-py connection arguments of the sentinels")
    min_other_sentinels: int = _option(0, ck.count_from_zero, "a sentinel seeing fewer other sentinels is not believed")
    wait_replicas: int = _setting(0, "a publish and an ack return once this many replicas have them; 0: off")
    wait_timeout: float = _setting(C.WAIT_TIMEOUT, "seconds a publish or ack waits for wait_replicas")
    shards: int = _setting(1, "shards of each queue (1..256): the relaxed priority queue (docs/relaxed.md)")
    peek: int = _setting(2, "with shards > 1: shards peeked per pop (1..64)")
    unique_key: str = _option("pq_unique", ck.key(none=False), 'the unique key\'s header, or "module:function"')
    unique_mode: str | dict = _option(
        "while_waiting", ck.unique_mode, 'a key\'s default mode; or {queue: mode, "*": ...}'
    )
    unique_seconds: float | dict = _option(60, ck.unique_seconds, "a key's default debounce / throttle seconds")
    revoke_removes: bool = _option(
        True, ck.flag(none=False), "a revoke broadcast removes its tasks' waiting and delayed messages"
    )

    #: The function of ``fair_key="module:function"`` (None for a header name).
    tenant_fn: Callable | None = field(default=None, init=False, repr=False, compare=False)
    #: The function of ``unique_key="module:function"`` (None for a header name).
    unique_fn: Callable | None = field(default=None, init=False, repr=False, compare=False)
    #: The queue settings among the options, checked (each queue's: ``queue_settings``).
    _settings: QueueSettings = field(default=None, init=False, repr=False, compare=False)  # type: ignore[assignment]

    def __repr__(self) -> str:  # sentinel_kwargs may hold a password
        shown = ", ".join(f"{f.name}={redact(getattr(self, f.name))}" for f in fields(self) if f.repr)
        return f"Options({shown})"

    def __post_init__(self):
        keep = object.__setattr__  # frozen: the checked values replace the given ones, once
        if self.health_check_interval is None:
            keep(self, "health_check_interval", 0)
        default_timeout = isinstance(self.socket_timeout, _FitsTheLease)
        for f in fields(self):
            if f.init and f.metadata["check"] is not None:
                keep(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        # fairness taken as on: that tenant caps need fair_key is the options' own rule (below)
        settings = QueueSettings(fair=True, **{name: getattr(self, name) for name in _QUEUE_SETTINGS})
        keep(self, "_settings", settings)
        for name in ("lease_seconds", "dedupe_seconds", "wait_timeout"):  # (as floats)
            keep(self, name, getattr(settings, name))
        renew, timeout = ck.fit_renewals(self.lease_seconds, self.renew_interval, self.socket_timeout, default_timeout)
        keep(self, "renew_interval", renew)
        keep(self, "socket_timeout", timeout)
        for name, fn_field in (("fair_key", "tenant_fn"), ("unique_key", "unique_fn")):
            keep(self, fn_field, ck.key_function(name, getattr(self, name)))
        fair_only = [k for k in _FAIR_ONLY if getattr(self, k)]
        if self.master_name is None and (self.sentinel_kwargs is not None or self.min_other_sentinels):
            raise ConfigError(
                "sentinel_kwargs and min_other_sentinels need master_name (the broker URL then names the sentinels)"
            )
        if self.fair_key is None and fair_only:
            raise ConfigError(f"{', '.join(fair_only)} need fair_key (a tenant for each message)")

    @classmethod
    def from_transport_options(cls, given: dict) -> Options:
        """The options among ``broker_transport_options``; an unknown name is logged once (``tell_unknown``)."""
        names = {f.name for f in fields(cls) if f.init}
        tell_unknown(given.keys() - names - KOMBU_OPTIONS, names)
        values = {k: v for k, v in given.items() if k in names}
        lease = values.pop("lease_seconds", None)
        lease = given.get("visibility_timeout") if lease is None else lease
        if lease is not None:
            values["lease_seconds"] = lease
        return cls(**values)

    # -- what the layers below take ------------------------------------------------------------
    def queue_settings(self, name: str) -> QueueSettings:
        """The settings of queue ``name``: a dead-letter queue is never fair and has no delivery
        limit; Celery's own queues have one shard; each shard holds its part of ``max_length``."""
        dead = name.endswith(".dead")
        task_rate = on_queue(self.task_rate, name)  # {tenant: rate}
        n = self.shards_of(split_dead(name)[0])
        fair = (self.fair_key is not None or bool(task_rate)) and not dead
        return replace(
            self._settings,
            technique=(self.queue_techniques or {}).get(name, self.technique),
            max_deliveries=0 if dead else self.max_deliveries,
            max_length=-(-self.max_length // n) if self.max_length and n > 1 else self.max_length,  # (rounded up)
            fair=fair,
            tenant_concurrency=_entry(self.tenant_concurrency) if fair else None,
            tenant_rate=_entry(self.tenant_rate) if fair else None,
            max_length_per_tenant=self.max_length_per_tenant if fair else None,
            shards=self.shards_of(name),
            weights=self.fair_weights,
            concurrency=_named(self.tenant_concurrency),
            rate={**_named(self.tenant_rate), **task_rate},
        )

    def shards_of(self, name: str) -> int:
        """``shards``, but 1 for Celery's own queues (replies, events: little, and in order)."""
        return 1 if celery_own_queue(name) else self.shards

    def unique_defaults(self, queue: str) -> tuple[str, float]:
        """(mode, seconds) of a unique key of queue ``queue`` whose message names neither."""
        return _entry(self.unique_mode, queue, "while_waiting"), float(_entry(self.unique_seconds, queue, 60))

    def redis_kwargs(self) -> dict:
        return {name: getattr(self, name) for name in _REDIS_KWARGS}


#: Transport options kombu (or Celery through it) reads: never warned of.
KOMBU_OPTIONS = frozenset(
    {
        "visibility_timeout",  # (our alias of lease_seconds)
        "polling_interval",
        "body_encoding",
        "deadletter_queue",
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
    }
)

_TOLD_UNKNOWN: set = set()
logger = logging.getLogger("celery_pq")


def tell_unknown(unknown, names) -> None:
    """Log each ``unknown`` option once per process, with the closest known name (a typo is no silent no-op)."""
    for name in set(unknown) - _TOLD_UNKNOWN:
        _TOLD_UNKNOWN.add(name)
        close = difflib.get_close_matches(str(name), sorted(set(names) | KOMBU_OPTIONS), n=1)
        logger.warning(
            "broker_transport_options: %r is not an option of celery-pq or kombu and is ignored%s",
            name,
            f" (did you mean {close[0]!r}?)" if close else "",
        )


_REDIS_KWARGS = tuple(f.name for f in fields(Options) if f.metadata.get("redis"))


#: The options that need fair_key.
_FAIR_ONLY = ("fair_weights", "tenant_concurrency", "tenant_rate", "max_length_per_tenant")
#: The options that are a queue's settings, under the same names (``QueueSettings``).
_QUEUE_SETTINGS = tuple(f.name for f in fields(Options) if f.init and f.metadata["check"] is None)


def _entry(value, name: str | None = None, fallback=None):
    """The value for ``name`` (None: those not named): the value, or a table's entry, its "*", else ``fallback``."""
    return value.get(name, value.get("*", fallback)) if isinstance(value, dict) else value


def _named(value) -> dict:
    """The tenants named in a per-tenant table (none when one number is given for all)."""
    return {k: v for k, v in value.items() if k != "*"} if isinstance(value, dict) else {}
