"""Real Celery workers on Valkey (tests of tests/e2e/test_celery_e2e.py, unchanged): 300 tasks in
exact priority order (both orders); leases: a task that outlives three leases runs once, the task
of a SIGKILLed worker runs again on another worker within the lease, a running task keeps its
lease through a lost connection; and a worker goes on, nothing acknowledged lost, after the
server restarts from its append-only file."""

import pytest

from tests.e2e.test_celery_e2e import (  # noqa: F401
    harness,
    test_300_tasks_run_in_exact_priority_order,
    test_a_running_acks_late_task_keeps_its_lease_when_the_connection_is_lost,
    test_sigkilled_worker_task_runs_again_on_another_worker,
    test_task_longer_than_three_leases_runs_once,
    test_worker_goes_on_after_redis_restarts_and_nothing_acknowledged_is_lost,
)

pytestmark = pytest.mark.e2e
