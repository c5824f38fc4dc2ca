"""What reads or changes every shard of a sharded queue at once: each shard's answer, merged
(peeks by priority then age, counts summed, stats with each shard's part), and the operators'
changes sent to every shard."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from . import constants as C
from .queue import Entry, PriorityQueue


class ShardedReads:
    """Every shard's answer as one queue's (the base of ``ShardedQueue``)."""

    name: str
    priority_order: str
    shards: list[PriorityQueue]
    _rng: random.Random

    def lease_of(self, id: str) -> dict | None:
        for s in self.shards:
            found = s.lease_of(id)
            if found is not None:
                return found
        return None

    def leases(self, limit: int = 1000) -> list[dict]:
        rows = [row for s in self.shards for row in s.leases(limit)]
        return sorted(rows, key=lambda r: r["deadline_ms"])[:limit]

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

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]:
        """The first ``count`` delayed entries over all shards, soonest due first."""
        return sorted((d for s in self.shards for d in s.delayed(count)), key=lambda d: d[1])[:count]

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
        return {
            "queue": any(st["queue"] for st in states),
            "tenants": sorted({t for st in states for t in st["tenants"]}),
        }

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
            "unique": {k: sum(st["unique"][k] for st in parts) for k in parts[0]["unique"]},
            "shards": [
                {"queue": st["queue"], "waiting": st["waiting"], "delayed": st["delayed"], "leased": st["leased"]}
                for st in parts
            ],
        }

    # -- every shard at once --------------------------------------------------------------------
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
