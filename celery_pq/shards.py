"""One queue split into shards: the relaxed distributed priority queue.

A queue with the transport option ``shards=N`` is N full queues (``PriorityQueue``), each under
its own hash tag (``keys.shard_names``: shard 0 is the queue itself, so ``shards=1`` is the queue
as it always was), so that on Redis Cluster each shard's scripts run on the node of its slot and
the shards spread over the masters. Each shard keeps its own entries, leases, dead letters,
delayed entries, views and fairness state; nothing crosses shards inside Redis.

Insert puts an entry in one shard: the tenant's (a hash of it) on a fair queue, so one tenant's
entries keep their order and its bucket there is its only one, with its whole rate (the default
tenant's entries too when it has a rate: docs/rate-limits.md, "Rate limits with shards"); else
the shard of the publish id (a hash of it), so a retried publish lands where the first one went
and is stored once; else a random shard. An entry inserted without an id gets a UUID
(``new_id``: made from its publish id when it has one, so that a retried publish names the entry
the first one stored), not the shard's own counter, whose numbers every shard would hand out
again: an id names one entry of the whole queue (remove, exists, change_priority by id).

Pop (``ShardedQueue.pop_with_acks``) peeks ``peek`` (k) shards chosen at random in one
pipelined round trip, reading the rank and enqueue time of the entry each would deliver first
(``peek_head.lua``, within the consumer's view), and pops from the best: the best rank, then
the oldest head. Under concurrency
the best may be empty by then (another consumer took it, or its index held only stale
pointers), or beaten (its head was taken and what is left there ranks below the second-best
peeked head: each pop but the last takes only entries that beat the next shard's peeked rank):
the second-best peeked is tried next, without a new peek round. When every peeked
shard is empty, the other shards are peeked too (one more round), so a consumer never sleeps
while any shard has a ready entry.

The ordering this gives: within one shard, strict priority and FIFO within a priority, as a
plain queue. Across shards, order is relaxed: a delivery can be outranked by entries waiting
in shards it did not peek (the rank error the benchmarks measure, ``benchmarks/relaxed.py``),
and FIFO within a priority holds exactly per shard only (across shards, the older of the peeked
heads goes first, to the millisecond). With one consumer and k = N the priority order is exact.
"""

from __future__ import annotations

import hashlib
import random
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from . import constants as C
from .errors import ConfigError, EntryNotFound
from .keys import split_dead
from .queue import Lease, Popped, PriorityQueue, ack_all, pop_with_acks
from .queue.calls import parse_head
from .queue.running import run_calls
from .queue.settings import MAX_PEEK
from .queue.values import mark_stored
from .sharded_reads import ShardedReads


def new_id(publish_id: bytes | str | None = None) -> str:
    """The id of an entry inserted into a sharded queue without one: unique across its shards
    (a lowercase UUID, stored in 17 bytes: ``ids.py``); the same for the same publish id."""
    if not publish_id:
        return str(uuid.uuid4())
    raw = publish_id if isinstance(publish_id, bytes) else publish_id.encode()
    return str(uuid.UUID(bytes=hashlib.blake2b(raw, digest_size=16).digest(), version=4))


def _hash(text: str | bytes) -> int:
    return zlib.crc32(text if isinstance(text, bytes) else text.encode())


class ShardedQueue(ShardedReads):
    """N ``PriorityQueue`` shards with the face of one (insert, pop, ack, stats, ...): the
    writes and pops here, what reads or changes every shard in ``ShardedReads``.

    Arguments:
        shards: the shard queues, shard 0 first (``queue.open_queue`` makes them).
        name: the queue's name (shard 0's).
        peek: shards peeked per pop (k); capped at the number of shards.
        rng: a ``random.Random`` (tests and benchmarks seed it).
        check_beaten: bound each pop but the last by the next peeked head's rank (the
            second-best check for a shard beaten meanwhile); False only to measure without it.
    """

    def __init__(
        self,
        shards: Sequence[PriorityQueue],
        name: str,
        *,
        peek: int = 2,
        rng: random.Random | None = None,
        check_beaten: bool = True,
    ):
        self.task_limits: dict[str, float] = {}  # (open_queue: the task_rate limits a publish follows)
        if not shards:
            raise ValueError("a sharded queue needs at least one shard")
        if isinstance(peek, bool) or not isinstance(peek, int) or not 1 <= peek <= MAX_PEEK:
            raise ConfigError(f"peek must be an integer 1..{MAX_PEEK}, got {peek!r}")
        self.shards = list(shards)
        self.name = name
        self.peek_count = min(peek, len(self.shards))
        self._by_name = {s.name: s for s in self.shards}
        self._rng = rng or random.Random()
        first = self.shards[0]
        #: A pop of one shard can be bounded by the next shard's head rank (not under
        #: tenant_first, whose order is not by rank).
        self._bounded = check_beaten and not (first.fair and first.fair_scope == "tenant_first")
        self.client = first.client
        self.key_prefix, self.is_dead = first.key_prefix, first.is_dead
        self.fair, self.fair_scope, self.scope = first.fair, first.fair_scope, first.scope
        self.technique, self.priority_order = first.technique, first.priority_order
        self.lease_seconds, self.max_deliveries = first.lease_seconds, first.max_deliveries
        #: The default tenant's entries spread over the shards, but for a rated default tenant:
        #: its entries go to one shard as a named tenant's do, whose bucket then holds its rate.
        self._rated_default = self.fair and bool(first.tenant_rate or (first.settings.rate or {}).get(""))
        #: Pops that found their best peeked shard empty and took the second-best (for the
        #: benchmarks), and pops whose k peeked shards were all empty while another was not.
        self.stats_second_best = 0
        self.stats_wider_peek = 0

    def __repr__(self):
        return f"<ShardedQueue {self.name!r} shards={len(self.shards)} peek={self.peek_count}>"

    def shard_of_lease(self, lease) -> PriorityQueue:
        """The shard a ``Lease`` (or an Entry) came from, by its ``queue``."""
        name = getattr(lease, "queue", None)
        shard = self._by_name.get(name) if isinstance(name, str) else None
        if shard is None:
            raise ValueError(
                f"{lease!r} is not a lease of a shard of {self.name!r}: a sharded queue acks, requeues "
                "and renews Lease objects (they carry their shard), not bare (id, token) pairs"
            )
        return shard

    # -- insert -----------------------------------------------------------------------------
    def shard_for(self, *, tenant: str | None = None, publish_id: bytes | str | None = None) -> PriorityQueue:
        """The shard an insert goes to: the tenant's on a fair queue (the default tenant's when it
        has a rate), else the publish id's, else a random one."""
        n = len(self.shards)
        if self.fair and (tenant or self._rated_default):
            return self.shards[_hash(tenant or "") % n]
        if publish_id:
            return self.shards[_hash(publish_id) % n]
        return self.shards[self._rng.randrange(n)]

    def insert(
        self, payload, priority: int = 0, *, tenant: str | None = None, publish_id: bytes | str | None = None, **kwargs
    ) -> str:
        """``PriorityQueue.insert`` into the shard ``shard_for`` picks."""
        shard = self.shard_for(tenant=tenant, publish_id=publish_id)
        if kwargs.get("id") is None:
            kwargs["id"] = new_id(publish_id)
        return shard.insert(payload, priority, tenant=tenant, publish_id=publish_id, **kwargs)

    def insert_unique(self, payload, priority: int = 0, *, unique, publish_id: bytes | str | None = None, **kwargs):
        """``PriorityQueue.insert_unique`` into the shard of the key (a key always lands on the
        same shard, so its standing entry is found there; a fair queue's tenant does not choose)."""
        shard = self.shards[_hash(unique.key) % len(self.shards)]
        if kwargs.get("id") is None:
            kwargs["id"] = new_id(publish_id)
        return shard.insert_unique(payload, priority, unique=unique, publish_id=publish_id, **kwargs)

    def insert_many(
        self, items, *, chunk: int = C.BULK_CHUNK, repeats: bool = False, remember: bool = True
    ) -> list[str] | tuple[list[str], list[bool]]:
        """``PriorityQueue.insert_many``, each item to the shard ``shard_for`` picks (one call per
        shard). On a failure, ``exc.stored`` (one per item, in the order given) has the ids of
        the shards done and of the failed shard's stored items; ``exc.items`` are the items not
        known to be stored, of that shard and of the shards not reached. ``repeats=True``: as
        ``PriorityQueue.insert_many``'s, ``(ids, repeated)`` in the order given; ``remember``: as
        ``PriorityQueue.insert_many``'s."""
        items = [
            item
            if len(item) > 2 and item[2] is not None
            else (*item[:2], new_id(item[5] if len(item) > 5 else None), *item[3:])
            for item in items
        ]
        groups: dict[int, list[int]] = {}
        for n, item in enumerate(items):
            tenant = item[3] if len(item) > 3 else None
            pid = item[5] if len(item) > 5 else None
            shard = self.shard_for(tenant=tenant, publish_id=pid)
            groups.setdefault(self.shards.index(shard), []).append(n)
        ids: list = [None] * len(items)
        repeated = [False] * len(items)
        order = sorted(groups)
        for g, s in enumerate(order):
            idx = groups[s]
            try:
                got: Any = self.shards[s].insert_many(
                    [items[i] for i in idx], chunk=chunk, repeats=repeats, remember=remember
                )
            except Exception as exc:
                for i, eid in zip(idx, getattr(exc, "stored", ())):
                    ids[i] = eid
                rest = [i for t in order[g + 1 :] for i in groups[t]]
                mark_stored(exc, list(ids), list(getattr(exc, "items", [])) + [items[i] for i in rest])
                raise
            if repeats:
                got, seen = got
                for i, r in zip(idx, seen):
                    repeated[i] = r
            for i, eid in zip(idx, got):
                ids[i] = eid
        return (ids, repeated) if repeats else ids

    # -- pop: peek k, pop the best, second-best under concurrency ------------------------------
    def peek_heads(
        self, shards: Sequence[PriorityQueue], view: tuple[int, int] | None = None
    ) -> list[tuple[int, int] | None]:
        """(rank, enqueued_ms) of the entry each of ``shards`` would deliver first (within
        ``view``), None for an empty or paused one: one pipelined round trip of read-only
        scripts (``peek_head.lua``)."""
        replies = run_calls(self.client, [s.head_call(view) for s in shards])
        return [parse_head(r) for r in replies]

    def _ranked(self, shards: Sequence[PriorityQueue], view) -> list[tuple[PriorityQueue, tuple[int, int]]]:
        """(shard, its head) of ``shards`` with a waiting entry, best first: best rank, then
        oldest head (ties of the same millisecond in random order)."""
        heads = self.peek_heads(shards, view)
        found = [(h, self._rng.random(), s) for h, s in zip(heads, shards) if h is not None]
        return [(s, h) for h, _, s in sorted(found, key=lambda x: x[:2])]

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> None:
        """None: a sharded queue's pop peeks its shards first, and waits for each reply."""
        return None

    def pop_with_acks(
        self,
        count: int = 1,
        *,
        acks: dict | None = None,
        lean: bool = False,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> tuple[Popped, dict]:
        """Pop up to ``count`` entries from the best of ``peek`` shards, sending ``acks``
        (``{shard: [(entry id, token), ...]}``) in the same round trip as the first pop.
        Returns (leases, whose ``queue`` is the shard that served; ack codes per shard);
        ``lean``: ``Delivery`` tuples instead of leases."""
        pending = dict(acks or {})
        codes: dict = {}
        peeked = self._rng.sample(self.shards, self.peek_count)
        for wider in (False, True):
            if wider:
                rest = [s for s in self.shards if s not in peeked]
                if not rest:
                    break
                peeked = rest
            best = self._ranked(peeked, view)
            # the best, then the second-best (and on: a consumer must not sleep while one has
            # work); each but the last takes only what still beats the next one's peeked head
            for attempt, (shard, _) in enumerate(best):
                bound = best[attempt + 1][1][0] if attempt + 1 < len(best) and self._bounded else None
                popped, got = pop_with_acks(
                    shard,
                    count,
                    acks=pending,
                    lean=lean,
                    lease_seconds=lease_seconds,
                    consumer=consumer,
                    view=view,
                    bound=bound,
                )
                codes.update(got)
                pending = {}
                if popped:
                    self.stats_second_best += attempt > 0
                    self.stats_wider_peek += wider
                    return popped, codes
        if pending:  # nothing anywhere, and acks to send
            codes.update(ack_all(pending))
        return Popped((), self.shards[0]), codes

    def pop(
        self,
        count: int = 1,
        *,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> Popped[Lease]:
        """Lease up to ``count`` entries from the best of ``peek`` shards (see the module)."""
        popped, _ = self.pop_with_acks(count, lease_seconds=lease_seconds, consumer=consumer, view=view)
        return popped

    # -- leases, by the shard each lease carries -------------------------------------------
    def _grouped(self, leases) -> dict[PriorityQueue, list]:
        out: dict[PriorityQueue, list] = {}
        for lease in leases:
            out.setdefault(self.shard_of_lease(lease), []).append(lease)
        return out

    def ack(self, lease: Lease, *, strict: bool = False) -> bool:
        return self.shard_of_lease(lease).ack(lease, strict=strict)

    def ack_many(self, leases: Sequence[Lease], *, strict: bool = False) -> list[bool]:
        done = {}
        for shard, group in self._grouped(leases).items():
            for lease, ok in zip(group, shard.ack_many(group, strict=strict)):
                done[id(lease)] = ok
        return [done[id(lease)] for lease in leases]

    def extend(
        self, leases: Sequence[Lease], lease_seconds: float | None = None, *, strict: bool = False
    ) -> list[bool]:
        done = {}
        for shard, group in self._grouped(leases).items():
            for lease, ok in zip(group, shard.extend(group, lease_seconds, strict=strict)):
                done[id(lease)] = ok
        return [done[id(lease)] for lease in leases]

    def requeue(self, lease: Lease, **kwargs) -> str | None:
        return self.shard_of_lease(lease).requeue(lease, **kwargs)

    def dead_letter(self, lease: Lease, reason: str = "rejected", **kwargs) -> str | None:
        return self.shard_of_lease(lease).dead_letter(lease, reason, **kwargs)

    def reclaim(self, **kwargs) -> dict:
        """Every shard's sweep; counts summed, ``skipped`` when every shard skipped."""
        out: Counter = Counter()
        skipped = True
        for s in self.shards:
            r = s.reclaim(**kwargs)
            skipped = skipped and r["skipped"]
            out.update({k: int(v) for k, v in r.items() if k != "skipped"})
        return {**out, "skipped": skipped, "more": bool(out["more"])}

    # -- by id ------------------------------------------------------------------------------
    def exists(self, id: str) -> bool:
        return any(s.exists(id) for s in self.shards)

    def remove(self, id: str) -> int:
        return sum(s.remove(id) for s in self.shards)

    def change_priority(self, id: str, priority: int) -> None:
        for s in self.shards:
            try:
                return s.change_priority(id, priority)
            except EntryNotFound:
                continue
        raise EntryNotFound(self.name, id)

    @property
    def dead(self) -> ShardedQueue:
        """The dead-letter queues of the shards, as one sharded queue (``<name>.dead``)."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        return ShardedQueue(
            [s.dead for s in self.shards], split_dead(self.name)[0] + ".dead", peek=self.peek_count, rng=self._rng
        )

    @property
    def explain(self):
        return self.shards[0].explain
