"""One queue split into shards: the relaxed distributed priority queue.

A queue with the transport option ``shards=N`` is N full queues (``PriorityQueue``), each under
its own hash tag (``keys.shard_names``: shard 0 is the queue itself, so ``shards=1`` is the queue
as it always was), so that on Redis Cluster each shard's scripts run on the node of its slot and
the shards spread over the masters. Each shard keeps its own entries, leases, dead letters,
delayed entries, views and fairness state; nothing crosses shards inside Redis.

Insert puts an entry in one shard: the tenant's (a hash of it) on a fair queue, so one tenant's
entries keep their order; else the shard of the publish id (a hash of it), so a retried publish
lands where the first one went and is stored once; else a random shard. An entry inserted
without an id gets a UUID (``new_id``: made from its publish id when it has one, so that a
retried publish names the entry the first one stored), not the shard's own counter, whose
numbers every shard would hand out again: an id names one entry of the whole queue (remove, exists,
change_priority by id).

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
from typing import Callable, Sequence

from . import constants as C
from .errors import EntryNotFound
from .keys import shard_names, split_dead
from .queue import Entry, Lease, Popped, PriorityQueue, ack_all, pop_with_acks, run_calls

#: The peek count (the transport option ``peek``) at most.
MAX_PEEK = 64


def shards_of(q) -> list[PriorityQueue]:
    """The shards of a queue: ``q.shards`` for a ``ShardedQueue``, else ``[q]``."""
    return list(q.shards) if isinstance(q, ShardedQueue) else [q]


def pop_any(q, count: int = 1, *, acks: dict | None = None, **pop_args) -> tuple[Popped, dict]:
    """``queue.pop_with_acks`` for a plain or a sharded queue: (leases, ack codes); the
    leases' ``queue`` is the shard they came from."""
    if isinstance(q, ShardedQueue):
        return q.pop_with_acks(count, acks=acks, **pop_args)
    return pop_with_acks(q, count, acks=acks, **pop_args)


def new_id(publish_id: bytes | str | None = None) -> str:
    """The id of an entry inserted into a sharded queue without one: unique across its shards
    (a lowercase UUID, stored in 17 bytes: ``ids.py``); the same for the same publish id."""
    if not publish_id:
        return str(uuid.uuid4())
    raw = publish_id if isinstance(publish_id, bytes) else publish_id.encode()
    return str(uuid.UUID(bytes=hashlib.blake2b(raw, digest_size=16).digest(), version=4))


def _hash(text: str | bytes) -> int:
    return zlib.crc32(text if isinstance(text, bytes) else text.encode())


class ShardedQueue:
    """N ``PriorityQueue`` shards with the face of one (insert, pop, ack, stats, ...).

    Arguments:
        shards: the shard queues, shard 0 first (``ShardedQueue.open`` makes them).
        name: the queue's name (shard 0's).
        peek: shards peeked per pop (k); capped at the number of shards.
        rng: a ``random.Random`` (tests and benchmarks seed it).
        check_beaten: bound each pop but the last by the next peeked head's rank (the
            second-best check for a shard beaten meanwhile); False only to measure without it.
    """

    def __init__(self, shards: Sequence[PriorityQueue], name: str, *, peek: int = 2,
                 rng: random.Random | None = None, check_beaten: bool = True):
        if not shards:
            raise ValueError("a sharded queue needs at least one shard")
        if isinstance(peek, bool) or not isinstance(peek, int) or not 1 <= peek <= MAX_PEEK:
            raise ValueError(f"peek must be an integer 1..{MAX_PEEK}, got {peek!r}")
        self.shards = list(shards)
        self.name = name
        self.peek_count = min(peek, len(self.shards))
        self._by_name = {s.name: s for s in self.shards}
        self._rng = rng or random.Random()
        first = self.shards[0]
        #: A pop of one shard can be bounded by the next shard's head rank (not under
        #: tenant_first, whose order is not by rank).
        self._bounded = check_beaten and not (first.fair and first.fair_scope == "tenant_first")
        for attr in ("client", "fair", "fair_scope", "technique", "priority_order", "key_prefix", "is_dead",
                     "lease_seconds", "max_deliveries", "scope"):
            setattr(self, attr, getattr(first, attr))
        #: Pops that found their best peeked shard empty and took the second-best (for the
        #: benchmarks), and pops whose k peeked shards were all empty while another was not.
        self.stats_second_best = 0
        self.stats_wider_peek = 0

    @classmethod
    def open(cls, make: Callable[[str], PriorityQueue], name: str, shards: int, *, peek: int = 2,
             rng: random.Random | None = None) -> "ShardedQueue":
        """The queue ``name`` split into ``shards``; ``make(shard name)`` opens each shard."""
        return cls([make(n) for n in shard_names(name, shards)], name, peek=peek, rng=rng)

    def __repr__(self):
        return f"<ShardedQueue {self.name!r} shards={len(self.shards)} peek={self.peek_count}>"

    def shard_of_lease(self, lease) -> PriorityQueue:
        """The shard a ``Lease`` (or an Entry) came from, by its ``queue``."""
        shard = self._by_name.get(getattr(lease, "queue", None))
        if shard is None:
            raise ValueError(f"{lease!r} is not a lease of a shard of {self.name!r}: a sharded queue acks, requeues "
                             "and renews Lease objects (they carry their shard), not bare (id, token) pairs")
        return shard

    # -- insert -----------------------------------------------------------------------------
    def shard_for(self, *, tenant: str | None = None, publish_id: bytes | str | None = None) -> PriorityQueue:
        """The shard an insert goes to: the tenant's on a fair queue, else the publish id's, else
        a random one."""
        n = len(self.shards)
        if self.fair and tenant:
            return self.shards[_hash(tenant) % n]
        if publish_id:
            return self.shards[_hash(publish_id) % n]
        return self.shards[self._rng.randrange(n)]

    def insert(self, payload, priority: int = 0, *, tenant: str | None = None,
               publish_id: bytes | str | None = None, **kwargs) -> str:
        """``PriorityQueue.insert`` into the shard ``shard_for`` picks."""
        shard = self.shard_for(tenant=tenant, publish_id=publish_id)
        if kwargs.get("id") is None:
            kwargs["id"] = new_id(publish_id)
        return shard.insert(payload, priority, tenant=tenant, publish_id=publish_id, **kwargs)

    def insert_many(self, items, **kwargs) -> list[str]:
        """``PriorityQueue.insert_many``, each item to the shard ``shard_for`` picks (one call per
        shard). On a failure, ``exc.stored`` (one per item, in the order given) has the ids of
        the shards done and of the failed shard's stored items; ``exc.items`` are the items not
        known to be stored, of that shard and of the shards not reached. ``repeats=True``: as
        ``PriorityQueue.insert_many``'s, ``(ids, repeated)`` in the order given."""
        items = [item if len(item) > 2 and item[2] is not None
                 else (*item[:2], new_id(item[5] if len(item) > 5 else None), *item[3:]) for item in items]
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
                got = self.shards[s].insert_many([items[i] for i in idx], **kwargs)
            except Exception as exc:
                for i, eid in zip(idx, getattr(exc, "stored", ())):
                    ids[i] = eid
                rest = [i for t in order[g + 1:] for i in groups[t]]
                exc.stored = list(ids)
                exc.items = list(getattr(exc, "items", [])) + [items[i] for i in rest]
                raise
            if kwargs.get("repeats"):
                got, seen = got
                for i, r in zip(idx, seen):
                    repeated[i] = r
            for i, eid in zip(idx, got):
                ids[i] = eid
        return (ids, repeated) if kwargs.get("repeats") else ids

    # -- pop: peek k, pop the best, second-best under concurrency ------------------------------
    def peek_heads(self, shards: Sequence[PriorityQueue],
                   view: tuple[int, int] | None = None) -> list[tuple[int, int] | None]:
        """(rank, enqueued_ms) of the entry each of ``shards`` would deliver first (within
        ``view``), None for an empty or paused one: one pipelined round trip of read-only
        scripts (``peek_head.lua``)."""
        replies = run_calls(self.client, [s.head_call(view) for s in shards])
        return [PriorityQueue.parse_head(r) for r in replies]

    def _ranked(self, shards: Sequence[PriorityQueue], view) -> list[tuple[PriorityQueue, tuple[int, int]]]:
        """(shard, its head) of ``shards`` with a waiting entry, best first: best rank, then
        oldest head (ties of the same millisecond in random order)."""
        heads = self.peek_heads(shards, view)
        found = [(h, self._rng.random(), s) for h, s in zip(heads, shards) if h is not None]
        return [(s, h) for h, _, s in sorted(found, key=lambda x: x[:2])]

    def pop_with_acks(self, count: int = 1, *, acks: dict | None = None, **pop_args) -> tuple[Popped, dict]:
        """Pop up to ``count`` entries from the best of ``peek`` shards, sending ``acks``
        (``{shard: [(entry id, token), ...]}``) in the same round trip as the first pop.
        Returns (leases, whose ``queue`` is the shard that served; ack codes per shard)."""
        pending = dict(acks or {})
        codes: dict = {}
        peeked = self._rng.sample(self.shards, self.peek_count)
        for wider in (False, True):
            if wider:
                rest = [s for s in self.shards if s not in peeked]
                if not rest:
                    break
                peeked = rest
            best = self._ranked(peeked, pop_args.get("view"))
            # the best, then the second-best (and on: a consumer must not sleep while one has
            # work); each but the last takes only what still beats the next one's peeked head
            for attempt, (shard, _) in enumerate(best):
                bound = best[attempt + 1][1][0] if attempt + 1 < len(best) and self._bounded else None
                popped, got = pop_with_acks(shard, count, acks=pending, bound=bound, **pop_args)
                codes.update(got)
                pending = {}
                if popped:
                    self.stats_second_best += attempt > 0
                    self.stats_wider_peek += wider
                    return popped, codes
        if pending:  # nothing anywhere, and acks to send
            codes.update(ack_all(pending))
        popped = Popped()
        popped.queue = self.shards[0]
        return popped, codes

    def pop(self, count: int = 1, *, lease_seconds: float | None = None, consumer: str | None = None,
            view: tuple[int, int] | None = None) -> Popped:
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

    def extend(self, leases: Sequence[Lease], lease_seconds: float | None = None, *,
               strict: bool = False) -> list[bool]:
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

    def lease_of(self, id: str) -> dict | None:
        for s in self.shards:
            found = s.lease_of(id)
            if found is not None:
                return found
        return None

    def leases(self, limit: int = 1000) -> list[dict]:
        rows = [row for s in self.shards for row in s.leases(limit)]
        return sorted(rows, key=lambda r: r["deadline_ms"])[:limit]

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

    def replay(self, ids: Sequence[str]) -> dict:
        """Dead letters back to the shards they died in."""
        out: dict = {"replayed": {}, "missing": [], "leased": [], "refused": []}
        left = list(ids)
        for s in self.shards:
            if not left:
                break
            got = s.replay(left)
            out["replayed"].update(got["replayed"])
            out["leased"] += got["leased"]
            out["refused"] += got["refused"]
            left = got["missing"]
        out["missing"] = left
        return out

    # -- what operators read: each shard's, merged --------------------------------------------
    def _merged(self, lists: list[list[Entry]], count: int) -> list[Entry]:
        rank = self.shards[0].rank
        entries = [e for part in lists for e in part]
        return sorted(entries, key=lambda e: (rank(e.priority), e.enqueued_ms))[:count]

    def peek(self, count: int = 1) -> list[Entry]:
        """The next ``count`` entries over all shards, by priority, then by age."""
        return self._merged([s.peek(count) for s in self.shards], count)

    def peek_tenant(self, tenant: str, count: int = 10) -> list[Entry]:
        return self._merged([s.peek_tenant(tenant, count) for s in self.shards], count)

    def retrieve_highest_priority(self) -> str | None:
        head = self.peek(1)
        return head[0].id if head else None

    def size(self) -> int:
        return sum(s.size() for s in self.shards)

    def backlog(self, view: tuple[int, int] | None = None) -> int:
        return sum(s.backlog(view) for s in self.shards)

    def counters(self) -> dict[str, int]:
        out: Counter = Counter()
        for s in self.shards:
            out.update(s.counters())
        return dict(out)

    def tenant_deliveries(self) -> dict[str, int]:
        out: Counter = Counter()
        for s in self.shards:
            out.update(s.tenant_deliveries())
        return dict(out)

    def held_tenants(self, paused: dict | None = None) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.shards:
            out.update(s.held_tenants(paused))
        return out

    def paused(self) -> dict:
        states = [s.paused() for s in self.shards]
        return {"queue": any(st["queue"] for st in states),
                "tenants": sorted({t for st in states for t in st["tenants"]})}

    def stats(self) -> dict:
        """``PriorityQueue.stats`` summed over the shards (the oldest head's age), with
        ``shards``: each shard's name, waiting, delayed and leased."""
        parts = [s.stats() for s in self.shards]
        per_priority: Counter = Counter()
        per_tenant: dict[str, dict] = {}
        for st in parts:
            per_priority.update(st["per_priority"])
            for t, row in st["per_tenant"].items():
                mine = per_tenant.setdefault(t, {})
                for k, v in row.items():
                    if k.endswith("_seconds"):
                        mine[k] = max((x for x in (mine.get(k), v) if x is not None), default=None)
                    else:
                        mine[k] = mine.get(k, 0) + v
        ages = [st["head_age_seconds"] for st in parts if st["head_age_seconds"] is not None]
        return {
            "queue": self.name,
            **{k: sum(st[k] for st in parts) for k in ("waiting", "delayed", "leased", "dead", "index_members")},
            "per_priority": dict(sorted(per_priority.items(), reverse=self.priority_order == C.HIGHER_FIRST)),
            "head_age_seconds": max(ages) if ages else None,
            "per_tenant": per_tenant,
            "paused": any(st["paused"] for st in parts),
            "paused_tenants": sorted({t for st in parts for t in st["paused_tenants"]}),
            "shards": [{"queue": st["queue"], "waiting": st["waiting"], "delayed": st["delayed"],
                        "leased": st["leased"]} for st in parts],
        }

    # -- every shard at once --------------------------------------------------------------------
    def pause(self, tenant: str | None = None) -> bool:
        return any([s.pause(tenant) for s in self.shards])

    def resume(self, tenant: str | None = None) -> bool:
        return any([s.resume(tenant) for s in self.shards])

    def purge(self) -> int:
        return sum(s.purge() for s in self.shards)

    def delete(self) -> None:
        for s in self.shards:
            s.delete()

    def register_view(self, lo: int, hi: int) -> list[str]:
        """Register the view on every shard; its wake lists, one per shard."""
        return [s.register_view(lo, hi) for s in self.shards]

    def refresh_views(self) -> None:
        for s in self.shards:
            s.refresh_views()

    def configure_tenants(self, **tables) -> None:
        for s in self.shards:
            s.configure_tenants(**tables)

    def set_event_log(self, cap: int | None) -> int:
        return max(s.set_event_log(cap) for s in self.shards)

    def event_log_cap(self) -> int:
        return self.shards[0].event_log_cap()

    @property
    def mode(self) -> dict:
        return self.shards[0].mode

    def stored_mode(self) -> dict | None:
        return self.shards[0].stored_mode()

    def rank(self, priority: int) -> int:
        return self.shards[0].rank(priority)

    def priority_of_rank(self, rank: int) -> int:
        return self.shards[0].priority_of_rank(rank)

    @property
    def dead(self) -> "ShardedQueue":
        """The dead-letter queues of the shards, as one sharded queue (``<name>.dead``)."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        return ShardedQueue([s.dead for s in self.shards], split_dead(self.name)[0] + ".dead",
                            peek=self.peek_count, rng=self._rng)

    @property
    def explain(self):
        return self.shards[0].explain
