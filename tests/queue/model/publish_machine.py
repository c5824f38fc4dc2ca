"""Publishes through kombu routed to several queues, each sent again as kombu's retry sends it
after a lost reply (docs/publishing.md), with message expiry (docs/expiry.md), beside a model
of the three queues.

kombu's ``Producer.publish(retry=True)`` retries a failed attempt through ``connection.ensure``:
the producer revived on a new channel, ``_publish`` called again with the same ``properties``
dict. A reply lost after the inserts ran makes such a retry of an attempt that stored
everything. The machine makes that resend itself (a new channel, ``_publish`` again with the
same dict): whichever queues the routing key reaches, each holds the message once. (A resend
on the same channel is not one kombu makes: that channel's queues have heard the replies and
may have had the queue forget the publish ids.)

The model: per queue, the waiting entries in FIFO order (one priority), the leased ones, the
dead letters. An entry published with a short expiry (1 ms) is past it at the next pop, which
dead-letters it (reason ``expired``) instead of delivering it; one with a long expiry (an hour)
or none is delivered. Checks after every step: each queue's entries are the model's, and every
publish is accounted for in each queue it was routed to (ledger.py); at the end, the event logs
account for every entry once.
"""

from __future__ import annotations

import json
import time
import uuid

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kombu import Connection, Exchange, Producer, Queue

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.ids import decode_id

from .common import EVENT_CAP, SKIP, Session, forget_keys
from .ledger import Ledger, events_account

NAMES = ["p0", "p1", "p2"]
#: Routing key -> the queues bound to it ("c": none).
ROUTES = {"a": ["p0", "p1"], "b": ["p2"], "ab": ["p0", "p1", "p2"], "c": []}
#: The expiry of a publish (ms): past at the next pop, or not within the example.
EXPIRIES = {"none": None, "short": 1, "long": 3_600_000}


class PublishMachine(RuleBasedStateMachine):
    examples = {"ci": 25}

    def __init__(self):
        super().__init__()
        self.client = Session.server.client(decode_responses=False)
        self.prefix = "pqp" + uuid.uuid4().hex[:12]
        self.waiting: dict[str, list[tuple[str, bool]]] = {n: [] for n in NAMES}  # (entry id, expires soon)
        self.leased: dict[str, dict[str, str]] = {n: {} for n in NAMES}  # entry id -> token
        self.dead: dict[str, list[tuple[str, str]]] = {n: [] for n in NAMES}  # (entry id, reason)
        self.ledger = {n: Ledger() for n in NAMES}
        self.seq: dict[str, dict[str, int]] = {n: {} for n in NAMES}  # entry id -> publish number
        self.n = 0
        self.conn: Connection | None = None

    @initialize(technique=st.sampled_from(["T", "S"]))
    def make(self, technique):
        self.technique = technique
        opts = dict(key_prefix=self.prefix, technique=technique, event_log=EVENT_CAP)
        self.conn = Connection(f"pq://127.0.0.1:{Session.server.port}/0", transport_options=opts)
        channel = self.conn.default_channel
        self.ex = Exchange("px", type="direct")
        for key, names in ROUTES.items():
            for name in names:
                Queue(name, self.ex, routing_key=key)(channel).declare()
        self.producer = Producer(channel)
        self.qs = {
            n: open_queue(
                self.client,
                n,
                QueueSettings(key_prefix=self.prefix, technique=technique, event_log=EVENT_CAP, max_deliveries=0),
                declare=False,  # the consumer (the transport) declares them
            )
            for n in NAMES
        }

    def teardown(self):
        try:
            if self.conn is not None:
                self.drain()
                for q in self.qs.values():
                    events_account(q.events())
        finally:
            if self.conn is not None:
                self.conn.close()
            forget_keys(self.client, self.prefix)

    def ids(self, name: str) -> set[str]:
        return {decode_id(x) for x in self.client.hkeys(self.qs[name].keys.entries)}

    # -- publishes --------------------------------------------------------------------------------
    @rule(key=st.sampled_from(list(ROUTES)), resends=st.sampled_from([0, 1, 2]), expiry=st.sampled_from(list(EXPIRIES)))
    def publish(self, key, resends, expiry):
        """One publish call, sent 1 + resends times as kombu's retry sends it after lost replies."""
        if "publish_routed" in SKIP and len(ROUTES[key]) > 1:
            resends = 0
        self.n += 1
        before = {n: self.ids(n) for n in NAMES}
        properties: dict = {}
        if EXPIRIES[expiry] is not None:
            properties["expiration"] = str(EXPIRIES[expiry])
        headers = {"n": self.n}
        for attempt in range(1 + resends):  # (the same properties dict each time: one publish call)
            if attempt:  # kombu's retry revives the producer on a new channel of the connection
                self.producer.revive(self.conn.channel())
            self.producer._publish(
                json.dumps({"n": self.n}),
                0,
                "application/json",
                "utf-8",
                headers,
                properties,
                key,
                False,
                False,
                "px",
                None,
            )
        for name in NAMES:
            new = self.ids(name) - before[name]
            if name not in ROUTES[key]:
                assert not new, f"publish {self.n} to {key!r} stored {sorted(new)} in {name}, not bound to it"
                continue
            assert len(new) == 1, f"publish {self.n} sent {1 + resends} times stored {len(new)} entries in {name}"
            [eid] = new
            self.waiting[name].append((eid, expiry == "short"))
            self.seq[name][eid] = self.n
            self.ledger[name].published(f"publish {self.n}", "stored", eid)
        if expiry == "short":
            time.sleep(0.003)  # (past its expiry at the next pop)

    def recorded(self) -> bool:
        return all(self.client.exists(q.keys.mode) for q in self.qs.values())

    @precondition(lambda self: "second_process" not in SKIP and self.recorded())
    @rule(key=st.sampled_from(list(ROUTES)), other=st.sampled_from(["fewer", "technique"]))
    def second_process_publishes(self, key, other):
        """Once the queues have their owner's mode (their first publishes recorded it), a
        producer with fewer options (or another technique) publishes: stored once in each queue,
        and the queues' recorded modes (technique, the event log on) are as they were."""
        opts = {"key_prefix": self.prefix}
        if other == "technique":
            opts["technique"] = "S" if self.technique == "T" else "T"
        modes = [self.client.get(q.keys.mode) for q in self.qs.values()]
        before = {n: self.ids(n) for n in NAMES}
        self.n += 1
        with Connection(f"pq://127.0.0.1:{Session.server.port}/0", transport_options=opts) as conn:
            Producer(conn.default_channel).publish({"n": self.n}, exchange=self.ex, routing_key=key)
        for name, mode in zip(NAMES, modes):
            new = self.ids(name) - before[name]
            assert len(new) == (name in ROUTES[key]), f"a second process's publish stored {sorted(new)} in {name}"
            for eid in new:
                self.waiting[name].append((eid, False))
                self.seq[name][eid] = self.n
                self.ledger[name].published(f"publish {self.n}", "stored", eid)
            now = self.client.get(self.qs[name].keys.mode)
            assert mode is None or now == mode, f"{name}: a second process's publish changed the mode {mode} to {now}"

    # -- the consumer's side ----------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES), count=st.sampled_from([1, 2, 5]))
    def pop(self, name, count):
        q = self.qs[name]
        got = q.pop(count)
        want, expired = [], []
        row = self.waiting[name]
        while row and len(want) < count:
            eid, soon = row.pop(0)
            (expired if soon else want).append(eid)
        assert [x.id for x in got] == want, f"pop({count}) of {name} gave {[x.id for x in got]}, the model {want}"
        for x in got:
            self.leased[name][x.id] = x.token
        for eid in expired:
            self.dead[name].append((eid, "expired"))
            self.ledger[name].ended(eid, "expired")

    @precondition(lambda self: any(self.leased.values()))
    @rule(i=st.integers(0, 100), how=st.sampled_from(["ack", "requeue", "dead_letter", "lease_runs_out"]))
    def end_lease(self, i, how):
        mine = sorted((n, eid) for n in NAMES for eid in self.leased[n])
        name, eid = mine[i % len(mine)]
        q, token = self.qs[name], self.leased[name].pop(eid)
        if how == "ack":
            assert q.ack((eid, token))
            self.ledger[name].ended(eid, "acked")
        elif how == "dead_letter":
            assert q.dead_letter((eid, token), "rejected") == "dead"
            self.dead[name].append((eid, "rejected"))
            self.ledger[name].ended(eid, "dead")
        else:
            if how == "requeue":
                assert q.requeue((eid, token), count_delivery=False) == "waiting"
            else:
                assert q.extend([(eid, token)], 0.001) == [True]
                time.sleep(0.003)
                assert q.reclaim()["returned"] == 1
            self.join_place(name, eid)

    def join_place(self, name: str, eid: str) -> None:
        """Waiting again at its place: before the first of the first 32 that came later."""
        row, seq = self.waiting[name], self.seq[name]
        for i, (other, _) in enumerate(row[:32]):
            if seq[other] > seq[eid]:
                row.insert(i, (eid, False))
                return
        row.insert(min(len(row), 32), (eid, False))

    @rule(name=st.sampled_from(NAMES), i=st.integers(0, 100))
    def remove(self, name, i):
        row = self.waiting[name]
        if not row:
            return
        eid, _ = row[i % len(row)]
        assert self.qs[name].remove(eid) == 1
        row.remove(next(x for x in row if x[0] == eid))
        self.ledger[name].ended(eid, "removed")

    # -- checks -----------------------------------------------------------------------------------
    @invariant()
    def queues_agree(self):
        if self.conn is None:
            return
        for name in NAMES:
            live = {eid for eid, _ in self.waiting[name]} | set(self.leased[name])
            ii = self.ids(name)
            assert ii == live, f"{name}: the queue has {sorted(ii - live)} more, {sorted(live - ii)} fewer"
            dead = sorted((x.id, x.dead_reason) for x in self.qs[name].dead.peek(10_000))
            assert dead == sorted(self.dead[name]), f"{name}: dead letters {dead}, the model {self.dead[name]}"
            lost = self.ledger[name].unaccounted(live)
            assert not lost, f"{name}: publishes unaccounted for: {lost[:5]}"

    # -- the end ----------------------------------------------------------------------------------
    def drain(self) -> None:
        for name in NAMES:
            for eid, token in list(self.leased[name].items()):
                assert self.qs[name].ack((eid, token))
                self.ledger[name].ended(eid, "acked")
            self.leased[name].clear()
            while self.waiting[name]:
                self.pop(name, 100)
                for eid, token in list(self.leased[name].items()):
                    assert self.qs[name].ack((eid, token))
                    self.ledger[name].ended(eid, "acked")
                self.leased[name].clear()
            assert not self.ids(name), f"{name}: entries stranded"
            assert not self.ledger[name].unaccounted(set())
