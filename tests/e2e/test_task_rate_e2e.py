"""task_rate through real Celery workers: a task limited to N per second across three worker
processes never goes faster than its bucket allows, and the other tasks of its queue are not
held behind it. The bound is checked on the broker's clock (the deliver events of the queue's
event log, stamped by the pop script with Redis time); no timing is asserted from below."""

from bisect import bisect_right

import pytest

from celery_pq.testing import wait_for
from celery_pq.transport.task_rates import task_tenant

from .test_celery_e2e import Harness

pytestmark = pytest.mark.e2e

RATE = 10  # deliveries per second of the limited task
LIMITED, FREE = 60, 150  # the limited backlog takes about 5 s to drain at RATE


@pytest.fixture
def harness(redis_server, key_prefix, tmp_path):
    made = []

    def make(options):
        h = Harness(redis_server, key_prefix, tmp_path, options, acks_late=False)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def most_in_window(times_ms: list[int], seconds: float) -> int:
    """The most of ``times_ms`` inside any closed window [t, t + seconds]."""
    times = sorted(times_ms)
    span = seconds * 1000
    return max((bisect_right(times, t + span) - i for i, t in enumerate(times)), default=0)


def test_a_task_rate_holds_across_three_workers_and_other_tasks_pass_it(harness):
    h = harness({"task_rate": {"e2e.rate_limited": RATE}, "event_log": 100_000})
    # Given a backlog of the limited task, published first, and other tasks behind it
    for i in range(LIMITED):
        h.send("e2e.rate_limited", i)
    for i in range(FREE):
        h.send("e2e.rate_free", i)
    # When three worker processes consume the queue
    for name in ("w1", "w2", "w3"):
        h.worker(name)
    wait_for(lambda: len(h.records("limited")) == LIMITED and len(h.records("free")) == FREE, 90, "every task ran")
    # Then each ran once
    assert sorted(n for n, _ in h.records("limited")) == list(range(LIMITED))
    assert sorted(n for n, _ in h.records("free")) == list(range(FREE))
    deliveries = [e for e in h.queue().events() if e["e"] == "deliver"]
    limited = [e["ms"] for e in deliveries if e["t"] == task_tenant("e2e.rate_limited")]
    free = [e["ms"] for e in deliveries if e["t"] == ""]
    assert (len(limited), len(free)) == (LIMITED, FREE)
    # And the limited task never went beyond its bucket: a full bucket (RATE tokens, the burst)
    # and RATE more per second, in any window, whichever worker took them
    for seconds in (0.25, 0.5, 1.0, 2.0, 4.0):
        assert most_in_window(limited, seconds) <= max(RATE, 1) + RATE * seconds, seconds
    # And the other tasks were not held behind the limited backlog: the last of them was
    # delivered while limited tasks still waited
    assert max(free) < max(limited)
    assert sum(ms <= max(free) for ms in limited) < LIMITED


def test_a_rolling_deploy_with_an_optionless_producer_keeps_the_limit_and_takes_the_new_one(harness):
    # Given an old worker limiting the task to 1/s, and a producer whose options name no task_rate
    old = harness({"task_rate": {"e2e.rate_limited": 1}, "event_log": 100_000})
    producer = harness({"event_log": 100_000})
    old.worker("old")
    for i in range(40):
        producer.send("e2e.rate_limited", i)
    # When only the old worker runs, the producer's messages are under the queue's limit
    wait_for(lambda: len(old.records("limited")) >= 2, 30, "the old worker took the limited task")
    first = [e["ms"] for e in old.queue().events() if e["e"] == "deliver"]
    assert most_in_window(first, 2.0) <= 1 + 1 * 2.0
    # And when a new worker with a limit of 200/s starts beside it (a rolling deploy)
    new = harness({"task_rate": {"e2e.rate_limited": 200}, "event_log": 100_000})
    new.worker("new")
    # Then the new limit is the queue's, for the old worker too, and every task runs once
    wait_for(lambda: len(old.records("limited")) == 40, 30, "the backlog drained at the new limit")
    assert sorted(n for n, _ in old.records("limited")) == list(range(40))
    tenants = old.redis.hgetall(old.queue().keys.tenant_settings)
    assert float(tenants[b"r:task:e2e.rate_limited"]) == 200
    # And the new worker said in its log what it changed, naming both values
    told = (new.tmp / "new.log").read_text()
    assert "rate['task:e2e.rate_limited'] is 1 in Redis, 200 in this process's options" in told
