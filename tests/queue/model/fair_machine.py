"""QueueMachine's variants: a fair queue (both scopes, weights, concurrency caps), and both
kinds with corrupt entries."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from celery_pq.queue import escape_tenant

from .common import SKIP, TENANTS, open_model_queue
from .fair import Fair
from .queue_machine import QueueMachine


class FairMachine(QueueMachine):
    """A fair queue: both scopes, weights, concurrency caps."""

    fair = True

    @initialize(
        scope=st.sampled_from(["within_priority", "tenant_first"]),
        order=st.sampled_from(["higher_first", "lower_first"]),
        conc=st.sampled_from([0, 0, 1, 2]),
        max_deliveries=st.sampled_from([0, 3]),
        cost=st.sampled_from(["tasks", "declared"]),
    )
    def make_queue(self, scope, order, conc, max_deliveries, cost="tasks"):
        # fair_cost "declared": the model's entries declare none, so each costs 1 (COST_UNIT), the
        # same order as by tasks on another scale; "time" is checked in tests/queue/test_fair_cost.py
        # (its charge depends on the Redis clock, which the model does not predict).
        self.mode_kwargs = dict(priority_order=order, fair_scope=scope, fair_cost=cost)
        self.q = open_model_queue(
            self.client,
            self.name,
            self.prefix,
            max_deliveries=max_deliveries,
            fair=True,
            tenant_concurrency=conc or None,
            **self.mode_kwargs,
        )
        self.fq = Fair(self, scope == "within_priority", conc, Fair.COST_UNIT if cost == "declared" else Fair.VT_UNIT)

    def expect_pop(self, count, view):
        from celery_pq.storage.constants import FAIR_POP_MAX

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
