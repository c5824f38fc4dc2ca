"""fair_cost="time" through real Celery workers: tenants whose tasks take 200 ms and 20 ms share
the worker time of a prefork pool, not the task count (docs/fairness.md)."""

import os
import time

import pytest

from celery_pq.testing import wait_for
from tests.e2e.test_celery_e2e import harness  # noqa: F401  (the fixture)

pytestmark = pytest.mark.e2e

#: The cost the test runs under: "time" in the suite; PQ_FAIR_COST_E2E=tasks shows it fails there.
COST = os.environ.get("PQ_FAIR_COST_E2E", "time")


def test_worker_time_is_shared_by_time_not_by_task_count(harness):  # noqa: F811
    h = harness({"fair_key": "tenant", "fair_cost": COST}, acks_late=True)  # the lease lasts the task
    # Backlogs larger than the window serves of either: A 200 ms a task, B 20 ms.
    for _ in range(150):
        h.send("e2e.tenant_busy", "A", 0.2, headers={"tenant": "A"})
    for _ in range(900):
        h.send("e2e.tenant_busy", "B", 0.02, headers={"tenant": "B"})
    h.worker("pool", "-P", "prefork", "-c", "4", "--prefetch-multiplier", "1")
    wait_for(lambda: h.records("busy"), 30, "the first task")
    time.sleep(8)
    done = h.records("busy")
    begun = min(at for _, _, at in done)
    busy = {"A": 0.0, "B": 0.0}
    counts = {t: sum(1 for r in done if r[0] == t) for t in busy}
    for tenant, seconds, at in done:
        if at > begun + 1:  # the first second: the charges settle (the provisional ones are 1 s)
            busy[tenant] += seconds
    share = busy["A"] / (busy["A"] + busy["B"])
    print(f"fair_cost={COST}: A's share of the worker time {share:.1%}, tasks run {counts}")
    assert counts["A"] < 150 and counts["B"] < 900, counts  # both had a backlog throughout
    assert 0.40 <= share <= 0.60, (share, counts)
