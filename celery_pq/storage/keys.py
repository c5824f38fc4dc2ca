"""The only place Redis key names are built.

Every key of one queue shares one Redis Cluster hash tag, ``{<base queue name>}``, so every
script touches one slot. The dead-letter queue ``<name>.dead`` lives under the tag of
``<name>``, so moving an entry to it stays inside one script and one slot.

Layout for queue ``orders`` with the default prefix ``pq``::

    pq:{orders}:ii    hash    entry id -> entry (header "|" payload)   identifier-indexed table
    pq:{orders}:pi    zset    ranks that have waiting entries (member and score = rank; rank + 0.5
                              while a compaction pass of the rank is under way)
    pq:{orders}:pi:<rank>  list  pointers seq(6 bytes) + entry id, FIFO   priority-indexed table
    pq:{orders}:pi:<rank>:f  list  the front of pi:<rank> during a compaction pass (current pointers
                              already looked at; lua/includes/index.lua)
    pq:{orders}:pi:<rank>:m, pi:mv   zset, set  while migrate_mode runs: the pointers gathered per
                              rank (score seq), the ids seen (lua/migrate.lua)
    pq:{orders}:lz    zset    entry id, score = lease deadline (ms, Redis clock)
    pq:{orders}:lt    hash    entry id -> "token,consumer,score,deliveries,flags,tenant"
    pq:{orders}:wk    list    wake tokens: a blocked consumer BLPOPs them
    pq:{orders}:sq    string  insertion sequence (INCR)
    pq:{orders}:dq    zset    the duplicates of every task id: len(id) (2 bytes) id seq (6 bytes), all
                              scores 0, so an id's duplicates are one lex range
    pq:{orders}:gd    string  sweep guard (SET NX PX), throttles lease reclaim
    pq:{orders}:dz    zset    delayed entries, score = due time (ms, Redis clock)
    pq:{orders}:vw    hash    registered priority views "lo-hi" -> 1
    pq:{orders}:vr    string  version of the view registry (INCR on each new view)
    pq:{orders}:wk:<lo>-<hi>  list  wake tokens of the consumers of one priority view
    pq:{orders}:te ts tb fv fc fn tw fr   fairness state (see lua/includes/fair.lua)
    pq:{orders}:md    string  the queue's mode, recorded on first use (fair, scope, order, technique),
                              then its switches: paused, event log cap (records.py)
    pq:{orders}:pd pe hash    publish ids seen in this and the last dedupe window -> entry id
    pq:{orders}:pt    string  start of the current dedupe window (ms, Redis clock)
    pq:{orders}:ct    hash    counters kept by the scripts (enqueued, delivered, acked, ...: see
                              queue.COUNTERS)
    pq:{orders}:td    hash    tenant -> deliveries (fair queues), kept by pop_fair
    pq:{orders}:ev    stream  the event log, when on (docs/events.md), capped MAXLEN ~ event_log
    pq:{orders}:gc    hash    cursors of the fairness clean-up in the sweep
    pq:{orders}:sw    string  time of the last sweep (ms, Redis clock; of the first leases until
                              a sweep runs): a longer gap than the sweep's ``gap_ms`` gives
                              leases back the time they had left
    pq:{orders}:uq    hash    unique key -> "<kind>|<until ms>|<entry id>": the entry standing for
                              the key, or a throttle record (lua/includes/unique.lua)
    pq:{orders}:ue    hash    entry id -> its unique key, for entries holding one (flag "u")
    pq:{orders}:dead:<same suffixes>   the dead-letter queue orders.dead
    pq:queues         set     names of declared queues
    pq:ttl            hash    queue name -> its message_ttl (ms), for queues declared with one

A queue split into shards (the transport option ``shards``, ``queue/sharded.py``) is N such queues:
shard 0 is the queue itself, with the keys above (so a queue of one shard is the queue as it
always was), shard i > 0 is the queue ``orders#<i>`` (``orders#<i>.<j>`` when the plain name
hashes badly), with its own tag ``{orders#<i>}`` and its own dead-letter queue
``orders#<i>.dead``. ``shard_names`` places the tags' hash slots apart (see ``shard_name``).
    pq:sink:{<id>}:done  hash  a Spark sink's progress (celery_pq/spark/sink/record.py): "<batch>:<partition>"
                              -> the partition's rows handled; the id is the streaming query's
    pq:sink:{<id>}:rate  hash  Unix second -> rows a Spark sink took in it (its rows_per_second cap)
    pq:bind:<exchange> set    routing table rows "routing_key\\x06\\x16pattern\\x06\\x16queue"
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .constants import KEY_PREFIX

DEAD_SUFFIX = ".dead"
BINDING_SEP = "\x06\x16"
#: Between a queue's name and a shard's number in the shard's queue name (``orders#3``).
SHARD_SEP = "#"
#: Most shards a queue may have (the transport option ``shards``).
MAX_SHARDS = 256

#: The stored suffix of each of one queue's keys (the name a script header gives the key) ->
#: the ``QueueKeys`` field that holds it, named for what it holds; in the order QueueKeys lists
#: them. The suffixes are what Redis stores: they never change.
FIELDS = {
    "ii": "entries",
    "pi": "priority_index",
    "lz": "lease_deadlines",
    "lt": "leases",
    "wk": "wake",
    "sq": "sequence",
    "gd": "sweep_guard",
    "dz": "delayed",
    "vw": "views",
    "vr": "views_version",
    "te": "tenant_entries",
    "ts": "tenant_schedule",
    "tb": "tenant_states",
    "fv": "virtual_times",
    "fc": "tenant_settings",
    "fn": "tenant_counts",
    "tw": "rate_parked",
    "fr": "token_buckets",
    "md": "mode",
    "pd": "publish_ids",
    "pe": "publish_ids_before",
    "pt": "publish_window",
    "ct": "counters",
    "gc": "fair_cursors",
    "td": "tenant_deliveries",
    "ev": "events",
    "sw": "last_sweep",
    "dq": "duplicate_index",
    "uq": "unique_keys",
    "ue": "unique_holders",
    "uz": "throttle_deadlines",
    "ub": "debounce_publishes",
}
#: Suffixes of one queue's keys, in the order QueueKeys lists them.
SUFFIXES = tuple(FIELDS)
#: The fairness state (lua/includes/fair.lua); a script binds these keys in its table FK.
FAIR_SUFFIXES = ("te", "ts", "tb", "fv", "fc", "fn", "tw", "fr")


def _tag(name: str) -> str:
    # A "{" or "}" inside the tag would end it early (Redis Cluster hashes the first {...});
    # escape them so every queue name gets its own whole tag.
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def split_dead(name: str) -> tuple[str, bool]:
    """``"orders.dead"`` -> ``("orders", True)``; ``"orders"`` -> ``("orders", False)``."""
    if name.endswith(DEAD_SUFFIX) and len(name) > len(DEAD_SUFFIX):
        return name[: -len(DEAD_SUFFIX)], True
    return name, False


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue, each field named for what it holds (``FIELDS``: the stored
    suffix of each; the layout above)."""

    name: str
    entries: str  # ii
    priority_index: str  # pi
    lease_deadlines: str  # lz
    leases: str  # lt
    wake: str  # wk
    sequence: str  # sq
    sweep_guard: str  # gd
    delayed: str  # dz
    views: str  # vw
    views_version: str  # vr
    tenant_entries: str  # te
    tenant_schedule: str  # ts
    tenant_states: str  # tb
    virtual_times: str  # fv
    tenant_settings: str  # fc
    tenant_counts: str  # fn
    rate_parked: str  # tw
    token_buckets: str  # fr
    mode: str  # md
    publish_ids: str  # pd
    publish_ids_before: str  # pe
    publish_window: str  # pt
    counters: str  # ct
    fair_cursors: str  # gc
    tenant_deliveries: str  # td
    events: str  # ev
    last_sweep: str  # sw
    duplicate_index: str  # dq
    unique_keys: str  # uq
    unique_holders: str  # ue
    throttle_deadlines: str  # uz
    debounce_publishes: str  # ub

    @property
    def stem(self) -> str:
        """``<prefix>:{<tag>}:`` (``...:dead:`` for a dead-letter queue): the scripts derive the
        keys they are not handed from this stem of their first key."""
        return self.entries[:-2]

    def all(self) -> list[str]:
        return [getattr(self, f) for f in FIELDS.values()] + self.levels() + self.migration()

    def level(self, rank: int) -> str:
        """The list of pointers of one rank (0 is served first) in the priority index."""
        return f"{self.priority_index}:{rank}"

    def front(self, rank: int) -> str:
        """The front list of a compaction pass of one rank (lua/includes/index.lua): while it
        holds pointers, they come before those of ``level(rank)``."""
        return f"{self.priority_index}:{rank}:f"

    def levels(self) -> list[str]:
        return [self.level(r) for r in range(256)] + [self.front(r) for r in range(256)]

    def migration(self) -> list[str]:
        """The keys a ``migrate_mode`` in progress holds (lua/migrate.lua): the pointers gathered
        per rank, and the ids seen."""
        return [f"{self.priority_index}:{r}:m" for r in range(256)] + [f"{self.priority_index}:mv"]

    def view_wake(self, lo: int, hi: int) -> str:
        """Wake list of the consumers of the priority view covering ranks lo..hi."""
        return f"{self.wake}:{lo}-{hi}"


#: Key names of a script header that stand for a key of the queue's dead-letter queue (a
#: dead-letter queue's own keys stand in for its own: it has none).
DEAD_NAMES = {"dii": "ii", "dpi": "pi", "dwk": "wk", "dsq": "sq"}


def script_keys(names, own: QueueKeys, dead: QueueKeys) -> list[str]:
    """The keys named ``names`` (a script header's, see ``scripts.signature``) of one queue."""
    return [getattr(dead, FIELDS[DEAD_NAMES[n]]) if n in DEAD_NAMES else getattr(own, FIELDS[n]) for n in names]


def queue_keys(name: str, prefix: str = KEY_PREFIX) -> QueueKeys:
    base, dead = split_dead(name)
    stem = f"{prefix}:{{{_tag(base)}}}:" + ("dead:" if dead else "")
    return QueueKeys(name, *(stem + s for s in SUFFIXES))


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
    """Where shard ``i`` goes on the ring of slots, as a fraction of it from shard 0: the
    van der Corput sequence (0, 1/2, 1/4, 3/4, 1/8, ...), so the first N shards are spread
    evenly for every N, and a shard's place does not depend on how many shards there are."""
    out, scale = 0.0, 0.5
    while i:
        out += scale * (i & 1)
        i >>= 1
        scale /= 2
    return out


@lru_cache(maxsize=4096)
def shard_name(base: str, i: int) -> str:
    """The queue name of shard ``i`` of queue ``base``: ``base`` itself for shard 0, else
    ``base#i``, or ``base#i.j`` with the smallest j that puts the shard's hash slot within 16
    slots of its place (``_spread``; a few hundred tries of CRC16, once per process). The places depend on i and the slot of
    ``base`` only, so growing a queue from 4 shards to 8 keeps the names of shards 0..3, and the
    shards' slots (hence the cluster masters owning them) are spread out rather than random."""
    if i == 0:
        return base
    if not 0 < i < MAX_SHARDS:
        raise ValueError(f"shard number must be 0..{MAX_SHARDS - 1}, got {i!r}")
    ring = REDIS_CLUSTER_HASH_SLOTS
    target = (_slot(base) + _spread(i) * ring) % ring
    reach = ring / 1024  # 16 slots: under a quarter of the gap between any two of 256 shards
    for j in range(100_000):
        name = f"{base}{SHARD_SEP}{i}" + (f".{j}" if j else "")
        off = abs(_slot(name) - target)
        if min(off, ring - off) <= reach:
            return name
    return f"{base}{SHARD_SEP}{i}"  # never reached: some j of the first few thousand fits


def shard_names(base: str, n: int) -> list[str]:
    """The queue names of the ``n`` shards of queue ``base`` (``orders.dead`` gives the dead-letter
    queues of the shards of ``orders``)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer 1..{MAX_SHARDS}, got {n!r}")
    live, dead = split_dead(base)
    return [shard_name(live, i) + (DEAD_SUFFIX if dead else "") for i in range(n)]
