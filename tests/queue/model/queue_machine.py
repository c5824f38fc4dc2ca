"""One queue through the queue API beside the reference model: the rules of QueueMachine (a
plain queue, both priority orders, techniques T and S, priority views). Its checks are in
queue_checks.py, its fair and corrupting variants in fair_machine.py."""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from celery_pq import EntryNotFound, Item, NotWaiting, PriorityQueue
from celery_pq.queue import escape_tenant
from celery_pq.storage.constants import FAIR_PROMOTE, SWEEP_BATCH
from celery_pq.storage.ids import encode_id

from .common import (
    EVENT_CAP,
    GARBAGE,
    HELD,
    IDS,
    LEASE_SECONDS,
    LONG_MS,
    PRIORITIES,
    SHORT_MS,
    SKIP,
    TENANTS,
    VIEWS,
    MEntry,
    Session,
    forget_keys,
    open_model_queue,
    redis_now_ms,
)
from .fair import Fair
from .queue_checks import QueueChecks


class QueueMachine(QueueChecks, RuleBasedStateMachine):
    """A plain queue (both priority orders, techniques T and S) and its priority views."""

    fair = False
    corrupting = False

    def __init__(self):
        super().__init__()
        self.client = Session.server.client(decode_responses=False)
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
        self.q = open_model_queue(
            self.client, self.name, self.prefix, max_deliveries=max_deliveries, **self.mode_kwargs
        )

    def teardown(self):
        try:
            if self.q is not None:
                self.drain_and_check()
                self.events_agree_with_counters()
        finally:
            forget_keys(self.client, self.prefix)

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

    def end_lease(self, e: MEntry, held: int | None = None) -> None:
        """e's lease ended; by fair_cost "time" its tenant is charged ``held`` ms (what Redis
        charged: ``ending``; None: the delivery was undone)."""
        self.stale.append((e.eid, e.token))
        e.token = None
        if self.fq:
            self.fq.release(e.tenant)
            self.fq.settle(e, held)

    def held_ms(self, tenant: str) -> tuple[int, int]:
        """fair_cost "time": the ms tenant's leases were held (th), all time and the sum of its
        minutes."""
        th = self.client.hgetall(self.q.keys.tenant_held)
        t = tenant.encode()
        minutes = sum(int(v) for k, v in th.items() if b"|" in k and k.split(b"|", 1)[1] == t)
        return int(th.get(t, 0)), minutes

    def ending(self, e: MEntry, held: int, call, charged: bool = True):
        """``call()``, which ends e's lease alone. By fair_cost "time" its charge record (lc) is
        moved first as if delivered ``held`` ms before now (no seam: as clock.py moves stored
        times), so Redis charges ``held`` ms and the few the step takes; what it charged is read
        back from th (its all-time field, and its minutes' fields alike) and checked. Returns (call's result, the
        ms charged: None when not by time or not ``charged``, the delivery undone)."""
        fq = self.fq
        if fq is None or fq.cost != "time":
            return call(), None
        lc, eid = self.q.keys.lease_charges, encode_id(e.eid)
        rec = self.client.hget(lc, eid)
        assert rec is not None, f"{e.eid}: a lease of a fair_cost='time' queue without its charge record"
        pop_charged = rec.partition(b",")[2]
        assert int(pop_charged) == fq.lc[e.eid], (
            f"{e.eid}: the pop charged {int(pop_charged)}, the model expects {fq.lc[e.eid]}"
        )
        before = self.held_ms(e.tenant)
        start = time.monotonic()
        self.client.hset(lc, eid, b"%d,%s" % (redis_now_ms(self.client) - held, pop_charged))
        got = call()
        took = time.monotonic() - start
        after = self.held_ms(e.tenant)
        spent, minutes = after[0] - before[0], after[1] - before[1]
        assert minutes == spent, f"{e.eid}: th's minutes rose by {minutes} ms, its all-time field by {spent}"
        if not charged:
            assert spent == 0, f"{e.eid}: a delivery undone was charged {spent} ms"
            return got, None
        cap = Fair.MAX_HELD_MS
        most = min(held + math.ceil(took * 1000) + 1, cap)
        assert min(held, cap) <= spent <= most, (
            f"{e.eid}: held {held} ms (+ the step's {took * 1000:.1f}), charged {spent}"
        )
        return got, spent

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
        due, short = self.as_inserted(eid, due_ms if (due_ms and when != "past") else 0, short)
        self.add(eid, given, payload, priority, tenant, due, short)

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
            rows.append(Item(payload, priority, given, tenant=tenant or None, due_ms=due_ms))
            meta.append((given, payload, priority, tenant, due_ms or 0, short))
        eids = self.q.insert_many(rows)
        assert len(eids) == len(rows)
        for eid, (given, payload, priority, tenant, due, short) in zip(eids, meta):
            self.add(eid, given, payload, priority, tenant, *self.as_inserted(eid, due, short))

    def as_inserted(self, eid: str, due: int, short: bool) -> tuple[int, bool]:
        """(due, short) of an entry as the insert found it: a short delay whose time had come by
        the time the insert reached Redis (a slow machine: more than SHORT_MS after due_for read
        the clock) was stored waiting, as the insert script does with a due time not ahead."""
        if short and due and self.client.zscore(self.q.keys.delayed, encode_id(eid)) is None:
            assert redis_now_ms(self.client) >= due, f"{eid}: a delayed entry not due yet is not delayed"
            return 0, False
        return due, short

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
                self.q._scripts.priority_of_rank(e.rank),
                e.tenant.replace("%2C", ","),
            ), what
            assert x.deliveries == e.d + 1, f"{what}: {x.id} delivered with count {x.deliveries}, expected {e.d + 1}"
            e.token = x.token

    def popping(self, pop):
        """Run ``pop()``, a pop script's call: the delayed entries due by then joined the back of
        their priorities first, in due order (ties by id), as the sweep promotes them
        (includes/delays.lua); the model follows. Those due before the call must have gone (up to
        the FAIR_PROMOTE, or more, a call takes), none due after it. Every short delay is waited out first,
        as the sweep's rule does: which entries a pop promotes must not depend on the machine's
        speed (hypothesis replays a run's choices and must see the same rules open)."""
        short = [e.due for e in self.state_of("delayed") if e.short]
        while short and redis_now_ms(self.client) <= max(short):
            time.sleep(0.005)
        before = redis_now_ms(self.client)
        got = pop()
        after = redis_now_ms(self.client)
        dz = set(self.client.zrange(self.q.keys.delayed, 0, -1))
        delayed = self.state_of("delayed")
        went = sorted((e for e in delayed if encode_id(e.eid) not in dz), key=lambda e: (e.due, encode_id(e.eid)))
        late = [e.eid for e in delayed if e.due <= before and e not in went]
        assert len(went) >= FAIR_PROMOTE or not late, f"a pop left due delayed entries waiting for the sweep: {late}"
        early = [e.eid for e in went if e.due > after]
        assert not early, f"a pop promoted delayed entries not due yet: {early}"
        for e in went:
            self.join_back(e)
        return got

    def pop_and_ack(self, count: int, what: str, held: int = 0) -> None:
        got = self.popping(lambda: self.q.pop(count))
        want = self.expect_pop(count, None)
        self.check_leases(got, want, what)
        for k, e in enumerate(want):
            acked, spent = self.ending(e, held + k, lambda: self.q.ack((e.eid, e.token)))
            assert acked
            self.end_lease(e, spent)
            self.finish(e, "gone")

    @rule(count=st.sampled_from([1, 1, 2, 3, 7, 20]))
    def pop(self, count):
        got = self.popping(lambda: self.q.pop(count))
        want = self.expect_pop(count, None)
        self.check_leases(got, want, f"pop({count})")

    @precondition(lambda self: not self.fair or self.fq.P)
    @rule(count=st.sampled_from([1, 3]), view=st.sampled_from(VIEWS), register=st.booleans())
    def pop_view(self, count, view, register):
        if register:
            self.q.register_view(*view)
            self.views.add(view)
        got = self.popping(lambda: self.q.pop(count, view=view))
        want = self.expect_pop(count, view)
        self.check_leases(got, want, f"pop({count}, view={view})")

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
    @rule(i=st.integers(0, 100), many=st.booleans(), held=st.sampled_from(HELD))
    def ack(self, i, many, held=0):
        e = self.pick(i)
        lease = (e.eid, e.token)
        got, spent = self.ending(e, held, lambda: self.q.ack([lease]) if many else [self.q.ack(lease)])
        assert got == [True]
        self.end_lease(e, spent)
        self.finish(e, "gone")

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), count_delivery=st.booleans(), held=st.sampled_from(HELD))
    def requeue(self, i, count_delivery, held=0):
        e = self.pick(i)
        requeue = lambda: self.q.requeue((e.eid, e.token), count_delivery=count_delivery)  # noqa: E731
        got, spent = self.ending(e, held, requeue, charged=count_delivery)
        d = e.d + 1 if count_delivery else e.d
        self.end_lease(e, spent)
        self.come_back(e, d, "max_deliveries", got, "requeue")

    def come_back(self, e: MEntry, d: int, reason: str, got, what: str) -> None:
        e.d = d
        limit = self.q.settings.max_deliveries
        expected = "dead" if limit and d >= limit else "waiting"
        if got is not None:
            assert got == expected, f"{what} of {e.eid} (deliveries {d}, limit {limit}) gave {got!r}"
        if expected == "dead":
            self.to_dead(e, reason)
        else:
            self.join_place(e)

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), reason=st.sampled_from(["rejected", "bad input"]), held=st.sampled_from(HELD))
    def dead_letter(self, i, reason, held=0):
        e = self.pick(i)
        got, spent = self.ending(e, held, lambda: self.q.dead_letter((e.eid, e.token), reason))
        assert got == "dead"
        self.end_lease(e, spent)
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
    def reclaim(self, held: int = 0) -> dict:
        """Wait until every short delay is due, then sweep; the model follows, lease by lease in
        the sweep's order (deadline, then stored id). By fair_cost "time" the k-th lease that
        runs out is made to have been held ``held + k`` ms up to its deadline (its charge record
        moved, as ``ending`` does), which the sweep charges exactly."""
        short = [e.due for e in self.state_of("delayed") if e.short]
        if short:
            while redis_now_ms(self.client) <= max(short):
                time.sleep(0.005)
        k = self.q.keys
        now = redis_now_ms(self.client)
        ending = []  # (deadline, stored id, entry): the leases that run out, corrupted entries' too
        for e in self.leased() + [e for e in self.state_of("corrupt") if e.was == "leased"]:
            deadline = self.client.zscore(k.lease_deadlines, encode_id(e.eid)) if e.token else None
            if deadline is not None and deadline <= now:
                ending.append((int(deadline), encode_id(e.eid), e))
        ending.sort(key=lambda x: x[:2])
        charges: dict[str, int] = {}  # eid -> ms held (fair_cost "time")
        before: dict[str, int] = {}
        if self.fq is not None and self.fq.cost == "time":
            for n, (deadline, eid, e) in enumerate(ending):
                pop_charged = self.client.hget(k.lease_charges, eid).partition(b",")[2]
                assert int(pop_charged) == self.fq.lc[e.eid], f"{e.eid}: the pop charged {int(pop_charged)}"
                self.client.hset(k.lease_charges, eid, b"%d,%s" % (deadline - held - n, pop_charged))
                charges[e.eid] = held + n
                before[e.tenant] = self.held_ms(e.tenant)[0]
        got = self.q.reclaim()
        dead = 0
        expired = [e for _, _, e in ending if e.state == "leased"]
        for _, eid, e in ending:
            if e.state == "corrupt":  # a corrupted entry's expired lease ends too
                assert not self.client.hexists(k.leases, eid), f"the expired lease of corrupt {e.eid} is still there"
                e.token = None
                if self.fq:
                    self.fq.release(e.tenant)
                    self.fq.settle(e, charges.get(e.eid))
                continue
            self.end_lease(e, charges.get(e.eid))
            self.come_back(e, e.d + 1, "max_deliveries", None, "reclaim")
            dead += e.state == "dead"
        for t, was in before.items():
            want = sum(min(charges[e.eid], Fair.MAX_HELD_MS) for _, _, e in ending if e.tenant == t)
            assert self.held_ms(t)[0] - was == want, (
                f"the sweep charged {t!r} {self.held_ms(t)[0] - was} ms, not {want}"
            )
        # the due ones in due order (ties by id), at most a sweep call's batch: the rest stay for
        # the next call (``more``) or a pop
        due = sorted((e for e in self.state_of("delayed") if e.short), key=lambda e: (e.due, encode_id(e.eid)))
        dz = set(self.client.zrange(self.q.keys.delayed, 0, -1))
        went = [e for e in due if encode_id(e.eid) not in dz]
        extra = len(self.corrupt)  # corrupt entries the sweep reached go to the dead-letter queue
        batch = FAIR_PROMOTE if self.fq else SWEEP_BATCH
        assert went == due[: len(went)] and (len(went) == len(due) or (got["more"] and len(went) + extra >= batch)), (
            f"reclaim promoted {[e.eid for e in went]} of the due {[e.eid for e in due]} (batch {batch}, {got})"
        )
        for e in went:
            self.join_back(e)
        if self.fq:
            self.fq.gc()
        assert (
            got["returned"] == len(expired) - dead
            and dead <= got["dead"] <= dead + extra
            and len(went) <= got["promoted"] <= len(went) + extra
        ), (
            f"reclaim gave {got}; the model expects {len(expired) - dead} returned, {dead} dead, "
            f"{len(went)} promoted (corrupt entries: {extra})"
        )
        return got

    @precondition(lambda self: self.state_of("leased"))
    @rule(i=st.integers(0, 100), n=st.sampled_from([1, 1, 2, 5]), held=st.sampled_from(HELD))
    def expire(self, i, n, held=0):
        mine = self.leased()
        chosen = [mine[(i + k) % len(mine)] for k in range(min(n, len(mine)))]
        assert self.q.extend([(e.eid, e.token) for e in chosen], 0.001) == [True] * len(chosen)
        time.sleep(0.005)
        self.reclaim(held)

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
        assert self.q.dead.ack(got) == [True] * len(got)
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
    @rule(
        change=st.sampled_from(["fair", "order", "technique", "scope", "cost"]),
        op=st.sampled_from(["pop", "insert"]),
        cost=st.sampled_from(["tasks", "declared", "time"]),
    )
    def other_mode_is_refused(self, change, op, cost="tasks"):
        """A PriorityQueue whose mode differs from the recorded one changes nothing."""
        from celery_pq import ModeMismatch

        kw = dict(self.mode_kwargs, fair=self.fair)
        if change == "fair":
            kw["fair"] = not self.fair
            kw.pop("fair_scope", None)
            kw.pop("fair_cost", None)
        elif change == "order":
            kw["priority_order"] = {"higher_first": "lower_first", "lower_first": "higher_first"}[kw["priority_order"]]
        elif change == "technique" and not self.fair:
            kw["technique"] = {"T": "S", "S": "T"}[kw["technique"]]
        elif change == "scope" and self.fair:
            kw["fair_scope"] = {"within_priority": "tenant_first", "tenant_first": "within_priority"}[kw["fair_scope"]]
        elif change == "cost" and self.fair:  # fair_cost, recorded in the mode as fair_scope is
            others = [c for c in ("tasks", "declared", "time") if c != kw["fair_cost"]]
            kw["fair_cost"] = cost if cost in others else others[0]
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
