"""The reference model of start-time fair queueing (lua/includes/fair.lua) over a machine's
waiting entries."""

from __future__ import annotations

import math
from collections import Counter

from .common import MEntry


class Fair:
    """Start-time fair queueing as the scripts do it (lua/includes/fair.lua), over the model's
    waiting entries: per level a virtual time V, per tenant and level a finish tag F, the
    schedule ts of (level, start, tenant) members, parked tenants in tb. A level that runs empty
    ends its busy period: its V moves up to the largest finish tag given there (M)."""

    VT_UNIT = 1_000_000
    COST_UNIT = 100_000  # fair_cost "declared": a cost of 1 (an entry declaring none)

    def __init__(self, machine, within_priority: bool, conc: int, unit: int = VT_UNIT):
        self.m = machine
        self.unit = unit  # what one delivery costs at weight 1 (fair_cost)
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

    def left(self, level: int) -> None:
        """A waiting entry left the level: if none is left there, V moves up to M."""
        still_waiting = any(e.state == "waiting" and self.level(e.rank) == level for e in self.m.entries.values())
        if not still_waiting and level in self.M:
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
            self.F[(level, t)] = start + math.floor(self.unit / self.weights.get(t, 1) + 0.5)
            self.M[level] = max(self.M.get(level, 0), self.F[(level, t)])
            self.c[t] += 1
            self.left(level)
            self.refresh(t, True)
        return got
