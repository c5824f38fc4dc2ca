"""One queue split into shards: the relaxed distributed priority queue (docs/relaxed.md).

A queue with ``shards=N`` is N full queues (``PriorityQueue``), each under its own hash tag
(``keys.shard_names``: shard 0 is the queue itself), so that on Redis Cluster the shards spread
over the masters. Nothing crosses shards inside Redis. An insert goes to one shard: the
tenant's on a fair queue (one tenant's order and rate bucket in one place; a rated default
tenant too), a unique key's, else the publish id's (a retried publish lands where the first
went), else a random one; an entry without an id gets a UUID (``new_id``), so an id names one
entry of the whole queue. A pop peeks ``peek`` (k) random shards in one round trip and pops
the best head; a shard emptied or beaten meanwhile gives way to the second-best peeked, and
when all peeked are empty the others are peeked too. Order is exact within a shard and relaxed
across shards (``benchmarks/relaxed.py`` measures the rank error).
"""

from __future__ import annotations

import hashlib
import random
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..storage import constants as C
from ..storage.costs import explain
from ..storage.errors import ConfigError, EntryNotFound
from ..storage.keys import split_dead
from . import calls
from .core import PriorityQueue, ack_all, pop_with_acks
from .item import Item
from .running import run_calls
from .settings import MAX_PEEK
from .unique import UniqueKey
from .values import Entry, Lease, Popped, mark_stored


def new_id(publish_id: bytes | str | None = None) -> str:
    """The id of an entry inserted without one: a lowercase UUID, the same for the same
    publish id."""
    if not publish_id:
        return str(uuid.uuid4())
    raw = publish_id if isinstance(publish_id, bytes) else publish_id.encode()
    return str(uuid.UUID(bytes=hashlib.blake2b(raw, digest_size=16).digest(), version=4))


def _hash(text: str | bytes) -> int:
    return zlib.crc32(text if isinstance(text, bytes) else text.encode())


def _with_id(item: Item) -> Item:
    if not isinstance(item, Item):
        raise TypeError(f"an insert takes Item objects, got {item!r}")
    return item if item.id is not None else replace(item, id=new_id(item.publish_id))


class ShardedQueue:
    """N ``PriorityQueue`` shards (shard 0 first, as ``open_queue`` makes them) with the face of
    one; ``peek`` shards peeked per pop (capped at N), ``rng`` picks them."""

    def __init__(self, shards: Sequence[PriorityQueue], name: str, *, peek: int = 2, rng: random.Random | None = None):
        self.task_limits: dict[str, float] = {}  # (open_queue: the task_rate limits a publish follows)
        if not shards:
            raise ValueError("a sharded queue needs at least one shard")
        if isinstance(peek, bool) or not isinstance(peek, int) or not 1 <= peek <= MAX_PEEK:
            raise ConfigError(f"peek must be an integer 1..{MAX_PEEK}, got {peek!r}")
        self.shards, self.name = list(shards), name
        self.peek_count = min(peek, len(self.shards))
        self._by_name = {s.name: s for s in self.shards}
        self._rng = rng or random.Random()
        self.client, self.settings = self.shards[0].client, self.shards[0].settings
        s = self.settings
        #: A pop of one shard is bounded by the next shard's head rank (not under tenant_first,
        #: whose order is not by rank).
        self._bounded = not (s.fair and s.fair_scope == "tenant_first")
        #: A rated default tenant's entries go to one shard, whose bucket then holds its rate.
        self._rated_default = s.fair and bool(s.tenant_rate or (s.rate or {}).get(""))

    def __repr__(self):
        return f"<ShardedQueue {self.name!r} shards={len(self.shards)} peek={self.peek_count}>"

    @property
    def is_dead(self) -> bool:
        return self.shards[0].is_dead

    @property
    def mode(self) -> dict:
        return self.shards[0].mode

    @property
    def dead(self) -> ShardedQueue:
        """The dead-letter queues of the shards, as one sharded queue (``<name>.dead``)."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        dead = split_dead(self.name)[0] + ".dead"
        return ShardedQueue([s.dead for s in self.shards], dead, peek=self.peek_count, rng=self._rng)

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

    # -- insert ---------------------------------------------------------------------------------
    def shard_for(self, *, tenant: str | None = None, publish_id: bytes | str | None = None) -> PriorityQueue:
        """The tenant's shard on a fair queue (the default tenant's when rated), else the
        publish id's, else a random one."""
        n = len(self.shards)
        if self.settings.fair and (tenant or self._rated_default):
            return self.shards[_hash(tenant or "") % n]
        if publish_id:
            return self.shards[_hash(publish_id) % n]
        return self.shards[self._rng.randrange(n)]

    # the same sugar as a plain queue's: put(Item(...)) (this class's put picks the shard)
    insert = PriorityQueue.insert
    insert_unique = PriorityQueue.insert_unique

    def put(self, item: Item, *, unique: UniqueKey | None = None, **options) -> Any:
        """``PriorityQueue.put`` into the shard ``shard_for`` picks, or a unique key's shard (its
        standing entry is found there; a fair queue's tenant does not choose)."""
        if unique is not None:
            shard = self.shards[_hash(unique.key) % len(self.shards)]
        else:
            shard = self.shard_for(tenant=item.tenant, publish_id=item.publish_id)
        return shard.put(_with_id(item), unique=unique, **options)

    def insert_many(self, items, *, chunk: int = C.BULK_CHUNK, repeats: bool = False, remember: bool = True) -> Any:
        """``PriorityQueue.insert_many``, one call per shard; on a failure ``exc.stored`` and
        ``exc.items`` cover the shards done, the failed one and those not reached."""
        items = [_with_id(item) for item in items]
        groups: dict[int, list[int]] = {}
        for n, item in enumerate(items):
            shard = self.shard_for(tenant=item.tenant, publish_id=item.publish_id)
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

    # -- pop: peek k, pop the best, second-best under concurrency -------------------------------
    def peek_heads(self, shards: Sequence[PriorityQueue], view=None) -> list[tuple[int, int] | None]:
        """(rank, enqueued_ms) of the entry each shard would deliver first, None for an empty or
        paused one: one pipelined round trip."""
        replies = run_calls(self.client, [s._scripts.head_call(view) for s in shards])
        return [calls.parse_head(r) for r in replies]

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> None:
        return None  # a sharded queue's pop peeks its shards first, and waits for each reply

    def pop_with_acks(self, count: int = 1, *, acks=None, lean=False, lease_seconds=None, consumer=None, view=None):
        """Pop from the best of ``peek`` shards, ``acks`` (``{shard: pairs}``) in the same round
        trip as the first pop: (leases whose ``queue`` is the shard that served, codes by shard)."""
        pending = dict(acks or {})
        codes: dict = {}
        peeked = self._rng.sample(self.shards, self.peek_count)
        for wider in (False, True):
            if wider:
                peeked = [s for s in self.shards if s not in peeked]
                if not peeked:
                    break
            heads = self.peek_heads(peeked, view)
            found = sorted((h, self._rng.random(), s) for h, s in zip(heads, peeked) if h is not None)
            best = [(s, h) for h, _, s in found]
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
                    return popped, codes
        if pending:  # nothing anywhere, and acks to send
            codes.update(ack_all(pending))
        return Popped((), self.shards[0]), codes

    def pop(self, count: int = 1, *, lease_seconds=None, consumer=None, view=None) -> Popped[Lease]:
        return self.pop_with_acks(count, lease_seconds=lease_seconds, consumer=consumer, view=view)[0]

    # -- leases, by the shard each lease carries ------------------------------------------------
    def _each(self, leases, do) -> list[bool]:
        groups: dict[PriorityQueue, list] = {}
        for lease in leases:
            groups.setdefault(self.shard_of_lease(lease), []).append(lease)
        done = {id(lease): ok for shard, group in groups.items() for lease, ok in zip(group, do(shard, group))}
        return [done[id(lease)] for lease in leases]

    def ack(self, lease: Lease, *, strict: bool = False) -> bool:
        return self.shard_of_lease(lease).ack(lease, strict=strict)

    def ack_many(self, leases: Sequence[Lease], *, strict: bool = False) -> list[bool]:
        return self._each(leases, lambda shard, group: shard.ack_many(group, strict=strict))

    def extend(
        self, leases: Sequence[Lease], lease_seconds: float | None = None, *, strict: bool = False
    ) -> list[bool]:
        return self._each(leases, lambda shard, group: shard.extend(group, lease_seconds, strict=strict))

    def requeue(self, lease: Lease, **kwargs) -> str | None:
        return self.shard_of_lease(lease).requeue(lease, **kwargs)

    def dead_letter(self, lease: Lease, reason: str = "rejected", **kwargs) -> str | None:
        return self.shard_of_lease(lease).dead_letter(lease, reason, **kwargs)

    def reclaim(self, **kwargs) -> dict:  # every shard's sweep, summed
        return merged_reclaim([s.reclaim(**kwargs) for s in self.shards])

    # -- by id, and every shard at once ---------------------------------------------------------
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

    def replay(self, ids: Sequence[str]) -> dict:  # dead letters back to the shards they died in
        return merged_replay(self.shards, ids)

    def pause(self, tenant: str | None = None) -> bool:
        return any([s.pause(tenant) for s in self.shards])  # noqa: C419  (every shard, no short cut)

    def resume(self, tenant: str | None = None) -> bool:
        return any([s.resume(tenant) for s in self.shards])  # noqa: C419  (every shard, no short cut)

    def purge(self) -> int:
        return sum(s.purge() for s in self.shards)

    def delete(self) -> None:
        for s in self.shards:
            s.delete()

    def register_view(self, lo: int, hi: int) -> list[str]:
        return [s.register_view(lo, hi) for s in self.shards]

    def configure_tenants(self, **tables) -> None:
        for s in self.shards:
            s.configure_tenants(**tables)

    def set_event_log(self, cap: int | None) -> int:
        return max(s.set_event_log(cap) for s in self.shards)

    # -- reads: each shard's answer, merged -----------------------------------------------------
    def _merged(self, lists: list[list[Entry]], count: int) -> list[Entry]:
        rank = self.shards[0].rank
        return sorted((e for part in lists for e in part), key=lambda e: (rank(e.priority), e.enqueued_ms))[:count]

    def peek(self, count: int = 1) -> list[Entry]:  # by priority, then by age
        return self._merged([s.peek(count) for s in self.shards], count)

    def peek_tenant(self, tenant: str, count: int = 10) -> list[Entry]:
        return self._merged([s.peek_tenant(tenant, count) for s in self.shards], count)

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]:
        return sorted((d for s in self.shards for d in s.delayed(count)), key=lambda d: d[1])[:count]

    def retrieve_highest_priority(self) -> str | None:
        head = self.peek(1)
        return head[0].id if head else None

    def lease_of(self, id: str) -> dict | None:
        return next((found for s in self.shards if (found := s.lease_of(id)) is not None), None)

    def leases(self, limit: int = 1000) -> list[dict]:
        return sorted((row for s in self.shards for row in s.leases(limit)), key=lambda r: r["deadline_ms"])[:limit]

    def size(self) -> int:
        return sum(s.size() for s in self.shards)

    def backlog(self, view=None) -> int:
        return sum(s.backlog(view) for s in self.shards)

    def counters(self) -> dict[str, int]:
        return dict(sum((Counter(s.counters()) for s in self.shards), Counter()))

    def tenant_deliveries(self) -> dict[str, int]:
        return dict(sum((Counter(s.tenant_deliveries()) for s in self.shards), Counter()))

    def held_tenants(self, held: dict | None = None) -> dict[str, str]:
        return {t: why for s in self.shards for t, why in s.held_tenants(held).items()}

    def paused(self) -> dict:
        states = [s.paused() for s in self.shards]
        return {
            "queue": any(st["queue"] for st in states),
            "tenants": sorted({t for st in states for t in st["tenants"]}),
        }

    def stats(self) -> dict:  # summed over the shards, with ``shards``: each one's part
        return merged_stats(self.name, self.settings.priority_order, [s.stats() for s in self.shards])

    def event_log_cap(self) -> int:
        return self.shards[0].event_log_cap()

    def stored_mode(self) -> dict | None:
        return self.shards[0].stored_mode()

    def rank(self, priority: int) -> int:
        return self.shards[0].rank(priority)

    def priority_of_rank(self, rank: int) -> int:
        return self.shards[0].priority_of_rank(rank)

    explain = staticmethod(explain)


def merged_stats(name: str, priority_order: str, parts: list[dict]) -> dict:
    """The shards' ``stats``, as one queue's (the oldest head's age), with each shard's part."""
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
        "queue": name,
        **{k: sum(st[k] for st in parts) for k in ("waiting", "delayed", "leased", "dead", "index_members")},
        "per_priority": dict(sorted(per_priority.items(), reverse=priority_order == C.HIGHER_FIRST)),
        "head_age_seconds": max(ages) if ages else None,
        "per_tenant": per_tenant,
        "paused": any(st["paused"] for st in parts),
        "paused_tenants": sorted({t for st in parts for t in st["paused_tenants"]}),
        "unique": {k: sum(st["unique"][k] for st in parts) for k in parts[0]["unique"]},
        "shards": [
            {"queue": st["queue"], "waiting": st["waiting"], "delayed": st["delayed"], "leased": st["leased"]}
            for st in parts
        ],
    }


def merged_reclaim(parts: list[dict]) -> dict:
    out: Counter = Counter()
    for r in parts:
        out.update({k: int(v) for k, v in r.items() if k != "skipped"})
    return {**out, "skipped": all(r["skipped"] for r in parts), "more": bool(out["more"])}


def merged_replay(shards: Sequence[PriorityQueue], ids: Sequence[str]) -> dict:
    """Each shard replays the ids the ones before it did not hold."""
    out: dict = {"replayed": {}, "missing": [], "leased": [], "refused": []}
    left = list(ids)
    for s in shards:
        if not left:
            break
        got = s.replay(left)
        out["replayed"].update(got["replayed"])
        out["leased"] += got["leased"]
        out["refused"] += got["refused"]
        left = got["missing"]
    out["missing"] = left
    return out
