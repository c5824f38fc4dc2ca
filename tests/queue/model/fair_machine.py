"""QueueMachine's variants: a fair queue (both scopes, weights, concurrency caps, each
fair_cost), and both kinds with corrupt entries."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from celery_pq.queue import escape_tenant

from .common import HELD, SKIP, TENANTS, open_model_queue
from .fair import Fair
from .queue_machine import QueueMachine


class FairMachine(QueueMachine):
    """A fair queue: both scopes, weights, concurrency caps, by tasks, declared cost or time held."""

    fair = True

    @initialize(
        scope=st.sampled_from(["within_priority", "tenant_first"]),
        order=st.sampled_from(["higher_first", "lower_first"]),
        conc=st.sampled_from([0, 0, 1, 2]),
        max_deliveries=st.sampled_from([0, 3]),
        cost=st.sampled_from(["tasks", "declared", "time"]),
        weight=st.sampled_from([1, 1, 3]),
    )
    def make_queue(self, scope, order, conc, max_deliveries, cost="tasks", weight=1):
        # fair_cost "declared": the model's entries declare none, so each costs 1 (COST_UNIT), the
        # same order as by tasks on another scale. "time": each lease is made to have been held
        # the ms a rule chose, and the model is told the ms Redis charged (QueueMachine.ending).
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
        self.fq = Fair(self, scope == "within_priority", conc, cost)
        if weight != 1:  # every tenant's, from the start: each charge rounded (configure_tenant changes one)
            self.q.configure_tenants(weights=dict.fromkeys(TENANTS, weight))
            self.fq.weights.update((escape_tenant(t), weight) for t in TENANTS)

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

    @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 40), held=st.sampled_from(HELD))
    def churn(self, tenant, n, held=0):
        """Many rounds of insert, pop, ack (a busy tenant beside a capped one)."""
        for _ in range(n):
            self.insert(None, 5, tenant, "now")
            self.pop_and_ack(1, "churn", held)

    @invariant()
    def virtual_times_are_the_models(self):
        """fv as the model has it: each level's V and M, every finish tag, and by fair_cost "time"
        the running averages (exact: the charges at pop and at a lease's end, rounding, weights
        and the day's cap all show here before they change an order)."""
        if self.q is None:
            return
        fv = {k.decode(): int(v) for k, v in self.client.hgetall(self.q.keys.virtual_times).items()}
        got = {f: v for f, v in fv.items() if f[:2] in ("F:", "A:") or f == "A" or (f[:2] in ("V:", "M:") and v)}
        fq = self.fq
        assert fq is not None
        want = {f"V:{level}": v for level, v in fq.V.items() if v}
        want.update({f"M:{level}": v for level, v in fq.M.items() if v})
        want.update({f"F:{level}:{t}": v for (level, t), v in fq.F.items()})
        want.update({f"A:{t}": v for t, v in fq.avg.items()})
        if fq.avg_all is not None:
            want["A"] = fq.avg_all
        assert got == want, f"fv differs from the model: {sorted(set(got.items()) ^ set(want.items()))}"

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
