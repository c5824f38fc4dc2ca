"""Model-based stateful test: PriorityQueue on a real redis-server against a small reference model.

Hypothesis drives random sequences of operations (insert, insert_many, pop, ack, requeue,
dead_letter, extend, remove, change_priority, expiry and reclaim, promotion of delayed entries,
purge, priority views, corrupt entries) on a queue with a key prefix of its own, and applies each
one to a pure-Python model of the documented semantics (docs/leases.md, docs/fairness.md,
docs/priorities.md, docs/views-and-delays.md). After every step the invariants compare the two:

- each entry is in exactly one state: waiting, delayed, leased, dead or gone (the tables of
  docs/key-layout.md: ``ii``, ``lt``, ``dz``, the tenant order ``te``, the dead-letter queue);
- the counts agree: ``size()``, ``stats()``, ``tenant_stats()``, the dead-letter queue's size;
- the delivery order of every pop matches the model: exact for plain queues (strict priority,
  FIFO within a priority, a returned entry back at its place) and for fair queues (start-time
  fair queueing as in lua/includes/fair.lua: priority first under within_priority, FIFO within
  one tenant and priority, equal-weight tenants in turn, weights, concurrency caps);
- stale lease tokens are refused (ack, extend, requeue, dead_letter), and change nothing;
- every key of the test's prefix carries the queue's hash tag ``{name}``;
- stale pointers stay bounded (docs/leases.md): each rank list holds at most
  ``2 * peak + STALE_SLACK`` pointers, peak being the most entries the queue has held (a list is
  compacted when a push finds it over twice the queue's entries plus 64; removals between pushes
  never lengthen it);
- a consumer that can take work has a wake token waiting.

At the end of every example the queue is drained (delayed entries promoted, leases expired and
reclaimed, everything popped and acked): every entry ends acked, dead or removed, and nothing
is left in the identifier-indexed table.

Running it:

- ``pytest tests/lua/test_model.py``: the bounded CI run (profile ``ci``: 80 examples of up to 40 steps per
  machine, about a minute and a half here once it passes; a failure adds up to 5 minutes of shrinking).
- ``PQ_SOAK_MINUTES=30 pytest tests/lua/test_model.py -m slow`` (``make soak``): every machine in
  turn with many more and longer examples until that many minutes have passed.
- ``PQ_MODEL_SKIP=name,name`` leaves out rules or checks by name (those in SKIPPABLE), to look
  for further failures past a known one. The default runs everything.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_pq import EntryNotFound, NotWaiting, PriorityQueue
from celery_pq.ids import decode_id, encode_id
from celery_pq.queue import escape_tenant
from celery_pq.records import split_tenant_member

SOAK_MINUTES = float(os.environ.get("PQ_SOAK_MINUTES") or 0)
SKIPPABLE = {"corrupt", "mode", "publish_id", "dead_of_dead", "wake", "stale_bound", "fair_state_bound"}
SKIP = {s for s in os.environ.get("PQ_MODEL_SKIP", "").split(",") if s}
assert SKIP <= SKIPPABLE, f"PQ_MODEL_SKIP names unknown rules or checks: {sorted(SKIP - SKIPPABLE)}"

_common = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=80, stateful_step_count=40, **_common)
settings.register_profile("soak", max_examples=60, stateful_step_count=120, **_common)

#: Pointers the rank lists may hold beyond twice the waiting entries (stale ones not yet passed).
STALE_SLACK = 128
#: A delayed entry is due after this many ms ("short") or after an hour ("long").
SHORT_MS, LONG_MS = 30, 3_600_000
#: The event log's cap: more than a run logs (the teardown compares the whole log with the counters).
EVENT_CAP = 1_000_000
#: Lease length of every pop: only the expiry rule makes a lease run out.
LEASE_SECONDS = 60

IDS = [None, None, None, "a", "a", "b", "a~3", "a~5", "7", "9", "0b8f5c9e-3a1d-4f6e-9c2b-7d4e5f6a8b9c", "\x01x"]
PRIORITIES = [0, 1, 5, 128, 254, 255]
TENANTS = ["", "a", "b", "c,d"]
VIEWS = [(0, 50), (0, 0), (100, 255), (250, 255), (1, 254)]
GARBAGE = [b"nobar", b"", b"1,2|x", b"0,abc,,,,1|x", b"x,1,,,,1|p", b"\xff\x00garbage"]

SERVER = None  # the session's RedisServer, set by the test functions below


def redis_now_ms(client) -> int:
    sec, usec = client.time()
    return sec * 1000 + usec // 1000


@dataclass
class MEntry:
    eid: str
    given: str | None
    payload: bytes
    rank: int
    seq: int  # the model's insertion order (Redis's own counter moves in the same order)
    tenant: str  # escaped, "" for none
    state: str  # waiting, delayed, leased, dead, gone, corrupt
    d: int = 0  # deliveries counted so far
    token: str | None = None
    due: int = 0  # ms on the Redis clock, delayed entries only
    short: bool = False
    was: str = ""  # a corrupt entry's state when it was corrupted


class Fair:
    """Start-time fair queueing as the scripts do it (lua/includes/fair.lua), over the model's
    waiting entries: per level a virtual time V, per tenant and level a finish tag F, the
    schedule ts of (level, start, tenant) members, parked tenants in tb. A level that runs empty
    ends its busy period: its V moves up to the largest finish tag given there (M)."""

    VT_UNIT = 1_000_000

    def __init__(self, machine, within_priority: bool, conc: int):
        self.m = machine
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
            self.V[level] = start
            self.F[(level, t)] = start + math.floor(self.VT_UNIT / self.weights.get(t, 1) + 0.5)
            self.M[level] = max(self.M.get(level, 0), self.F[(level, t)])
            self.c[t] += 1
            self.left(level)
            self.refresh(t, True)
        return got


class QueueMachine(RuleBasedStateMachine):
    """A plain queue (both priority orders, techniques T and S) and its priority views."""

    fair = False
    corrupting = False

    def __init__(self):
        super().__init__()
        self.client = SERVER.client(decode_responses=False)
        self.prefix = "pqm" + uuid.uuid4().hex[:12]
        self.name = "m"
        self.entries: dict[str, MEntry] = {}  # eid -> entry, live ones (waiting/delayed/leased/corrupt)
        self.done: list[MEntry] = []  # gone or dead
        self.dead: list[tuple] = []  # (rank, arrival, payload, reason) in arrival order
        self.levels: dict[int, list[str]] = {}  # plain order: rank -> eids in list order
        self.stale: list[tuple[str, str]] = []  # (eid, token) pairs no longer current
        self.views: set[tuple[int, int]] = set()
        self.seq = 0
        self.arrivals = 0
        self.payloads = 0
        self.q: PriorityQueue | None = None
        self.fq: Fair | None = None
        self.corrupt: dict[str, bool] = {}  # eid -> True when a remove or purge may have taken it
        self.retired: list[bool] = []  # corrupt entries that left the queue, their flags (see retire)
        self.mode_kwargs: dict = {}

    # -- set-up ---------------------------------------------------------------------------------
    @initialize(
        order=st.sampled_from(["higher_first", "lower_first"]),
        technique=st.sampled_from(["T", "S"]),
        max_deliveries=st.sampled_from([0, 2, 3]),
    )
    def make_queue(self, order, technique, max_deliveries):
        self.mode_kwargs = dict(priority_order=order, technique=technique)
        self.q = PriorityQueue(
            self.client,
            self.name,
            key_prefix=self.prefix,
            lease_seconds=LEASE_SECONDS,
            max_deliveries=max_deliveries,
            event_log=EVENT_CAP,
            **self.mode_kwargs,
        )

    def teardown(self):
        try:
            if self.q is not None:
                self.drain_and_check()
                self.events_agree_with_counters()
        finally:
            keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
            if keys:
                self.client.delete(*keys)
            self.client.close()

    def events_agree_with_counters(self):
        """The event log and the counters are written by the same scripts, independently: after
        the whole run, each kind of event was logged as often as its counter counted."""
        events = self.q.events()
        assert len(events) < EVENT_CAP  # nothing trimmed: every event of the run is there
        kinds = Counter(e["e"] for e in events)
        c = self.q.counters()
        assert (kinds["enqueue"], kinds["deliver"], kinds["ack"], kinds["requeue"], kinds["dead"]) == (
            c["enqueued"],
            c["delivered"],
            c["acked"],
            c["requeued"],
            c["dead_lettered"],
        ), (kinds, c)
        assert sum(1 for e in events if e["e"] == "deliver" and e["n"] > 1) == c["redelivered"]
        assert sum(1 for e in events if e["e"] == "remove" and e["r"] != "dead_dropped") == c["removed"]
        assert kinds["expire"] <= c["lease_expired"]

    # -- the model ------------------------------------------------------------------------------
    def rank(self, priority: int) -> int:
        return self.q.rank(priority)

    def state_of(self, state: str) -> list[MEntry]:
        return [e for e in self.entries.values() if e.state == state]

    def live_eids(self) -> set[str]:
        return set(self.entries)

    def order(self, view=None) -> list[str]:
        """Plain queues: waiting entries in delivery order (ranks lo..hi of a view)."""
        lo, hi = view or (0, 255)
        return [eid for r in sorted(self.levels) if lo <= r <= hi for eid in self.levels[r]]

    def join_back(self, e: MEntry) -> None:
        """Waiting at the back of its rank (insert, promotion, new priority)."""
        e.state = "waiting"
        self.levels.setdefault(e.rank, []).append(e.eid)
        if self.fq:
            self.fq.refresh(e.tenant, False)

    def join_place(self, e: MEntry) -> None:
        """Waiting again at its place (requeue, expiry): before the first of the first 32 of its
        rank that came later (index.lua pi_return)."""
        e.state = "waiting"
        row = self.levels.setdefault(e.rank, [])
        for i, eid in enumerate(row[:32]):
            if self.entries[eid].seq > e.seq:
                row.insert(i, e.eid)
                break
        else:
            row.insert(min(len(row), 32), e.eid)
        if self.fq:
            self.fq.refresh(e.tenant, False)

    def leave_level(self, e: MEntry) -> None:
        row = self.levels.get(e.rank, [])
        if e.eid in row:
            row.remove(e.eid)
            if not row:
                del self.levels[e.rank]

    def finish(self, e: MEntry, state: str) -> None:
        was = e.state
        if was == "waiting":
            self.leave_level(e)
        e.state = state
        del self.entries[e.eid]
        self.done.append(e)
        if self.fq and was == "waiting":
            self.fq.left(self.fq.level(e.rank))
            self.fq.refresh(e.tenant, False)

    def to_dead(self, e: MEntry, reason: str) -> None:
        self.arrivals += 1
        self.dead.append((e.rank, self.arrivals, e.payload, reason))
        self.finish(e, "dead")

    def end_lease(self, e: MEntry) -> None:
        self.stale.append((e.eid, e.token))
        e.token = None
        if self.fq:
            self.fq.release(e.tenant)

    def next_payload(self) -> bytes:
        self.payloads += 1
        return b"p%d|,%d" % (self.payloads, self.payloads)

    def retire_corrupt(self) -> None:
        """Corrupt entries no longer in the queue (a script set them aside, or a remove or purge
        took them) free their ids: a new entry may have one of them."""
        ii = set(self.client.hkeys(self.q.keys.entries))
        for eid in [x for x in self.corrupt if encode_id(x) not in ii]:
            self.retired.append(self.corrupt.pop(eid))
            del self.entries[eid]

    def corrupt_counts(self) -> tuple[int, int]:
        """(corrupt entries, those a remove or purge may have taken), retired ones included."""
        return len(self.corrupt) + len(self.retired), sum(self.corrupt.values()) + sum(self.retired)

    def add(self, eid, given, payload, priority, tenant, due, short) -> MEntry:
        if self.corrupt:
            self.retire_corrupt()
        live = self.live_eids()
        assert eid not in live, f"insert returned {eid!r}, the id of an entry already in the queue"
        if given is not None:
            if given in live:
                assert eid.startswith(given + "~"), f"insert of taken id {given!r} returned {eid!r}"
            else:
                assert eid == given, f"insert of free id {given!r} returned {eid!r}"
        self.seq += 1
        e = MEntry(
            eid,
            given,
            payload,
            self.rank(priority),
            self.seq,
            escape_tenant(tenant or ""),
            "delayed",
            due=due,
            short=short,
        )
        self.entries[eid] = e
        if not due:
            self.join_back(e)
        return e

    def due_for(self, when: str) -> tuple[int | None, bool]:
        """due_ms for an insert: None (now), a past time (now too), soon, or in an hour."""
        if when == "now":
            return None, False
        now = redis_now_ms(self.client)
        return {"past": (now - 1000, False), "short": (now + SHORT_MS, True), "long": (now + LONG_MS, False)}[when]

    # -- inserts --------------------------------------------------------------------------------
    @rule(
        given=st.sampled_from(IDS),
        priority=st.sampled_from(PRIORITIES),
        tenant=st.sampled_from(TENANTS),
        when=st.sampled_from(["now", "now", "now", "past", "short", "long", "delay"]),
    )
    def insert(self, given, priority, tenant, when):
        payload = self.next_payload()
        if when == "delay":
            eid = self.q.insert(payload, priority, id=given, tenant=tenant or None, delay=SHORT_MS / 1000)
            due = self.client.zscore(self.q.keys.delayed, encode_id(eid))
            assert due is not None, f"an entry inserted with delay={SHORT_MS / 1000} is not delayed"
            self.add(eid, given, payload, priority, tenant, int(due), True)
            return
        due_ms, short = self.due_for(when)
        eid = self.q.insert(payload, priority, id=given, tenant=tenant or None, due_ms=due_ms)
        self.add(eid, given, payload, priority, tenant, due_ms if (due_ms and when != "past") else 0, short)

    @rule(
        items=st.lists(
            st.tuples(
                st.sampled_from(IDS),
                st.sampled_from(PRIORITIES),
                st.sampled_from(TENANTS),
                st.sampled_from(["now", "now", "short", "long"]),
            ),
            min_size=0,
            max_size=12,
        )
    )
    def insert_many(self, items):
        rows, meta = [], []
        for given, priority, tenant, when in items:
            payload = self.next_payload()
            due_ms, short = self.due_for(when)
            rows.append((payload, priority, given, tenant or None, due_ms))
            meta.append((given, payload, priority, tenant, due_ms or 0, short))
        eids = self.q.insert_many(rows)
        assert len(eids) == len(rows)
        for eid, (given, payload, priority, tenant, due, short) in zip(eids, meta):
            self.add(eid, given, payload, priority, tenant, due, short)

    @precondition(lambda self: "publish_id" not in SKIP)
    @rule(given=st.sampled_from(IDS), priority=st.sampled_from(PRIORITIES), tenant=st.sampled_from(TENANTS))
    def insert_retried(self, given, priority, tenant):
        """A publish retried after a lost reply (same publish id) stores nothing new."""
        payload = self.next_payload()
        publish_id = os.urandom(16)
        eid = self.q.insert(payload, priority, id=given, tenant=tenant or None, publish_id=publish_id)
        self.add(eid, given, payload, priority, tenant, 0, False)
        again = self.q.insert(payload, priority, id=given, tenant=tenant or None, publish_id=publish_id)
        assert again == eid, f"a retried publish returned {again!r}, the first one {eid!r}"

    # -- pops -----------------------------------------------------------------------------------
    def expect_pop(self, count: int, view) -> list[MEntry]:
        """The entries a pop of count (in ranks view) leases, in order; the model moves on."""
        want = [self.entries[eid] for eid in self.order(view)[:count]]
        for e in want:
            self.leave_level(e)
            e.state = "leased"
        return want

    def check_leases(self, got, want: list[MEntry], what: str) -> None:
        assert [x.id for x in got] == [e.eid for e in want], (
            f"{what}: delivered {[x.id for x in got]}, the model expects {[e.eid for e in want]}"
        )
        for x, e in zip(got, want):
            assert (x.payload, x.priority, x.tenant or "") == (
                e.payload,
                self.q.priority_of_rank(e.rank),
                e.tenant.replace("%2C", ","),
            ), what
            assert x.deliveries == e.d + 1, f"{what}: {x.id} delivered with count {x.deliveries}, expected {e.d + 1}"
            e.token = x.token

    def pop_and_ack(self, count: int, what: str) -> None:
        want = self.expect_pop(count, None)
        self.check_leases(self.q.pop(count), want, what)
        for e in want:
            assert self.q.ack((e.eid, e.token))
            self.end_lease(e)
            self.finish(e, "gone")

    @rule(count=st.sampled_from([1, 1, 2, 3, 7, 20]))
    def pop(self, count):
        want = self.expect_pop(count, None)
        self.check_leases(self.q.pop(count), want, f"pop({count})")

    @precondition(lambda self: not self.fair or self.fq.P)
    @rule(count=st.sampled_from([1, 3]), view=st.sampled_from(VIEWS), register=st.booleans())
    def pop_view(self, count, view, register):
        if register:
            self.q.register_view(*view)
            self.views.add(view)
        want = self.expect_pop(count, view)
        self.check_leases(self.q.pop(count, view=view), want, f"pop({count}, view={view})")

    @precondition(lambda self: not self.fair)
    @rule()
    def remove_highest_priority(self):
        want = self.order()[:1]
        got = self.q.remove_highest_priority()
        assert (got.id if got else None) == (want[0] if want else None)
        if want:
            self.finish(self.entries[want[0]], "gone")

    # -- ends of a lease ------------------------------------------------------------------------
    def leased(self) -> list[MEntry]:
        return sorted(self.state_of("leased"), key=lambda e: e.seq)

    def pick(self, i: int) -> MEntry:
        mine = self.leased()
        return mine[i % len(mine)]

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), many=st.booleans())
    def ack(self, i, many):
        e = self.pick(i)
        lease = (e.eid, e.token)
        assert (self.q.ack_many([lease]) if many else [self.q.ack(lease)]) == [True]
        self.end_lease(e)
        self.finish(e, "gone")

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), count_delivery=st.booleans())
    def requeue(self, i, count_delivery):
        e = self.pick(i)
        got = self.q.requeue((e.eid, e.token), count_delivery=count_delivery)
        d = e.d + 1 if count_delivery else e.d
        self.end_lease(e)
        self.come_back(e, d, "max_deliveries", got, "requeue")

    def come_back(self, e: MEntry, d: int, reason: str, got, what: str) -> None:
        e.d = d
        limit = self.q.max_deliveries
        expected = "dead" if limit and d >= limit else "waiting"
        if got is not None:
            assert got == expected, f"{what} of {e.eid} (deliveries {d}, limit {limit}) gave {got!r}"
        if expected == "dead":
            self.to_dead(e, reason)
        else:
            self.join_place(e)

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), reason=st.sampled_from(["rejected", "bad input"]))
    def dead_letter(self, i, reason):
        e = self.pick(i)
        assert self.q.dead_letter((e.eid, e.token), reason) == "dead"
        self.end_lease(e)
        self.to_dead(e, reason)

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100))
    def extend(self, i):
        e = self.pick(i)
        assert self.q.extend([(e.eid, e.token)], LEASE_SECONDS) == [True]

    @precondition(lambda self: self.stale)
    @rule(i=st.integers(0, 100), op=st.sampled_from(["ack", "extend", "requeue", "dead_letter"]))
    def stale_token_is_refused(self, i, op):
        eid, token = self.stale[i % len(self.stale)]
        lease = (eid, token)
        got = {
            "ack": lambda: self.q.ack(lease),
            "extend": lambda: self.q.extend([lease])[0],
            "requeue": lambda: self.q.requeue(lease),
            "dead_letter": lambda: self.q.dead_letter(lease),
        }[op]()
        assert got in (False, None), f"{op} with the stale token of {eid!r} was accepted: {got!r}"

    # -- the sweep --------------------------------------------------------------------------------
    def reclaim(self) -> dict:
        """Wait until every short delay is due, then sweep; the model follows."""
        short = [e.due for e in self.state_of("delayed") if e.short]
        if short:
            while redis_now_ms(self.client) <= max(short):
                time.sleep(0.005)
        expired = [
            e
            for e in self.leased()
            if e.token
            and self.client.zscore(self.q.keys.lease_deadlines, encode_id(e.eid)) <= redis_now_ms(self.client)
        ]
        cor = [e for e in self.state_of("corrupt") if e.was == "leased" and e.token]
        got = self.q.reclaim()
        for e in cor:  # a corrupted entry's expired lease ends too
            if not self.client.hexists(self.q.keys.leases, encode_id(e.eid)):
                e.token = None
                if self.fq:
                    self.fq.release(e.tenant)
        expired.sort(key=lambda e: encode_id(e.eid))
        dead = 0
        for e in expired:
            self.end_lease(e)
            self.come_back(e, e.d + 1, "max_deliveries", None, "reclaim")
            dead += e.state == "dead"
        due = [e for e in self.state_of("delayed") if e.short]
        for e in sorted(due, key=lambda e: (e.due, encode_id(e.eid))):
            self.join_back(e)
        extra = len(self.corrupt)  # corrupt entries the sweep reached go to the dead-letter queue
        assert (
            got["returned"] == len(expired) - dead
            and dead <= got["dead"] <= dead + extra
            and len(due) <= got["promoted"] <= len(due) + extra
        ), (
            f"reclaim gave {got}; the model expects {len(expired) - dead} returned, {dead} dead, "
            f"{len(due)} promoted (corrupt entries: {extra})"
        )
        return got

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), n=st.sampled_from([1, 1, 2, 5]))
    def expire(self, i, n):
        mine = self.leased()
        chosen = [mine[(i + k) % len(mine)] for k in range(min(n, len(mine)))]
        assert self.q.extend([(e.eid, e.token) for e in chosen], 0.001) == [True] * len(chosen)
        time.sleep(0.005)
        self.reclaim()

    @precondition(lambda self: any(e.short for e in self.state_of("delayed")))
    @rule()
    def promote(self):
        self.reclaim()

    # -- by id ------------------------------------------------------------------------------------
    @rule(x=st.sampled_from([x for x in IDS if x] + ["nope"]), by_eid=st.integers(0, 100))
    def remove(self, x, by_eid):
        live = sorted(self.entries)
        if by_eid % 3 == 0 and live:
            x = live[by_eid % len(live)]
        hit = [e for e in self.entries.values() if e.state in ("waiting", "delayed") and (e.eid == x or e.given == x)]
        cor = [e for e in self.state_of("corrupt") if e.was != "leased" and (e.eid == x or e.given == x)]
        n = self.q.remove(x)
        assert len(hit) <= n <= len(hit) + len(cor), f"remove({x!r}) removed {n}, the model: {[e.eid for e in hit]}"
        for e in cor:
            self.corrupt[e.eid] = True
        for e in hit:
            self.finish(e, "gone")

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 100), priority=st.sampled_from(PRIORITIES))
    def change_priority(self, i, priority):
        live = sorted(self.entries)
        e = self.entries[live[i % len(live)]]
        if e.state == "leased":
            with pytest.raises(NotWaiting):
                self.q.change_priority(e.eid, priority)
            return
        if e.state == "corrupt":
            return
        self.q.change_priority(e.eid, priority)
        self.seq += 1
        if e.state == "waiting":
            self.leave_level(e)
            if self.fq:  # the tenant's order loses the entry, then gets it back at the new priority
                e.state = "moving"
                if self.fq.level(e.rank) != self.fq.level(self.rank(priority)):
                    self.fq.left(self.fq.level(e.rank))  # (the new level counts it first)
                self.fq.refresh(e.tenant, False)
            e.rank, e.seq = self.rank(priority), self.seq
            self.join_back(e)
        else:
            e.rank, e.seq = self.rank(priority), self.seq

    @rule()
    def change_priority_of_a_missing_entry(self):
        with pytest.raises(EntryNotFound):
            self.q.change_priority("no-such-entry", 5)

    @rule()
    def purge(self):
        hit = [e for e in self.entries.values() if e.state in ("waiting", "delayed")]
        cor = [e for e in self.state_of("corrupt") if e.was != "leased"]
        n = self.q.purge()
        assert len(hit) <= n <= len(hit) + len(cor), f"purge deleted {n}; the model has {len(hit)} waiting or delayed"
        for e in cor:
            self.corrupt[e.eid] = True
        for e in hit:
            self.finish(e, "gone")

    @precondition(lambda self: not self.fair)
    @rule()
    def cleanup(self):
        self.q.cleanup()

    # -- the dead-letter queue ----------------------------------------------------------------------
    def dead_order(self) -> list[tuple]:
        return sorted(self.dead)

    @precondition(lambda self: self.dead)
    @rule(count=st.sampled_from([1, 3]))
    def consume_dead(self, count):
        """Take entries from <name>.dead and ack them: by priority, then in arrival order."""
        if self.corrupt or self.retired:
            return  # malformed dead letters (at ranks the model does not know) are in the way
        want = self.dead_order()[:count]
        got = self.q.dead.pop(count)
        assert [(x.payload, x.dead_reason) for x in got] == [(p, r) for _, _, p, r in want], "dead-letter order"
        assert self.q.dead.ack_many(got) == [True] * len(got)
        for row in want:
            self.dead.remove(row)

    @precondition(lambda self: self.dead and "dead_of_dead" not in SKIP)
    @rule()
    def dead_letter_queue_has_no_dead_letter_queue(self):
        """dead_letter() of a lease taken from <name>.dead is refused; requeue puts it back."""
        dq = self.q.dead
        [lease] = dq.pop(1)
        with pytest.raises(ValueError):
            dq.dead_letter(lease)
        assert dq.requeue(lease, count_delivery=False) == "waiting"

    # -- mode record ------------------------------------------------------------------------------
    @precondition(lambda self: "mode" not in SKIP)
    @rule(change=st.sampled_from(["fair", "order", "technique", "scope"]), op=st.sampled_from(["pop", "insert"]))
    def other_mode_is_refused(self, change, op):
        """A PriorityQueue whose mode differs from the recorded one changes nothing."""
        from celery_pq import ModeMismatch

        kw = dict(self.mode_kwargs, fair=self.fair)
        if change == "fair":
            kw["fair"] = not self.fair
            kw.pop("fair_scope", None)
        elif change == "order":
            kw["priority_order"] = {"higher_first": "lower_first", "lower_first": "higher_first"}[kw["priority_order"]]
        elif change == "technique" and not self.fair:
            kw["technique"] = {"T": "S", "S": "T"}[kw["technique"]]
        elif change == "scope" and self.fair:
            kw["fair_scope"] = {"within_priority": "tenant_first", "tenant_first": "within_priority"}[kw["fair_scope"]]
        else:
            return
        if not self.client.hlen(self.q.keys.entries):
            return  # a queue that holds nothing takes the mode of its next insert (nothing to strand)
        other = PriorityQueue(self.client, self.name, key_prefix=self.prefix, **kw)
        with pytest.raises(ModeMismatch):
            other.pop(5) if op == "pop" else other.insert(b"other", 5)

    # -- corrupt data -------------------------------------------------------------------------------
    @precondition(lambda self: self.corrupting and self.entries and "corrupt" not in SKIP)
    @rule(i=st.integers(0, 100), garbage=st.sampled_from(GARBAGE))
    def corrupt_an_entry(self, i, garbage):
        """Garbage in an entry of the identifier-indexed table: the scripts that reach it move it
        to <name>.dead (reason "malformed") and go on with the rest."""
        states = ("delayed", "leased") if self.fair else ("waiting", "delayed", "leased")
        live = sorted(eid for eid, e in self.entries.items() if e.state in states)
        if not live:
            return
        e = self.entries[live[i % len(live)]]
        self.client.hset(self.q.keys.entries, encode_id(e.eid), garbage)
        if e.state == "waiting":
            self.leave_level(e)
        e.was, e.state = e.state, "corrupt"
        self.corrupt[e.eid] = False

    # -- invariants -------------------------------------------------------------------------------
    def corrupt_in(self, key_members: set[bytes]) -> set[str]:
        return {eid for eid in self.corrupt if encode_id(eid) in key_members}

    def malformed(self) -> int:
        if not (self.corrupt or self.retired):
            return 0
        return sum(1 for x in self.q.dead.peek(10_000) if x.dead_reason == "malformed")

    @invariant()
    def each_entry_is_in_one_state(self):
        if self.q is None:
            return
        if self.corrupt:
            self.retire_corrupt()
        k = self.q.keys
        c = self.client
        ii = set(c.hkeys(k.entries))
        lt = set(c.hkeys(k.leases))
        dz = set(c.zrange(k.delayed, 0, -1))
        enc = lambda state: {encode_id(e.eid) for e in self.state_of(state)}  # noqa: E731
        bad_ii = {decode_id(x) for x in ii} - self.live_eids()
        assert not bad_ii, f"entries in the queue the model does not have: {sorted(bad_ii)}"
        missing = {eid for eid, e in self.entries.items() if e.state != "corrupt" and encode_id(eid) not in ii}
        assert not missing, f"entries the model has that are not in the queue: {sorted(missing)}"
        cor_lt, cor_dz = self.corrupt_in(lt), self.corrupt_in(dz)
        assert lt == enc("leased") | {encode_id(x) for x in cor_lt}, "leased entries differ"
        assert dz == enc("delayed") | {encode_id(x) for x in cor_dz}, "delayed entries differ"
        cor_ii = self.corrupt_in(ii)
        cor_waiting = len(cor_ii - cor_lt - cor_dz)
        waiting = len(self.state_of("waiting"))
        assert self.q.size() == waiting + cor_waiting
        s = self.q.stats()
        malformed = self.malformed()
        assert (s["waiting"], s["delayed"], s["leased"], s["dead"]) == (
            waiting + cor_waiting,
            len(self.state_of("delayed")) + len(cor_dz),
            len(self.state_of("leased")) + len(cor_lt),
            len(self.dead) + malformed,
        ), s
        assert self.q.dead.size() == len(self.dead) + malformed
        total, maybe_removed = self.corrupt_counts()
        gone = total - len(cor_ii)
        assert gone - maybe_removed <= malformed <= gone, (
            f"{malformed} malformed dead letters for {gone} corrupt entries that left the queue"
        )
        if self.fair:
            te = {split_tenant_member(m)[3] for m in c.zrange(k.tenant_entries, 0, -1)}
            assert te - {encode_id(x) for x in cor_ii} == enc("waiting"), "the tenants' orders differ from waiting"
        elif not self.corrupt:
            assert [x.id for x in self.q.peek(10_000)] == self.order(), "peek order"

    @invariant()
    def tenant_counts_agree(self):
        if self.q is None or self.corrupt:
            return
        want: dict = {}
        if self.fair:
            for e in self.entries.values():
                if e.state in ("waiting", "leased"):
                    row = want.setdefault(e.tenant.replace("%2C", ","), {"waiting": 0, "leased": 0})
                    row[e.state] += 1
        assert self.q.tenant_stats() == want

    @invariant()
    def keys_share_the_hash_tag(self):
        tag = f"{self.prefix}:{{{self.name}}}:".encode()
        strays = [k for k in self.client.scan_iter(match=f"{self.prefix}*", count=1000) if not k.startswith(tag)]
        assert not strays, f"keys outside the queue's hash tag: {strays}"

    def pointers(self, per_rank: bool = False):
        k = self.q.keys
        with self.client.pipeline(transaction=False) as p:
            for r in range(256):
                p.llen(k.level(r))
            lengths = p.execute()
        return lengths if per_rank else sum(lengths)

    @precondition(lambda self: "stale_bound" not in SKIP)
    @invariant()
    def stale_pointers_stay_bounded(self):
        if self.q is None:
            return
        self.peak = max(getattr(self, "peak", 0), self.client.hlen(self.q.keys.entries))
        n = max(self.pointers(per_rank=True))
        assert n <= 2 * self.peak + STALE_SLACK, f"{n} pointers in a rank list; the queue held {self.peak} at most"

    @precondition(lambda self: "wake" not in SKIP)
    @invariant()
    def work_has_a_wake_token(self):
        if self.q is None or self.corrupt:
            return
        k = self.q.keys
        if self.fair:
            if self.fq.ts:
                assert self.client.llen(k.wake) >= 1, "a schedulable tenant waits but the wake list is empty"
            return
        ranks = {e.rank for e in self.state_of("waiting")}
        if ranks:
            assert self.client.llen(k.wake) >= 1, "entries wait but the queue's wake list is empty"
        for lo, hi in self.views:
            if any(lo <= r <= hi for r in ranks):
                assert self.client.llen(k.view_wake(lo, hi)) >= 1, f"view {lo}..{hi} has work but no wake token"
        if self.dead:
            assert self.client.llen(self.q.dead.keys.wake) >= 1, (
                "dead letters wait but the dead queue's wake list is empty"
            )

    # -- the end: nothing stranded ----------------------------------------------------------------
    def drain_and_check(self):
        for _ in range(50):
            delayed = self.client.zrange(self.q.keys.delayed, 0, -1)
            if delayed:  # every delay is due now (on the Redis clock, 1970)
                self.client.zadd(self.q.keys.delayed, dict.fromkeys(delayed, 0))
                for e in self.state_of("delayed"):
                    e.short, e.due = True, 0
            mine = self.leased() + [e for e in self.state_of("corrupt") if e.token]
            if mine:
                pairs = [(e.eid, e.token) for e in mine]
                assert self.q.extend(pairs, 0.001) == [True] * len(pairs)
                time.sleep(0.005)
            self.reclaim()
            self.pop_and_ack(1000, "drain")
            if (
                not self.state_of("waiting")
                and not self.state_of("delayed")
                and not self.state_of("leased")
                and not self.client.hlen(self.q.keys.entries)
            ):
                break
        self.q.purge()
        k = self.q.keys
        left = {decode_id(x) for x in self.client.hkeys(k.entries)}
        assert not left, f"stranded entries after draining: {sorted(left)}"
        assert self.client.hlen(k.leases) == 0 and self.client.zcard(k.delayed) == 0
        assert self.pointers() == 0, "pointers left in the rank lists of an empty queue"
        if self.fair:
            assert self.client.exists(k.tenant_entries, k.tenant_schedule, k.tenant_states, k.tenant_counts) == 0, (
                "tenant state left in an empty queue"
            )
        dead = self.q.dead.peek(10_000)
        assert sorted((x.payload, x.dead_reason) for x in dead if x.dead_reason != "malformed") == sorted(
            (p, r) for _, _, p, r in self.dead
        )
        malformed = len(dead) - len(self.dead)
        total, maybe_removed = self.corrupt_counts()
        must = total - maybe_removed
        assert must <= malformed <= total, (
            f"{malformed} malformed dead letters for {total} corrupt entries ({must} not removed)"
        )


class FairMachine(QueueMachine):
    """A fair queue: both scopes, weights, concurrency caps."""

    fair = True

    @initialize(
        scope=st.sampled_from(["within_priority", "tenant_first"]),
        order=st.sampled_from(["higher_first", "lower_first"]),
        conc=st.sampled_from([0, 0, 1, 2]),
        max_deliveries=st.sampled_from([0, 3]),
    )
    def make_queue(self, scope, order, conc, max_deliveries):
        self.mode_kwargs = dict(priority_order=order, fair_scope=scope)
        self.q = PriorityQueue(
            self.client,
            self.name,
            key_prefix=self.prefix,
            lease_seconds=LEASE_SECONDS,
            max_deliveries=max_deliveries,
            fair=True,
            tenant_concurrency=conc or None,
            event_log=EVENT_CAP,
            **self.mode_kwargs,
        )
        self.fq = Fair(self, scope == "within_priority", conc)

    def expect_pop(self, count, view):
        from celery_pq.constants import FAIR_POP_MAX

        got = self.fq.pop(min(count, FAIR_POP_MAX), view)  # (a fair pop leases at most this many a call)
        for e in got:
            self.leave_level(e)
        return got

    @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([1, 2, 3]), cap=st.sampled_from([None, 1, 3]))
    def configure_tenant(self, tenant, weight, cap):
        self.q.configure_tenants(weights={tenant: weight}, concurrency={tenant: cap} if cap else None)
        t = escape_tenant(tenant)
        self.fq.weights[t] = weight
        if cap:
            self.fq.caps[t] = cap
            # a tenant parked at its old cap stays parked until one of its leases ends

    @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 40))
    def churn(self, tenant, n):
        """Many rounds of insert, pop, ack (a busy tenant beside a capped one)."""
        for _ in range(n):
            self.insert(None, 5, tenant, "now")
            self.pop_and_ack(1, "churn")

    @precondition(lambda self: "fair_state_bound" not in SKIP)
    @invariant()
    def fairness_state_of_tenants_that_left_is_bounded(self):
        """After a sweep, a finish tag is kept only for a tenant with entries, or one that is ahead
        of its level's virtual time (it was served recently)."""
        if self.q is None:
            return
        fv = {k.decode(): int(v) for k, v in self.client.hgetall(self.q.keys.virtual_times).items()}
        present = {e.tenant for e in self.entries.values()}
        for f, v in fv.items():
            if f.startswith("F:"):
                _, level, t = f.split(":", 2)
                if t not in present:
                    tags = sum(1 for x in fv if x.startswith("F:"))
                    assert v > fv.get(f"V:{level}", 0) or tags <= 4 * (len(TENANTS) + 1), (
                        f"finish tag {f}={v} of a tenant that left, behind V={fv.get(f'V:{level}')}"
                    )


class CorruptMachine(QueueMachine):
    corrupting = True


class FairCorruptMachine(FairMachine):
    corrupting = True


MACHINES = [QueueMachine, FairMachine, CorruptMachine, FairCorruptMachine]


def run(machine, profile: str) -> None:
    run_state_machine_as_test(machine, settings=settings.get_profile(profile))


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_model(redis_server, machine):
    global SERVER
    SERVER = redis_server
    run(machine, "ci")


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 600)
@pytest.mark.skipif(not SOAK_MINUTES, reason="set PQ_SOAK_MINUTES to soak (make soak)")
def test_model_soak(redis_server):
    global SERVER
    SERVER = redis_server
    end = time.monotonic() + SOAK_MINUTES * 60
    rounds = 0
    while time.monotonic() < end:
        run(MACHINES[rounds % len(MACHINES)], "soak")
        rounds += 1
