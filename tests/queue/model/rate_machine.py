"""Rates, weights and caps on a fair queue of one or more shards (docs/rate-limits.md,
docs/fairness.md, docs/relaxed.md), opened as every process opens it (``open_queue``), beside
a second process that opens it with other options (docs/settings.md).

The queue: a limited task's tenant ``task:t.limited`` with the task's rate, a tenant ``a`` with
a rate and a concurrency cap of its own, the default tenant and ``b`` under the ``tenant_rate``
default (when one is drawn), ``b`` with a weight. Time is real and short: rates of 10 to 40 per
second, sleeps of tens of ms. The model does not predict the order (the other machines do, and a
sharded pop is relaxed); it holds what must hold whatever the order:

- every entry inserted is delivered, acked or given back exactly as the model has it, and is
  delivered in the end (the drain waits no longer than its tenant's rate needs);
- no rated tenant is delivered more than max(N, 1) + N * w times in any window of w seconds,
  counted over all shards together from the shards' event logs (the Redis clock's times);
- no capped tenant holds more leases than its cap;
- a Redis clock step back (the stored times moved ahead, clock.py) costs a rated tenant one
  period at most: a pop after one period delivers it again;
- a second process that opens the queue with other options (fewer, or disagreeing) is told
  at open (a warning naming the option) and changes nothing: the stored rates, caps and mode
  stand, and its inserts go under them.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.ids import decode_id

from . import clock
from .common import EVENT_CAP, SKIP, Session, forget_keys
from .ledger import Ledger

LIMITED = "task:t.limited"
TENANTS = [LIMITED, LIMITED, "a", "b", ""]
#: Windows (s) over which the delivery bound is checked.
WINDOWS = (0.1, 0.25, 0.5, 1.0, 2.0)
#: Inserts of one example at most (the drain then waits at most backlog / rate seconds).
MOST = 30


class _Told(logging.Handler):
    """The warnings of the celery_pq logger while a second process opens the queue."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record):
        self.said.append(record.getMessage())


class RateMachine(RuleBasedStateMachine):
    examples = {"ci": 12, "soak": 25}
    steps = {"ci": 25}

    def __init__(self):
        super().__init__()
        self.client = Session.server.client(decode_responses=False)
        self.prefix = "pqr" + uuid.uuid4().hex[:12]
        self.name = "r"
        self.waiting: dict[str, str] = {}  # entry id -> tenant
        self.leased: dict[str, tuple] = {}  # entry id -> (tenant, lease)
        self.ledger = Ledger()
        self.inserted = 0
        self.told: set[str] = set()
        self.q = None

    @initialize(
        shards=st.sampled_from([1, 1, 2, 3]),
        limited=st.sampled_from([10.0, 40.0]),
        a_rate=st.sampled_from([None, 20.0]),
        a_cap=st.sampled_from([None, 1, 2]),
        default_rate=st.sampled_from([None, 25.0]),
        b_weight=st.sampled_from([1, 3]),
    )
    def make(self, shards, limited, a_rate, a_cap, default_rate, b_weight):
        self.rates = {LIMITED: limited}
        if a_rate:
            self.rates["a"] = a_rate
        self.default_rate = default_rate
        self.caps = {"a": a_cap} if a_cap else {}
        self.settings = QueueSettings(
            key_prefix=self.prefix,
            fair=True,
            lease_seconds=60,
            tenant_rate=default_rate,
            shards=shards,
            event_log=EVENT_CAP,
            rate=dict(self.rates),
            concurrency=dict(self.caps) or None,
            weights={"b": b_weight},
        )
        self.q = open_queue(self.client, self.name, self.settings)
        self.shards = getattr(self.q, "shards", [self.q])

    def teardown(self):
        try:
            if self.q is not None:
                self.drain()
        finally:
            forget_keys(self.client, self.prefix)

    def rate_of(self, tenant: str) -> float | None:
        return self.rates.get(tenant, self.default_rate if tenant in ("", "b") else None)

    # -- rules ------------------------------------------------------------------------------------
    @precondition(lambda self: self.inserted < MOST)
    @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 6), priority=st.sampled_from([0, 5]))
    def insert(self, tenant, n, priority, q=None):
        for _ in range(min(n, MOST - self.inserted)):
            eid = (q or self.q).insert(b"x", priority, tenant=tenant or None)
            self.inserted += 1
            self.waiting[eid] = tenant
            self.ledger.published(eid, "stored", eid)

    @rule(count=st.sampled_from([1, 3, 10]))
    def pop(self, count, q=None):
        for lease in (q or self.q).pop(count):
            tenant = self.waiting.pop(lease.id, None)
            assert tenant is not None, f"delivered {lease.id!r}, which the model has not waiting"
            assert (lease.tenant or "") == tenant, f"{lease.id!r} delivered as tenant {lease.tenant!r}, not {tenant!r}"
            self.leased[lease.id] = (tenant, lease)

    @rule(i=st.integers(0, 100), back=st.booleans())
    def ack_or_requeue(self, i, back):
        # (no precondition: what a pop gave depends on real time here, and hypothesis must see
        # the same rules open when it replays a run's choices)
        if not self.leased:
            return
        eid = sorted(self.leased)[i % len(self.leased)]
        tenant, lease = self.leased.pop(eid)
        if back:
            assert self.q.requeue(lease) == "waiting"
            self.waiting[eid] = tenant
        else:
            assert self.q.ack(lease)
            self.ledger.ended(eid, "acked")

    @rule(ms=st.sampled_from([10, 30, 80]))
    def time_passes(self, ms):
        time.sleep(ms / 1000)

    @rule()
    def sweep(self):
        self.q.reclaim()

    @precondition(lambda self: "rate_clock" not in SKIP)
    @rule(back=st.sampled_from([500, 5_000]))
    def clock_steps_back(self, back):
        """Redis's clock steps back: a rated tenant with work waits one period at most."""
        for shard in self.shards:
            clock.shift(self.client, shard.keys, back, leases=True)
        home = self.q.shard_for(tenant=LIMITED) if len(self.shards) > 1 else self.q
        self.pop(10, home)  # (the first pop after the step parks it again, for what its bucket lacks)
        time.sleep(1 / self.rates[LIMITED] + 0.03)
        had = left = sum(1 for t in self.waiting.values() if t == LIMITED)
        for _ in range(5):  # (other tenants of its shard may fill a pop before its turn)
            self.pop(10, home)
            left = sum(1 for t in self.waiting.values() if t == LIMITED)
            if left < had:
                break
        assert not had or left < had, f"a clock step back of {back} ms held {LIMITED} for more than one period"

    @precondition(lambda self: "second_process" not in SKIP)
    @rule(
        change=st.sampled_from(["fewer", "rate", "plain", "order"]),
        n=st.integers(0, 3),
        tenant=st.sampled_from(TENANTS),
    )
    def second_process(self, change, n, tenant):
        """A producer opens the queue with other options: it is told at open, and what it
        publishes goes under the queue's own settings."""
        kw = dict(key_prefix=self.prefix, shards=len(self.shards), event_log=EVENT_CAP)
        if change == "rate":
            kw.update(fair=True, rate={LIMITED: self.rates[LIMITED] * 10})
        elif change == "order":
            kw.update(fair=True, priority_order="lower_first")
        elif change == "fewer":
            kw.update(fair=True)
        told = _Told()
        log = logging.getLogger("celery_pq")
        log.addHandler(told)
        try:
            other = open_queue(self.client, self.name, QueueSettings(**kw), declare=False)
        finally:
            log.removeHandler(told)
        option = {"plain": "fair is", "order": "priority_order", "rate": LIMITED}.get(change)
        recorded = self.client.get(self.shards[0].keys.mode) is not None
        if option and recorded and option not in self.told:  # (told once per process)
            assert any(option in said for said in told.said), f"a process with other {option} was not told: {told.said}"
            self.told.add(option)
        before = self.stored_tables()
        self.insert(tenant, n, 5, q=other)
        after = self.stored_tables()
        if before[0][1] is None:  # (the first insert records the mode: the queue's own settings')
            before = [(t, m) for (t, _), (_, m) in zip(before, after)]
        assert after == before, "a second process's insert changed the queue's settings"

    def stored_tables(self) -> list:
        """Each shard's tenants' tables and mode (less the event log's switch, which any process
        that has the log turns on: docs/settings.md)."""
        out = []
        for s in self.shards:
            mode = re.sub(rb"e\d+", b"", self.client.get(s.keys.mode) or b"")
            out.append((self.client.hgetall(s.keys.tenant_settings), mode or None))
        return out

    # -- checks -----------------------------------------------------------------------------------
    @invariant()
    def entries_agree(self):
        if self.q is None:
            return
        ii = set()
        for s in self.shards:
            ii |= {decode_id(x) for x in self.client.hkeys(s.keys.entries)}
        assert ii == set(self.waiting) | set(self.leased), (
            f"entries: the queue has {sorted(ii - set(self.waiting) - set(self.leased))} more, "
            f"{sorted(set(self.waiting) | set(self.leased) - ii)} fewer"
        )
        lost = self.ledger.unaccounted(set(self.waiting) | set(self.leased))
        assert not lost, f"inserts unaccounted for: {lost[:5]}"

    @invariant()
    def caps_hold(self):
        for tenant, cap in self.caps.items():
            held = sum(1 for t, _ in self.leased.values() if t == tenant)
            assert held <= cap, f"tenant {tenant!r} holds {held} leases, its cap is {cap}"

    @invariant()
    def no_rate_is_exceeded(self):
        """In any window of w seconds, over all shards: at most max(N, 1) + N * w deliveries."""
        if self.q is None:
            return
        times: dict[str, list[int]] = {}
        for s in self.shards:
            for e in s.events():
                if e["e"] == "deliver":
                    times.setdefault(e.get("t") or "", []).append(int(e["ms"]))
        for tenant, ms in times.items():
            rate = self.rate_of(tenant)
            if not rate:
                continue
            ms.sort()
            for w in WINDOWS:
                bound = max(rate, 1) + rate * w + 1  # (+1: the log's times are whole ms)
                j = 0
                for i, start in enumerate(ms):
                    while j < len(ms) and ms[j] <= start + w * 1000:
                        j += 1
                    assert j - i <= bound, (
                        f"tenant {tenant!r} (rate {rate}/s): {j - i} deliveries within {w} s from {start}, "
                        f"bound {bound:g}"
                    )

    # -- the end ----------------------------------------------------------------------------------
    def drain(self) -> None:
        """Everything is delivered, no later than the rates allow."""
        for eid, (_, lease) in list(self.leased.items()):
            assert self.q.ack(lease)
            self.ledger.ended(eid, "acked")
        self.leased.clear()
        backlog = {t: sum(1 for x in self.waiting.values() if x == t) for t in set(self.waiting.values())}
        need = max([n / (self.rate_of(t) or 1000) for t, n in backlog.items()] + [0])
        deadline = time.monotonic() + need * len(self.shards) + 2
        while self.waiting and time.monotonic() < deadline:
            self.q.reclaim()
            self.pop(50)
            for eid, (_, lease) in list(self.leased.items()):
                assert self.q.ack(lease)
                self.ledger.ended(eid, "acked")
            self.leased.clear()
            time.sleep(0.01)
        assert not self.waiting, f"not delivered within the rates' time ({need:.2f} s): {backlog}"
        self.no_rate_is_exceeded()
