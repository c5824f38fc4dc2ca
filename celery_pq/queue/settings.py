"""A queue's settings (docs/settings.md): one frozen ``QueueSettings``, checked once, with one
error type (``ConfigError``, a ``ValueError``); ``open_queue`` opens every queue with one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..storage import constants as C
from ..storage.checks import count, number, seconds, text
from ..storage.errors import ConfigError
from ..storage.keys import MAX_SHARDS
from ..storage.records import FAIR_COSTS, FAIR_SCOPES
from .values import MAX_RATE, MAX_WEIGHT, MIN_RATE, MIN_WEIGHT

#: The peek count (the transport option ``peek``) at most.
MAX_PEEK = 64

#: The settings that need fairness on (a tenant for each entry).
TENANT_CAPS = ("tenant_concurrency", "tenant_rate", "max_length_per_tenant")


@dataclass(frozen=True)
class QueueSettings:
    """Every setting of one queue, checked when made (docs/settings.md). ``weights``,
    ``concurrency`` and ``rate``: the tenants' own tables, written to a fair queue when opened."""

    key_prefix: str = C.KEY_PREFIX
    technique: str = C.TECHNIQUE_T
    priority_order: str = C.HIGHER_FIRST
    lease_seconds: float = C.LEASE_SECONDS
    max_deliveries: int = C.MAX_DELIVERIES
    max_length: int | None = None
    fair: bool = False
    fair_scope: str = "within_priority"
    fair_cost: str = "tasks"
    tenant_concurrency: int | None = None
    tenant_rate: float | None = None
    max_length_per_tenant: int | None = None
    dedupe_seconds: float = C.DEDUPE_SECONDS
    max_dead_length: int | None = None
    event_log: int | None = 0
    expired: str = C.EXPIRED_DEAD_LETTER
    wait_replicas: int = 0
    wait_timeout: float = C.WAIT_TIMEOUT
    shards: int = 1
    peek: int = 2
    weights: dict | None = field(default=None, hash=False)
    concurrency: dict | None = field(default=None, hash=False)
    rate: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        keep = object.__setattr__  # frozen: the checked values replace the given ones once, here
        text("key_prefix", self.key_prefix, error=ConfigError)
        keep(self, "lease_seconds", seconds("lease_seconds", self.lease_seconds, error=ConfigError))
        keep(self, "dedupe_seconds", seconds("dedupe_seconds", self.dedupe_seconds, zero=True, error=ConfigError))
        if not isinstance(self.fair, bool):
            raise ConfigError(f"fair must be True or False, got {self.fair!r}")
        count("max_dead_length", self.max_dead_length, error=ConfigError)
        keep(self, "event_log", int(count("event_log", self.event_log, low=0, error=ConfigError) or 0))
        count("wait_replicas", self.wait_replicas, low=0, none=False, error=ConfigError)
        keep(self, "wait_timeout", seconds("wait_timeout", self.wait_timeout, error=ConfigError))
        keep(self, "max_deliveries", count("max_deliveries", self.max_deliveries, low=0, none=False, error=ConfigError))
        if self.technique not in C.TECHNIQUES:
            raise ConfigError(f"technique must be one of {C.TECHNIQUES}, got {self.technique!r}")
        if self.expired not in C.EXPIRED_POLICIES:
            raise ConfigError(f"expired must be one of {tuple(C.EXPIRED_POLICIES)}, got {self.expired!r}")
        if self.priority_order not in C.PRIORITY_ORDERS:
            raise ConfigError(f"priority_order must be one of {C.PRIORITY_ORDERS}, got {self.priority_order!r}")
        count("max_length", self.max_length, error=ConfigError)
        if self.fair_scope not in FAIR_SCOPES:
            raise ConfigError(f"fair_scope must be one of {tuple(FAIR_SCOPES)}, got {self.fair_scope!r}")
        if self.fair_cost not in FAIR_COSTS:
            raise ConfigError(f"fair_cost must be one of {tuple(FAIR_COSTS)}, got {self.fair_cost!r}")
        count("tenant_concurrency", self.tenant_concurrency, error=ConfigError)  # None: no cap
        count("max_length_per_tenant", self.max_length_per_tenant, error=ConfigError)
        if self.tenant_rate:  # 0 or None: no limit
            number("tenant_rate", self.tenant_rate, low=MIN_RATE, allow_low=True, high=MAX_RATE, error=ConfigError)
        else:
            number("tenant_rate", self.tenant_rate, allow_low=True, none=True, error=ConfigError)
        if any(getattr(self, k) for k in TENANT_CAPS) and not self.fair:
            raise ConfigError("tenant caps need fairness on (a tenant for each entry)")
        count("shards", self.shards, low=1, none=False, error=ConfigError)
        if self.shards > MAX_SHARDS:
            raise ConfigError(f"shards must be an integer 1..{MAX_SHARDS}, got {self.shards!r}")
        check_peek(self.peek)
        for label, table in self.tenant_tables().items():
            if table is not None and not isinstance(table, dict):
                raise ConfigError(f"{label} must be a dict {{tenant: value}}, got {table!r}")

    @property
    def scope(self) -> str:
        """The fair scope as the scripts take it (one letter)."""
        return FAIR_SCOPES[self.fair_scope]

    def tenant_tables(self) -> dict:
        """``configure_tenants(**settings.tenant_tables())``: the tenants named."""
        return {"weights": self.weights, "concurrency": self.concurrency, "rate": self.rate}

    def dead(self) -> QueueSettings:
        """The dead-letter queue's: technique T, never fair, no delivery limit, as long as
        ``max_dead_length`` (else ``max_length``) allows."""
        kept = ("key_prefix", "priority_order", "lease_seconds", "dedupe_seconds", "event_log", "expired")
        return QueueSettings(
            **{k: getattr(self, k) for k in kept},
            technique=C.TECHNIQUE_T,
            max_deliveries=0,
            max_dead_length=self.max_dead_length or self.max_length,
        )

    def with_mode(self, mode: dict) -> QueueSettings:
        """These settings with a recorded mode (fairness, scope, cost, priority order, technique); a
        queue recorded plain takes no tenant caps and counts tasks."""
        given = {k: v for k, v in mode.items() if v is not None}
        if not given.get("fair", self.fair):
            given.update(dict.fromkeys(TENANT_CAPS))
            given["fair_cost"] = "tasks"
        return replace(self, **given)

    def one_shard(self) -> QueueSettings:
        """These settings for one shard (or a queue of one)."""
        return self if self.shards == 1 else replace(self, shards=1)


def check_peek(peek) -> int:
    """The peek count (shards peeked per pop), checked."""
    if isinstance(peek, bool) or not isinstance(peek, int) or not 1 <= peek <= MAX_PEEK:
        raise ConfigError(f"peek must be an integer 1..{MAX_PEEK}, got {peek!r}")
    return peek


def tenant_setting(label: str, tenant: str, value):
    """A tenant's weight, concurrency cap or rate, checked."""
    if label == "weights":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_WEIGHT <= value <= MAX_WEIGHT:
            raise ValueError(f"weights[{tenant!r}] must be a number from {MIN_WEIGHT} to {MAX_WEIGHT}, got {value!r}")
        return value
    if label == "concurrency":
        return count(f"concurrency[{tenant!r}]", value, none=False)
    return number(f"rate[{tenant!r}]", value, low=MIN_RATE, allow_low=True, high=MAX_RATE)
