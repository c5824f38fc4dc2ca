"""The broker redis-server dies: AOF with appendfsync always, SIGKILLed and restarted on the same
port and directory while publishing and consuming go on (benchmarks/faults.py::redis_kills)."""

import pytest

from benchmarks.faults import aof_loss_window, redis_kills

pytestmark = pytest.mark.e2e


def test_redis_sigkilled_three_times_loses_no_publish_that_returned(tmp_path):
    # Given two prefork workers and producers with Celery's publish retry, when the broker
    # (appendfsync always) is SIGKILLed and restarted 3 times while 150 tasks are published
    result = redis_kills("celery-pq", tmp_path, tasks=150, rate=40.0, kills=3, down=0.5, fsync="always", drain=40.0)
    # Then every publish that returned ran, and a publish that raised, if any, ran at most once more
    assert result["kills"] == 3
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] >= result["returned"] >= 150 - result["raised"]
    # duplicates only of tasks under way (or whose ack was not yet applied) when Redis died, at
    # most one per restart: the leases of running tasks and the acks not yet applied are kept
    # across the reconnect; what can still run twice is a message Celery's prefork pool had
    # written to a child that had not yet taken it (the pool drops such jobs at the reconnect,
    # the child runs them anyway: docs/reliability.md)
    assert result["unexplained_duplicates"] == [] and result["max_runs"] <= 2
    assert len(result["duplicated"]) <= result["kills"], result["duplicated"]
    # the workers carried on without a restart, and nothing stays leased or waiting
    assert result["workers_alive"] == 2 and result["workers_restarted"] == 0
    assert result["residue"] == {"waiting": 0, "leased": 0}


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_a_backlog_survives_a_redis_process_crash_with_either_fsync_policy(tmp_path, fsync):
    # Given producers filling a backlog (no worker yet) into a broker with AOF, when redis-server
    # is SIGKILLed mid-publish and restarted (a process crash: the kernel keeps what Redis wrote,
    # fsynced or not), then the workers started afterwards run every publish that returned
    result = aof_loss_window("celery-pq", tmp_path, fsync=fsync, rate=100.0, seconds=1.5, drain=30.0)
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] >= result["returned"] > 0
    assert result["max_runs"] == 1
