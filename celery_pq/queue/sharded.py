"""One queue split into shards: the relaxed distributed priority queue (docs/relaxed.md).
``ShardedQueue`` is N ``PriorityQueue``s, each under its own hash tag, with the face of one: an
insert goes to one shard, a pop peeks ``peek`` random shards in one round trip and pops the best
head; the other verbs are the shards' answers merged.
"""

from __future__ import annotations

import hashlib
import random
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..storage import constants as C
from ..storage.errors import EntryNotFound
from ..storage.keys import split_dead
from . import calls
from .core import PriorityQueue, ack_all, pop_with_acks
from .item import Item
from .running import run_calls
from .settings import check_peek
from .unique import UniqueKey
from .values import Entry, Popped, as_bytes, mark_stored


def _hash(text: str | bytes) -> int:
    return zlib.crc32(as_bytes(text))


def _with_id(item: Item) -> Item:
    """``item`` with an entry id: a lowercase UUID, the same for the same publish id."""
    if not isinstance(item, Item):
        raise TypeError(f"an insert takes Item objects, got {item!r}")
    if item.id is not None:
        return item
    pid = item.publish_id  # (bytes: Item keeps it so)
    eid = uuid.UUID(bytes=hashlib.blake2b(pid, digest_size=16).digest(), version=4) if pid else uuid.uuid4()
    return replace(item, id=str(eid))


def _summed(parts: list[dict]) -> dict:
    """The shards' counters summed, every name kept (``Counter``'s ``+`` drops the zeros)."""
    out: Counter = Counter()
    for part in parts:
        out.update({k: int(v) for k, v in part.items()})
    return dict(out)


def merged_reclaim(parts: list[dict]) -> dict:
    out = _summed([{k: v for k, v in r.items() if k != "skipped"} for r in parts])
    return {**out, "skipped": all(r["skipped"] for r in parts), "more": bool(out["more"])}


def merged_tenants(parts: list[dict]) -> dict[str, dict]:
    """The shards' rows by tenant (``tenants``, or ``stats``'s ``per_tenant``) as one: the counts
    summed, the ages (``*_seconds``) the oldest, a tenant ``held`` when a shard holds it."""
    out: dict[str, dict] = {}
    for part in parts:
        for t, row in part.items():
            mine = out.setdefault(t, {})
            for k, v in row.items():
                if k.endswith("_seconds"):
                    mine[k] = max((x for x in (mine.get(k), v) if x is not None), default=None)
                elif k == "held":
                    mine[k] = v or mine.get(k)
                else:
                    mine[k] = mine.get(k, 0) + v
    return out


def _paused(parts: list[dict]) -> dict:
    """The shards' ``paused`` and ``paused_tenants``: paused where any shard is."""
    return {
        "paused": any(r["paused"] for r in parts),
        "paused_tenants": sorted({t for r in parts for t in r["paused_tenants"]}),
    }


class _Shards:
    """A verb its shards answer: the shard a lease came from (``by_lease``; for a list of leases,
    each one's, answers in order), every shard (answers merged by ``merge``), or else shard 0."""

    def __init__(self, *, merge: Callable[[list], Any] | None = None, by_lease=False):
        self.merge, self.by_lease = merge, by_lease

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, queue: ShardedQueue | None, owner=None) -> Any:
        if queue is None:
            return self
        name, merge = self.name, self.merge
        if self.by_lease:
            return lambda lease, *a, **k: (
                queue._each(lease, lambda s, part: getattr(s, name)(part, *a, **k))
                if isinstance(lease, list)
                else getattr(queue.shard_of_lease(lease), name)(lease, *a, **k)
            )
        if merge is None:
            return getattr(queue.shards[0], name)
        return lambda *a, **k: merge([getattr(s, name)(*a, **k) for s in queue.shards])


class ShardedQueue:
    """N ``PriorityQueue`` shards (shard 0 first, as ``open_queue`` makes them) with the face of
    one; ``peek`` shards peeked per pop (capped at N), ``rng`` picks them."""

    def __init__(self, shards: Sequence[PriorityQueue], name: str, *, peek: int = 2, rng: random.Random | None = None):
        self.task_limits: dict[str, float] = {}  # (open_queue: the task_rate limits a publish follows)
        self.due_in: float | None = None  # (peek_heads: the shards' next due time, ms from now)
        if not shards:
            raise ValueError("a sharded queue needs at least one shard")
        self.shards, self.name = list(shards), name
        self.peek_count = min(check_peek(peek), len(self.shards))
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

    def _each(self, leases, do) -> list[bool]:
        """``do(shard, its leases)`` for each shard the leases came from: the answers in order."""
        groups: dict[PriorityQueue, list] = {}
        for lease in leases:
            groups.setdefault(self.shard_of_lease(lease), []).append(lease)
        done = {id(lease): ok for shard, group in groups.items() for lease, ok in zip(group, do(shard, group))}
        return [done[id(lease)] for lease in leases]

    # -- insert ---------------------------------------------------------------------------------
    def shard_for(self, *, tenant: str | None = None, publish_id: bytes | str | None = None) -> PriorityQueue:
        """The tenant's shard on a fair queue (the default tenant's when rated), else the publish
        id's, else a random one."""
        n = len(self.shards)
        if self.settings.fair and (tenant or self._rated_default):
            return self.shards[_hash(tenant or "") % n]
        if publish_id:
            return self.shards[_hash(publish_id) % n]
        return self.shards[self._rng.randrange(n)]

    insert = PriorityQueue.insert  # (this class's _put picks the shard)

    def _put(self, item: Item, unique: UniqueKey | None, first_send: bool, remember: bool | None) -> Any:
        """Into the shard ``shard_for`` picks, or the unique key's (where its standing entry is)."""
        item = _with_id(item)
        if unique is not None:
            shard = self.shards[_hash(unique.key) % len(self.shards)]
        else:
            shard = self.shard_for(tenant=item.tenant, publish_id=item.publish_id)
        return shard._put(item, unique, first_send, remember)

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
        """(rank, enqueued_ms) of the entry each shard would deliver first (None: empty or paused;
        a due delayed entry counts: the pop promotes it). ``self.due_in``: the ms until the first
        delayed entry of these shards is due (None: none delayed)."""
        replies = run_calls(self.client, [s._scripts.head_call(view) for s in shards])
        dues = [d for d in (calls.due_in(r) for r in replies if r) if d is not None]
        self.due_in = min(dues) if dues else None
        return [(int(r[0]), int(r[1])) if r and int(r[0]) >= 0 else None for r in replies]

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> None:
        return None  # a sharded queue's pop peeks its shards first, and waits for each reply

    def pop(self, count: int = 1, *, acks=None, lean=False, lease_seconds=None, consumer=None, view=None) -> Popped:
        """Pop from the best of ``peek`` shards, ``acks`` (``{shard: pairs}``) in the first pop's
        round trip: leases whose ``queue`` is the shard that served, ``acked`` the codes by shard."""
        pending = dict(acks or {})
        codes: dict = {}
        peeked = self._rng.sample(self.shards, self.peek_count)
        dues: list[float] = []  # (the next due time of every shard peeked: an empty pop peeked all)
        for wider in (False, True):
            if wider:
                peeked = [s for s in self.shards if s not in peeked]
                if not peeked:
                    break
            heads = self.peek_heads(peeked, view)
            if self.due_in is not None:
                dues.append(self.due_in)
            found = sorted((h, self._rng.random(), s) for h, s in zip(heads, peeked) if h is not None)
            best = [(s, h) for h, _, s in found]
            # the best, then the second-best (and on: a consumer must not sleep while one has
            # work); each but the last takes only what still beats the next one's peeked head
            for attempt, (shard, _) in enumerate(best):
                bound = best[attempt + 1][1][0] if attempt + 1 < len(best) and self._bounded else None
                pop = {"lean": lean, "lease_seconds": lease_seconds, "consumer": consumer, "view": view}
                popped, got = pop_with_acks(shard, count, acks=pending, bound=bound, **pop)
                codes.update(got)
                pending = {}
                if popped:
                    popped.acked = codes
                    return popped
        if pending:  # nothing anywhere, and acks to send
            codes.update(ack_all(pending))
        popped = Popped((), self.shards[0], min(dues) if dues else None)
        popped.acked = codes
        return popped

    # -- leases, by the shard each lease carries ------------------------------------------------
    ack = _Shards(by_lease=True)
    requeue = _Shards(by_lease=True)
    dead_letter = _Shards(by_lease=True)
    extend = _Shards(by_lease=True)

    # -- by id, and every shard at once ---------------------------------------------------------
    reclaim = _Shards(merge=merged_reclaim)  # every shard's sweep, summed
    exists = _Shards(merge=any)
    remove = _Shards(merge=sum)
    purge = _Shards(merge=sum)
    delete = _Shards(merge=lambda _: None)
    pause = _Shards(merge=any)
    resume = _Shards(merge=any)
    register_view = _Shards(merge=list)
    configure_tenants = _Shards(merge=lambda _: None)
    set_event_log = _Shards(merge=max)

    def change_priority(self, id: str, priority: int) -> None:
        for s in self.shards:
            try:
                return s.change_priority(id, priority)
            except EntryNotFound:
                continue
        raise EntryNotFound(self.name, id)

    def replay(self, ids: Sequence[str]) -> dict:
        """Each shard replays the dead letters the ones before it did not hold."""
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

    # -- reads: each shard's answer, merged -----------------------------------------------------
    size = _Shards(merge=sum)
    backlog = _Shards(merge=sum)
    counters = _Shards(merge=_summed)
    tenants = _Shards(merge=merged_tenants)
    recorded = _Shards(merge=lambda parts: {**parts[0], **_paused(parts)})  # shard 0's mode and event log
    is_dead = _Shards()
    mode = _Shards()
    rank = _Shards()

    def peek(self, count: int = 1, tenant: str | None = None) -> list[Entry]:  # by priority, then by age
        rank = self.shards[0].rank
        parts = [e for s in self.shards for e in s.peek(count, tenant)]
        return sorted(parts, key=lambda e: (rank(e.priority), e.enqueued_ms))[:count]

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]:
        return sorted((d for s in self.shards for d in s.delayed(count)), key=lambda d: d[1])[:count]

    def leases(self, limit: int = 1000, *, id: str | None = None) -> list[dict]:
        rows = (row for s in self.shards for row in s.leases(limit, id=id))
        return sorted(rows, key=lambda r: r["deadline_ms"])[:limit]

    def stats(self) -> dict:  # summed over the shards, with ``shards``: each one's part
        return merged_stats(self.name, self.settings.priority_order, [s.stats() for s in self.shards])


def merged_stats(name: str, priority_order: str, parts: list[dict]) -> dict:
    """The shards' ``stats``, as one queue's (the oldest head's age), with each shard's part."""
    per_priority = _summed([st["per_priority"] for st in parts])
    ages = [st["head_age_seconds"] for st in parts if st["head_age_seconds"] is not None]
    return {
        "queue": name,
        **{k: sum(st[k] for st in parts) for k in ("waiting", "delayed", "leased", "dead", "index_members")},
        "per_priority": dict(sorted(per_priority.items(), reverse=priority_order == C.HIGHER_FIRST)),
        "head_age_seconds": max(ages) if ages else None,
        "per_tenant": merged_tenants([st["per_tenant"] for st in parts]),
        **_paused(parts),
        "unique": {k: sum(st["unique"][k] for st in parts) for k in parts[0]["unique"]},
        "shards": [
            {"queue": st["queue"], "waiting": st["waiting"], "delayed": st["delayed"], "leased": st["leased"]}
            for st in parts
        ],
    }
