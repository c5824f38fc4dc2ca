"""The only place Redis key names are built: one queue's keys (``queue_keys``), all under one Redis
Cluster hash tag ``{<queue>}`` (its dead-letter queue's too), the keys shared by the queues, and
the names of a sharded queue's shards (``shard_names``). docs/key-layout.md lists them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .constants import KEY_PREFIX

DEAD_SUFFIX = ".dead"
BINDING_SEP = "\x06\x16"
#: Between a queue's name and a shard's number in the shard's queue name (``orders#3``).
SHARD_SEP = "#"
#: Most shards a queue may have (the transport option ``shards``).
MAX_SHARDS = 256

#: The fairness state (lua/includes/fair.lua); a script binds these keys in its table FK.
FAIR_SUFFIXES = ("te", "ts", "tb", "fv", "fc", "fn", "tw", "fr")


def _tag(name: str) -> str:
    # a "{" or "}" would end the tag early (Redis Cluster hashes the first {...})
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def split_dead(name: str) -> tuple[str, bool]:
    """``"orders.dead"`` -> ``("orders", True)``; ``"orders"`` -> ``("orders", False)``."""
    if name.endswith(DEAD_SUFFIX) and len(name) > len(DEAD_SUFFIX):
        return name[: -len(DEAD_SUFFIX)], True
    return name, False


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue, each field with its key's stored suffix (a script header's name; fixed)."""

    name: str
    entries: str = field(metadata={"suffix": "ii"})
    priority_index: str = field(metadata={"suffix": "pi"})
    lease_deadlines: str = field(metadata={"suffix": "lz"})
    leases: str = field(metadata={"suffix": "lt"})
    wake: str = field(metadata={"suffix": "wk"})
    sequence: str = field(metadata={"suffix": "sq"})
    sweep_guard: str = field(metadata={"suffix": "gd"})
    delayed: str = field(metadata={"suffix": "dz"})
    views: str = field(metadata={"suffix": "vw"})
    views_version: str = field(metadata={"suffix": "vr"})
    tenant_entries: str = field(metadata={"suffix": "te"})
    tenant_schedule: str = field(metadata={"suffix": "ts"})
    tenant_states: str = field(metadata={"suffix": "tb"})
    virtual_times: str = field(metadata={"suffix": "fv"})
    tenant_settings: str = field(metadata={"suffix": "fc"})
    tenant_counts: str = field(metadata={"suffix": "fn"})
    rate_parked: str = field(metadata={"suffix": "tw"})
    token_buckets: str = field(metadata={"suffix": "fr"})
    mode: str = field(metadata={"suffix": "md"})
    publish_ids: str = field(metadata={"suffix": "pd"})
    publish_ids_before: str = field(metadata={"suffix": "pe"})
    publish_window: str = field(metadata={"suffix": "pt"})
    counters: str = field(metadata={"suffix": "ct"})
    fair_cursors: str = field(metadata={"suffix": "gc"})
    tenant_deliveries: str = field(metadata={"suffix": "td"})
    lease_charges: str = field(metadata={"suffix": "lc"})
    tenant_held: str = field(metadata={"suffix": "th"})
    events: str = field(metadata={"suffix": "ev"})
    last_sweep: str = field(metadata={"suffix": "sw"})
    duplicate_index: str = field(metadata={"suffix": "dq"})
    unique_keys: str = field(metadata={"suffix": "uq"})
    unique_holders: str = field(metadata={"suffix": "ue"})
    throttle_deadlines: str = field(metadata={"suffix": "uz"})
    debounce_publishes: str = field(metadata={"suffix": "ub"})

    def all(self) -> list[str]:
        """Every key of the queue, with those of a ``migrate_mode`` under way (lua/migrate.lua)."""
        moving = [f"{self.priority_index}:{r}:m" for r in range(256)] + [f"{self.priority_index}:mv"]
        return [getattr(self, f) for f in FIELDS.values()] + self.levels() + moving

    def level(self, rank: int) -> str:
        """The list of pointers of one rank (0 is served first) in the priority index."""
        return f"{self.priority_index}:{rank}"

    def front(self, rank: int) -> str:
        """The front list of a rank's compaction pass, ahead of ``level(rank)`` (lua/includes/index.lua)."""
        return f"{self.priority_index}:{rank}:f"

    def levels(self) -> list[str]:
        return [self.level(r) for r in range(256)] + [self.front(r) for r in range(256)]

    def view_wake(self, lo: int, hi: int) -> str:
        """Wake list of the consumers of the priority view covering ranks lo..hi."""
        return f"{self.wake}:{lo}-{hi}"


#: Stored suffix of each key of a queue -> the ``QueueKeys`` field, in QueueKeys' order.
FIELDS = {f.metadata["suffix"]: f.name for f in fields(QueueKeys)[1:]}


#: Script header names of the dead-letter queue's keys (a dead-letter queue's stand for its own).
DEAD_NAMES = {"dii": "ii", "dpi": "pi", "dwk": "wk", "dsq": "sq"}


def script_keys(names, own: QueueKeys, dead: QueueKeys) -> list[str]:
    """The keys named ``names`` (a script header's: ``scripts.signature``) of one queue."""
    return [getattr(dead, FIELDS[DEAD_NAMES[n]]) if n in DEAD_NAMES else getattr(own, FIELDS[n]) for n in names]


def queue_keys(name: str, prefix: str = KEY_PREFIX) -> QueueKeys:
    base, dead = split_dead(name)
    stem = f"{prefix}:{{{_tag(base)}}}:" + ("dead:" if dead else "")
    return QueueKeys(name, *(stem + s for s in FIELDS))


def dead_queue_name(name: str) -> str:
    base, dead = split_dead(name)
    if dead:
        raise ValueError(f"{name!r} is a dead-letter queue; it has no dead-letter queue of its own")
    return base + DEAD_SUFFIX


def queues_key(prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}:queues"


def message_ttls_key(prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}:ttl"


def sink_record_key(sink: str, prefix: str = KEY_PREFIX) -> str:
    """The progress record of a Spark sink ``sink`` (a streaming query's id), a hash."""
    return f"{prefix}:sink:{{{_tag(sink)}}}:done"


def sink_rate_key(sink: str, prefix: str = KEY_PREFIX) -> str:
    """The rows a Spark sink took in each Unix second (its ``rows_per_second`` cap), a hash."""
    return f"{prefix}:sink:{{{_tag(sink)}}}:rate"


def binding_key(exchange: str, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}:bind:{exchange}"


def fanout_channel(exchange: str, db: int = 0, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}:fanout:{db}:{exchange}"


def _slot(name: str) -> int:
    """The Redis Cluster hash slot of every key of queue ``name`` (the slot of its tag)."""
    return key_slot(_tag(name).encode())


def _spread(i: int) -> float:
    """Shard ``i``'s place on the ring of slots from shard 0, as a fraction: the van der Corput
    sequence (0, 1/2, 1/4, 3/4, ...), even for every N and independent of N."""
    out, scale = 0.0, 0.5
    while i:
        out += scale * (i & 1)
        i >>= 1
        scale /= 2
    return out


@lru_cache(maxsize=4096)
def shard_name(base: str, i: int) -> str:
    """The queue name of shard ``i`` of ``base``: ``base`` for shard 0, else ``base#i`` or
    ``base#i.j``, the smallest j putting its slot within 16 of its place (``_spread``): spread
    over the masters, and growing from 4 shards to 8 keeps the names of 0..3."""
    if i == 0:
        return base
    if not 0 < i < MAX_SHARDS:
        raise ValueError(f"shard number must be 0..{MAX_SHARDS - 1}, got {i!r}")
    ring = REDIS_CLUSTER_HASH_SLOTS
    target = (_slot(base) + _spread(i) * ring) % ring
    reach = ring / 1024  # 16 slots: under a quarter of the gap between two of 256 shards
    for j in range(100_000):
        name = f"{base}{SHARD_SEP}{i}" + (f".{j}" if j else "")
        off = abs(_slot(name) - target)
        if min(off, ring - off) <= reach:
            return name
    return f"{base}{SHARD_SEP}{i}"  # never reached: some j of the first few thousand fits


def shard_names(base: str, n: int) -> list[str]:
    """The queue names of the ``n`` shards of ``base`` (of ``orders.dead``: the shards' dead-letter queues)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer 1..{MAX_SHARDS}, got {n!r}")
    live, dead = split_dead(base)
    return [shard_name(live, i) + (DEAD_SUFFIX if dead else "") for i in range(n)]
