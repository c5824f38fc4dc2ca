"""The reference model of start-time fair queueing (lua/includes/fair.lua) over a machine's
waiting entries, with what a delivery costs by each fair_cost (tasks, declared, time)."""

from __future__ import annotations

import math
from collections import Counter

from .common import MEntry


class Fair:
    """Start-time fair queueing as the scripts do it (lua/includes/fair.lua), over the model's
    waiting entries: per level a virtual time V, per tenant and level a finish tag F, the
    schedule ts of (level, start, tenant) members, parked tenants in tb. A level that runs empty
    ends its busy period: its V moves up to the largest finish tag given there (M).

    By fair_cost "time" a pop charges a provisional cost (the tenant's running average, else the
    queue's, else COST_UNIT) and the lease's end settles it: the tenant's finish tag moves by
    what the time held costs less what the pop charged (``settle``, ``charge``); the machine
    tells the model the ms Redis charged (it chose them up to the step's own few ms and reads
    them back). The sweep's clean-up (``gc``) drops finish tags <= V and the averages of tenants
    that left, as fair_gc does: a charge starts from V where the tag is gone."""

    VT_UNIT = 1_000_000
    COST_UNIT = 100_000  # fair_cost "declared": a cost of 1 (an entry declaring none); "time": a second
    TIME_UNIT = 100  # fair_cost "time": a ms of lease held
    MAX_HELD_MS = 86_400_000  # a lease is charged a day at most

    def __init__(self, machine, within_priority: bool, conc: int, cost: str = "tasks"):
        self.m = machine
        self.cost = cost
        # what one delivery costs at weight 1 by tasks or declared (the model's entries declare none)
        self.unit = self.COST_UNIT if cost == "declared" else self.VT_UNIT
        self.P = within_priority
        self.conc = conc
        self.weights: dict[str, float] = {}
        self.caps: dict[str, int] = {}
        self.V: dict[int, int] = {}
        self.F: dict[tuple[int, str], int] = {}
        self.M: dict[int, int] = {}
        self.tb: dict[str, list] = {}  # tenant -> [state "A"/"C", member]
        self.ts: set[tuple] = set()
        self.c: Counter = Counter()  # leased entries per tenant
        # fair_cost "time": eid -> virtual time its pop charged (lc); running averages (fv "A:<t>",
        # the queue's "A")
        self.lc: dict[str, int] = {}
        self.avg: dict[str, int] = {}
        self.avg_all: int | None = None

    def level(self, rank: int) -> int:
        return rank if self.P else 0

    def head(self, t: str) -> MEntry | None:
        mine = [e for e in self.m.entries.values() if e.state == "waiting" and e.tenant == t]
        return min(mine, key=lambda e: (e.rank, e.seq)) if mine else None

    def refresh(self, t: str, force: bool) -> None:
        state, oldm = self.tb.get(t, ["A", None])
        h = self.head(t)
        if h is None:
            if oldm is not None:
                self.ts.discard(oldm)
                del self.tb[t]
            return
        level = self.level(h.rank)
        if oldm is not None and not force and oldm[0] == level:
            return
        m = (level, max(self.V.get(level, 0), self.F.get((level, t), 0)), t)
        if oldm is not None and state == "A":
            self.ts.discard(oldm)
        self.tb[t] = [state, m]
        if state == "A":
            self.ts.add(m)

    def waiting_at(self, level: int) -> bool:
        return any(e.state == "waiting" and self.level(e.rank) == level for e in self.m.entries.values())

    def left(self, level: int) -> None:
        """A waiting entry left the level: if none is left there, V moves up to M."""
        if not self.waiting_at(level) and level in self.M:
            self.V[level] = self.M[level]

    def release(self, t: str) -> None:
        self.c[t] -= 1
        if self.c[t] <= 0:
            del self.c[t]
        row = self.tb.get(t)
        if row and row[0] == "C":
            row[0] = "A"
            self.ts.add(row[1])

    def pop(self, count: int, view) -> list[MEntry]:
        got: list[MEntry] = []
        looked = 0
        while len(got) < count and looked < 1000:
            looked += 1
            members = [m for m in self.ts if view is None or not self.P or view[0] <= m[0] <= view[1]]
            if not members:
                break
            m = min(members)
            level, start, t = m
            cap = self.caps.get(t, self.conc)
            if cap > 0 and self.c[t] >= cap:
                self.ts.discard(m)
                self.tb[t] = ["C", m]
                continue
            e = self.head(t)
            if e is None:
                self.refresh(t, False)
                continue
            got.append(e)
            e.state = "leased"  # the head moves on; the machine records the lease itself
            self.V[level] = max(self.V.get(level, 0), start)  # never down
            charged = math.floor(self.cost_of(t) / self.weights.get(t, 1) + 0.5)
            if self.cost == "time":
                self.lc[e.eid] = charged
            self.F[(level, t)] = start + charged
            self.M[level] = max(self.M.get(level, 0), self.F[(level, t)])
            self.c[t] += 1
            self.left(level)
            self.refresh(t, True)
        return got

    # -- fair_cost "time" ---------------------------------------------------------------------------
    def cost_of(self, t: str) -> float:
        """What serving tenant t costs at weight 1 (fair_cost): by time the provisional cost."""
        if self.cost != "time":
            return self.unit
        mine = self.avg.get(t)
        if mine is not None:
            return mine
        return self.avg_all if self.avg_all is not None else self.COST_UNIT

    def settle(self, e: MEntry, held: int | None) -> None:
        """The lease of e ended (after its release): by time, its tenant's finish tag moves by what
        ``held`` ms cost less what its pop charged; None: the delivery is undone (the charge is
        taken back). The averages follow the time held (fair_settle)."""
        charged = self.lc.pop(e.eid, None)
        if charged is None:
            return  # (by tasks or declared: nothing more)
        t = e.tenant
        actual = 0
        if held is not None:
            actual = min(held, self.MAX_HELD_MS) * self.TIME_UNIT
            mine, every = self.avg.get(t), self.avg_all
            self.avg[t] = fmt(mine + (actual - mine) / 8 if mine is not None else actual)
            self.avg_all = fmt(every + (actual - every) / 16 if every is not None else actual)
        self.charge(t, self.level(e.rank), math.floor(actual / self.weights.get(t, 1) + 0.5) - charged)

    def charge(self, t: str, level: int, d: int) -> None:
        """Tenant t's finish tag at level moves by d (at least 0); a tag that is gone counts as V
        and one that stays <= V changes nothing; an idle level's V follows the tag up; the tenant
        is scheduled again at its new start tag when it waits at that level (fair_charge)."""
        if d == 0:
            return
        v = self.V.get(level, 0)
        f = self.F.get((level, t))
        tag = max((v if f is None else f) + d, 0)
        if f is None and tag <= v:
            return
        self.F[(level, t)] = tag
        if tag > self.M.get(level, 0):
            self.M[level] = tag
        if tag > v and not self.waiting_at(level):
            self.V[level] = tag
        row = self.tb.get(t)
        if row and row[1][0] == level:
            self.refresh(t, True)

    def gc(self) -> None:
        """The sweep's clean-up (fair_gc, the whole of fv in one call: it is a small hash): finish
        tags <= V of tenants with nothing waiting, running averages of tenants with nothing waiting
        nor leased."""
        for (level, t), tag in list(self.F.items()):
            if t not in self.tb and tag <= self.V.get(level, 0):
                del self.F[(level, t)]
        for t in list(self.avg):
            if t not in self.tb and not self.c[t]:
                del self.avg[t]


def fmt(x: float) -> int:
    """A number as the scripts store it (includes/queue.lua fmt: "%.0f", half to even)."""
    return int(f"{x:.0f}")
