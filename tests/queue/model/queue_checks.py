"""The checks of QueueMachine after every step (each entry in one state, the counts, the
tenants, the hash tag, stale pointers, wake tokens) and the drain at the end of an example."""

from __future__ import annotations

import time

from hypothesis.stateful import invariant, precondition

from celery_pq.storage.ids import decode_id, encode_id
from celery_pq.storage.records import split_tenant_member
from tests.support.tenants import tenant_counts

from .common import SKIP, STALE_SLACK


class QueueChecks:
    """Invariants of one queue against the model (a mixin of QueueMachine)."""

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
        assert tenant_counts(self.q) == want

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
