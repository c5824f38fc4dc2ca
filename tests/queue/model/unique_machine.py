"""Unique keys (docs/unique.md) beside a reference model: publishes through kombu with the
headers a Celery task carries (``id``, ``task``, ``retries``) and ``pq_unique``, in all five
modes, with fresh task ids, fixed (deterministic) task ids, and retries of a running task; the
queue's side (pop, ack, requeue, dead letter, lease expiry, remove, replay, the sweep) through
the queue API; time passing and a Redis clock step through the stored times (clock.py).

The model of one key (each key has one mode for a whole example):

- ``while_waiting``/``while_active``: a publish while the key's entry waits (or, for
  while_active, is leased) is merged into it; else stored, and the new entry stands.
- ``replace``/``debounce``: a publish while the key's entry waits or is delayed takes its place
  (replaced/debounced: the old one ends so); while it is leased, stored. A debounced entry is
  delayed by the delay from this publish.
- ``throttle``: a publish within the period of the last stored one is throttled into it.
- A retry (the standing task's id with more ``retries`` than the publish that stored it) finds
  nothing standing; a fresh publish that reuses a fixed task id is judged as any other.
- A key is freed when its entry is acked, dead-lettered or removed (either technique); a
  lease that runs out keeps it; a dead letter keeps its key for a replay, which holds it
  again, or is merged into the entry that holds it by then.
- A clock step back costs a throttle or a debounce one period at most: a throttle record more
  than a period ahead is clamped by the publish that meets it, a debounced entry's due time by
  the sweep (it is promoted at the sweep after).

Checks after every step: the entries and their states, the delivery order, every publish
accounted for (ledger.py), and the key records: an entry's record and holder stand exactly
while the model's entry holds the key, and a throttle record stands until its period ends and
is gone after the next sweep.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kombu import Connection, Exchange, Producer, Queue

from celery_pq import PriorityQueue, publish_outcome
from celery_pq.storage.ids import encode_id

from . import clock
from .common import EVENT_CAP, SKIP, Session, forget_keys, open_model_queue, redis_now_ms
from .ledger import Ledger, events_account

MODES = ["while_waiting", "while_active", "replace", "debounce", "throttle"]
KEYS = ["k1", "k2", "k3"]
#: The debounce delay and throttle period (s): long, so that only the model's clock moves them.
PERIOD = 60
PERIOD_MS = PERIOD * 1000
HOUR_MS = 3_600_000
#: Priorities of the publishes (kombu's 0 is "none given").
PRIORITIES = [3, 7]


@dataclass
class UEntry:
    eid: str
    tid: str  # the task id published (the entry id, or "<tid>~<seq>")
    key: str
    mode: str
    rank: int
    seq: int
    state: str  # waiting, delayed, leased
    holds: bool  # flag "u": an entry of a mode other than throttle
    d: int = 0
    token: str | None = None
    due: int = 0  # a delayed entry's due time, ms on the model's clock
    published: int = 0  # a debounced entry's publish time (the sweep's unstretch reads it)
    retries: int = 0  # the retries header of the publish that stored it


class UniqueMachine(RuleBasedStateMachine):
    examples = {"ci": 30}

    def __init__(self):
        super().__init__()
        self.client = Session.server.client(decode_responses=False)
        self.prefix = "pqu" + uuid.uuid4().hex[:12]
        self.name = "u"
        self.entries: dict[str, UEntry] = {}
        self.levels: dict[int, list[str]] = {}
        self.records: dict[str, tuple] = {}  # key -> ("e", eid, retries) or ("t", eid, retries, until_ms)
        self.dead: dict[str, UEntry] = {}  # dead letters by their dead-queue id
        self.ledger = Ledger()
        self.seq = 0
        self.fresh = 0  # (fresh_id)
        self.conn: Connection | None = None
        self.q: PriorityQueue | None = None

    @initialize(
        technique=st.sampled_from(["T", "S"]),
        modes=st.lists(st.sampled_from(MODES), min_size=len(KEYS), max_size=len(KEYS)),
        max_deliveries=st.sampled_from([0, 2]),
    )
    def make(self, technique, modes, max_deliveries):
        self.modes = dict(zip(KEYS, modes))
        opts = dict(key_prefix=self.prefix, technique=technique, event_log=EVENT_CAP, unique_seconds=PERIOD)
        self.conn = Connection(f"pq://127.0.0.1:{Session.server.port}/0", transport_options=opts)
        self.kq = Queue(self.name, Exchange(self.name, type="direct"), routing_key=self.name)
        self.producer = Producer(self.conn.default_channel)
        self.kq(self.conn.default_channel).declare()
        self.q = open_model_queue(
            self.client, self.name, self.prefix, technique=technique, max_deliveries=max_deliveries
        )

    def teardown(self):
        try:
            if self.q is not None:
                self.drain()
                events_account(self.q.events())
        finally:
            if self.conn is not None:
                self.conn.close()
            forget_keys(self.client, self.prefix)

    # -- the model's order (one list per rank, as QueueMachine) -----------------------------------
    def order(self) -> list[str]:
        return [eid for r in sorted(self.levels) for eid in self.levels[r]]

    def join_back(self, e: UEntry) -> None:
        e.state = "waiting"
        self.levels.setdefault(e.rank, []).append(e.eid)

    def join_place(self, e: UEntry) -> None:
        e.state = "waiting"
        row = self.levels.setdefault(e.rank, [])
        for i, eid in enumerate(row[:32]):
            if self.entries[eid].seq > e.seq:
                row.insert(i, e.eid)
                return
        row.insert(min(len(row), 32), e.eid)

    def leave_level(self, e: UEntry) -> None:
        row = self.levels.get(e.rank, [])
        if e.eid in row:
            row.remove(e.eid)
            if not row:
                del self.levels[e.rank]

    def end(self, e: UEntry, fate: str) -> None:
        """Entry e leaves the queue: its key is free when it stood for it."""
        if e.state == "waiting":
            self.leave_level(e)
        del self.entries[e.eid]
        rec = self.records.get(e.key)
        if rec is not None and rec[:2] == ("e", e.eid):
            del self.records[e.key]
        self.ledger.ended(e.eid, fate)

    @staticmethod
    def outcome(mode: str, s) -> tuple[str, object]:
        """(the outcome, the standing entry or its id) of a publish of mode, s standing."""
        if s is None or (not isinstance(s, str) and s.state == "leased" and mode in ("replace", "debounce")):
            return "stored", None
        if isinstance(s, str):
            return "throttled", s
        return {"while_waiting": "merged", "while_active": "merged", "replace": "replaced"}.get(mode, "debounced"), s

    def standing(self, key: str, mode: str, tid: str, retries: int, now: int) -> UEntry | str | None:
        """What stands for a publish of key (mode, task id, retries) at now: an entry, the
        entry id of a throttle record, or None."""
        rec = self.records.get(key)
        if rec is None:
            return None
        retry = retries > rec[2] and (rec[1] == tid or rec[1].startswith(tid + "~"))
        if mode == "throttle":
            return rec[1] if rec[0] == "t" and not retry and rec[3] > now else None
        if rec[0] != "e":
            return None
        e = self.entries[rec[1]]
        if e.state == "leased" and (mode == "while_waiting" or retry):
            return None
        return e

    # -- publishes --------------------------------------------------------------------------------
    def publish(self, key: str, tid: str, priority: int, retries: int) -> None:
        mode = self.modes[key]
        headers = {"id": tid, "task": "t.unique", "retries": retries, "pq_unique": key, "pq_unique_mode": mode}
        before = redis_now_ms(self.client)
        self.producer.publish(
            {"tid": tid}, exchange=self.kq.exchange, routing_key=self.name, headers=headers, priority=priority
        )
        after = redis_now_ms(self.client)
        out = publish_outcome(tid)
        assert out is not None and out.key == key, f"no outcome for {tid!r}"
        choices = [self.outcome(mode, self.standing(key, mode, tid, retries, t)) for t in (before, after)]
        fits = [c for c in choices if c[0] == out.kind]
        assert fits, (
            f"publish {tid!r} of key {key} ({mode}, retries {retries}): {out.kind} into {out.task_id!r}; "
            f"the model expects {choices[0][0]} into {choices[0][1]!r}"
        )
        want, s = fits[0]
        rec = self.records.get(key)
        if want == "throttled":  # a record more than a period ahead is clamped to now + period
            got = self.record(key)
            until = got[3]
            assert (got[:3] == rec[:3]) and min(rec[3], before + PERIOD_MS) <= until <= min(
                rec[3], after + PERIOD_MS
            ), f"throttle record {got} after a throttled publish; the model had {rec}"
            self.records[key] = got
        if want in ("merged", "throttled"):
            stood = s if isinstance(s, str) else s.eid
            assert out.task_id == stood, f"{tid!r} {want} into {out.task_id!r}, the model: {stood!r}"
            self.ledger.published(tid, want, stood)
            return
        eid = out.task_id
        old = s if isinstance(s, UEntry) else None
        others = set(self.entries) - {old.eid if old else None}
        if tid in others:
            assert eid.startswith(tid + "~"), f"{tid!r}, the id of a live entry, stored as {eid!r}"
        else:
            assert eid == tid, f"{tid!r}, a free id, stored as {eid!r}"
        self.seq += 1
        e = UEntry(eid, tid, key, mode, self.q.rank(priority), self.seq, "delayed", mode != "throttle")
        e.retries = retries
        keep_place = old is not None and want == "replaced" and old.state == "waiting" and old.rank == e.rank
        if old is not None:  # (it may have had the same id)
            if keep_place:
                old.state = "moved"  # its place in line is the new one's
            self.end(old, want)
        if keep_place:  # its place in line, and the sequence a return to its place goes by
            row = self.levels[old.rank]
            row[row.index(old.eid)] = eid
            e.seq = old.seq
        self.entries[eid] = e
        self.ledger.reborn(eid)
        if mode == "debounce":  # delayed by the delay from this publish
            e.due = int(self.client.zscore(self.q.keys.delayed, eid))
            assert before + PERIOD_MS <= e.due <= after + PERIOD_MS, f"debounced {eid!r} due at {e.due}"
            e.published = e.due - PERIOD_MS
        elif not keep_place:
            self.join_back(e)
        else:
            e.state = "waiting"
        got = self.record(key)
        if mode == "throttle":
            assert got[:3] == ("t", eid, retries) and before + PERIOD_MS <= got[3] <= after + PERIOD_MS, (
                f"throttle record {got} of {eid!r}"
            )
        else:
            assert got == ("e", eid, retries), f"key record {got} of {eid!r}"
        self.records[key] = got
        self.ledger.published(tid, want, eid)

    def record(self, key: str) -> tuple | None:
        """The queue's record of key, as the model keeps it."""
        rec = self.client.hget(self.q.keys.unique_keys, key)
        if rec is None:
            return None
        kind, until, retries, eid = rec.decode().split("|", 3)
        return ("e", eid, int(retries)) if kind == "e" else ("t", eid, int(retries), int(until))

    @rule(
        key=st.sampled_from(KEYS),
        fixed=st.sampled_from([None, None, "f1", "f2"]),
        priority=st.sampled_from(PRIORITIES),
    )
    def publish_new(self, key, fixed, priority):
        """A fresh publish: a new task id, or a fixed one reused by every publish of it."""
        tid = self.fresh_id() if fixed is None else f"{key}-{fixed}"
        if "unique_fixed_id" in SKIP and fixed is not None:
            rec = self.records.get(key)
            if rec and (rec[1] == tid or rec[1].startswith(tid + "~")):
                tid = self.fresh_id()
        self.publish(key, tid, priority, 0)

    def fresh_id(self) -> str:
        """A task id no publish used before, in the order of the run's publishes: the rules that
        pick an entry by sorted ids must pick the same one when hypothesis replays the run (a
        random id would make the rules open at a step a matter of chance)."""
        self.fresh += 1
        return f"{self.prefix}-{self.fresh:05d}"

    @precondition(lambda self: any(e.state == "leased" for e in self.entries.values()))
    @rule(i=st.integers(0, 100), priority=st.sampled_from(PRIORITIES))
    def retry(self, i, priority):
        """A running task retries itself (Celery's Task.retry: its id again, retries + 1)."""
        e = self.pick(i)
        self.publish(e.key, e.tid, priority, e.retries + 1)

    # -- the consumer's side ----------------------------------------------------------------------
    def leased(self) -> list[UEntry]:
        return sorted((e for e in self.entries.values() if e.state == "leased"), key=lambda e: e.seq)

    def pick(self, i: int) -> UEntry:
        mine = self.leased()
        return mine[i % len(mine)]

    @rule(count=st.sampled_from([1, 2, 5]))
    def pop(self, count):
        want = [self.entries[eid] for eid in self.order()[:count]]
        got = self.q.pop(count)
        assert [x.id for x in got] == [e.eid for e in want], (
            f"pop({count}) gave {[x.id for x in got]}, the model {[e.eid for e in want]}"
        )
        for x, e in zip(got, want):
            self.leave_level(e)
            e.state, e.token = "leased", x.token
            assert x.deliveries == e.d + 1

    @precondition(lambda self: self.leased())
    @rule(i=st.integers(0, 100))
    def ack(self, i):
        e = self.pick(i)
        assert self.q.ack((e.eid, e.token))
        self.end(e, "acked")

    @precondition(lambda self: self.leased())
    @rule(i=st.integers(0, 100))
    def requeue(self, i):
        e = self.pick(i)
        got = self.q.requeue((e.eid, e.token))
        self.come_back(e, got)

    def come_back(self, e: UEntry, got) -> None:
        e.d += 1
        limit = self.q.settings.max_deliveries
        expected = "dead" if limit and e.d >= limit else "waiting"
        assert got in (None, expected), f"{e.eid} came back {got!r}, the model: {expected}"
        if expected == "dead":
            self.to_dead(e)
        else:
            self.join_place(e)

    def to_dead(self, e: UEntry) -> None:
        self.end(e, "dead")
        mine = [x.id for x in self.q.dead.peek(10_000) if x.id not in self.dead]
        mine = [i for i in mine if i == e.eid or i.startswith(e.eid + "~")]
        assert len(mine) == 1, f"dead letters of {e.eid!r}: {mine}"
        self.dead[mine[0]] = e

    @precondition(lambda self: self.leased())
    @rule(i=st.integers(0, 100))
    def dead_letter(self, i):
        e = self.pick(i)
        assert self.q.dead_letter((e.eid, e.token), "rejected") == "dead"
        self.to_dead(e)

    @precondition(lambda self: self.leased())
    @rule(i=st.integers(0, 100))
    def lease_runs_out(self, i):
        """A consumer dies: its lease runs out and the sweep returns the entry (keeping its key)."""
        e = self.pick(i)
        assert self.q.extend([(e.eid, e.token)], 0.001) == [True]
        time.sleep(0.003)
        self.sweep()

    def sweep(self) -> None:
        now = redis_now_ms(self.client)
        expired = [e for e in self.leased() if self.client.zscore(self.q.keys.lease_deadlines, e.eid) <= now]
        delayed = [e for e in self.entries.values() if e.state == "delayed"]
        self.q.reclaim()
        after = redis_now_ms(self.client)
        for e in sorted(expired, key=lambda e: encode_id(e.eid)):
            self.come_back(e, None)
        dz = {x.decode() for x in self.client.zrange(self.q.keys.delayed, 0, -1)}
        due = [e for e in delayed if e.due <= now or (e.due <= after and e.eid not in dz)]
        for e in sorted(due, key=lambda e: (e.due, encode_id(e.eid))):
            self.join_back(e)
        for e in delayed:  # a debounce published "after" now: due its delay from now (the step undone)
            if e.state == "delayed" and e.published > after:
                e.due -= e.published - after
                e.published = after
            elif e.state == "delayed" and e.published > now:  # (the sweep read a time in between)
                e.due = int(self.client.zscore(self.q.keys.delayed, e.eid))
                e.published = e.due - PERIOD_MS
        for key, rec in list(self.records.items()):
            if rec[0] == "t" and rec[3] <= now:
                del self.records[key]  # its period is over: the sweep drops it
        self.swept_at = now

    @rule()
    def run_the_sweep(self):
        self.sweep()

    @rule(x=st.integers(0, 100))
    def remove(self, x):
        """celery_pq.remove by entry id or task id (technique T or S): the waiting or delayed
        entries of it go (a task id: its duplicates "<id>~<n>" too), and their keys."""
        live = sorted(e.eid for e in self.entries.values() if e.state != "leased")
        if not live:
            return
        x = self.entries[live[x % len(live)]].tid if x % 2 else live[x % len(live)]
        hit = [e for e in self.entries.values() if e.state != "leased" and (e.eid == x or e.tid == x)]
        if "unique_remove_s" in SKIP and self.q.mode["technique"] == "S" and any(e.holds for e in hit):
            return
        n = self.q.remove(x)
        assert n == len(hit), f"remove({x!r}) removed {n}, the model {[e.eid for e in hit]}"
        for e in hit:
            self.end(e, "removed")

    @precondition(lambda self: self.dead)
    @rule(i=st.integers(0, 100))
    def replay(self, i):
        """A dead letter back in the queue: it holds its key again, or is merged into the entry
        that holds the key by then."""
        dead_id = sorted(self.dead)[i % len(self.dead)]
        old = self.dead.pop(dead_id)
        rec = self.records.get(old.key)
        eid = self.q.replay([dead_id])["replayed"][dead_id]
        if old.holds and rec is not None and rec[0] == "e":
            assert eid == rec[1], f"replay of {dead_id!r} gave {eid!r}; {rec[1]!r} holds its key {old.key}"
            self.ledger.published(f"replay of {dead_id}", "merged", eid)
            return
        self.seq += 1
        e = UEntry(eid, old.tid, old.key, old.mode, old.rank, self.seq, "waiting", old.holds)
        self.entries[eid] = e
        self.ledger.reborn(eid)
        self.ledger.published(f"replay of {dead_id}", "stored", eid)
        self.join_back(e)
        if e.holds:
            got = self.record(old.key)
            assert got is not None and got[:2] == ("e", eid), f"replayed {eid!r} holds no key: {got}"
            self.records[old.key] = got
            e.retries = got[2]

    # -- time -------------------------------------------------------------------------------------
    @rule()
    def a_period_passes(self):
        """Time passes by a period and an hour: throttle periods end, debounced entries come due.
        The hour keeps every stored time far behind the clock, so that the steps back that may
        follow (seconds to minutes) never bring one within the seconds an example lasts: which
        entries are due never depends on how fast the machine runs (hypothesis replays a run's
        choices and must see the same rules open)."""
        step = PERIOD_MS + HOUR_MS
        clock.shift(self.client, self.q.keys, -step)
        for key, rec in list(self.records.items()):
            if rec[0] == "t":
                self.records[key] = (*rec[:3], rec[3] - step)
        for e in self.entries.values():
            if e.state == "delayed":
                e.due -= step
                e.published -= step
        self.sweep()

    @precondition(lambda self: "unique_clock" not in SKIP)
    @rule(back=st.sampled_from([5_000, 3 * PERIOD_MS]))
    def clock_steps_back(self, back):
        """The Redis clock steps back: every stored time is now ahead of it by the step."""
        clock.shift(self.client, self.q.keys, back, leases=True)
        for key, rec in list(self.records.items()):
            if rec[0] == "t":
                self.records[key] = (*rec[:3], rec[3] + back)
        for e in self.entries.values():
            if e.state == "delayed":
                e.due += back
                e.published += back

    # -- checks -----------------------------------------------------------------------------------
    @invariant()
    def entries_agree(self):
        if self.q is None:
            return
        k = self.q.keys
        ii = {x.decode() for x in self.client.hkeys(k.entries)}
        assert ii == set(self.entries), (
            f"entries: the queue has {sorted(ii - set(self.entries))} more, {sorted(set(self.entries) - ii)} fewer"
        )
        lt = {x.decode() for x in self.client.hkeys(k.leases)}
        assert lt == {e.eid for e in self.leased()}, "leased entries differ"
        dz = {x.decode() for x in self.client.zrange(k.delayed, 0, -1)}
        assert dz == {e.eid for e in self.entries.values() if e.state == "delayed"}, "delayed entries differ"
        assert [x.id for x in self.q.peek(10_000)] == self.order(), "peek order"
        assert self.q.dead.size() == len(self.dead)

    @invariant()
    def every_publish_is_accounted_for(self):
        lost = self.ledger.unaccounted(set(self.entries))
        assert not lost, f"publishes whose standing entry is neither live nor ended: {lost[:5]}"

    @invariant()
    def key_records_stand_with_their_entries(self):
        """Each key's record is the model's: an entry's while it holds the key, a throttle
        record until its period is over and a sweep has passed (no longer); each holder (ue) is
        a live entry holding its key; a dead letter keeps its key for a replay."""
        if self.q is None or "unique_prune" in SKIP:
            return
        k = self.q.keys
        uq = {f.decode() for f in self.client.hkeys(k.unique_keys)}
        swept_at, self.swept_at = getattr(self, "swept_at", None), None
        for key in set(self.records) | uq:
            got, rec = self.record(key), self.records.get(key)
            if rec is None:
                assert got[0] == "t", f"key {key}: record {got} of an entry that no longer holds it"
                assert swept_at is None or got[3] > swept_at, f"key {key}: {got} outlived its period and a sweep"
            else:
                assert got == rec, f"key {key}: record {got}, the model {rec}"
        holders = {f.decode(): v.decode() for f, v in self.client.hgetall(k.unique_holders).items()}
        want = {e.eid: e.key for e in self.entries.values() if e.holds}
        assert holders == want, f"key holders {holders}, the model {want}"
        dead = {f.decode(): v.decode() for f, v in self.client.hgetall(self.q.dead.keys.unique_holders).items()}
        assert dead == {i: e.key for i, e in self.dead.items() if e.holds}, f"dead letters' keys {dead}"

    # -- the end ----------------------------------------------------------------------------------
    def drain(self) -> None:
        for _ in range(20):
            a_period = [e for e in self.entries.values() if e.state == "delayed"]
            if a_period:
                self.a_period_passes()
            for e in self.leased():
                self.q.ack((e.eid, e.token))
                self.end(e, "acked")
            if not self.entries:
                break
            self.pop(100)
        assert not self.entries and not self.client.hlen(self.q.keys.entries), "entries stranded"
        lost = self.ledger.unaccounted(set())
        assert not lost, f"publishes unaccounted for after the drain: {lost[:5]}"
