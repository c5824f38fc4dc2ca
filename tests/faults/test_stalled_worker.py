"""A stalled worker: SIGSTOP longer than its lease, then SIGCONT
(benchmarks/faults.py::stalled_worker, bounded here)."""

import pytest

from benchmarks.faults import stalled_worker

pytestmark = pytest.mark.e2e


def test_a_stalled_workers_tasks_run_elsewhere_and_its_late_acks_are_refused(tmp_path):
    # Given two prefork workers (2 processes each, acks_late, lease 2 s), when one is SIGSTOPped
    # with a task under way in each of its processes for 5 s, then SIGCONTinued
    result = stalled_worker("celery-pq", tmp_path, tasks=40, lease=2.0, stall=5.0, task_seconds=0.5)
    # Then its tasks ran again on the other worker (the duplicates are exactly those that were
    # under way on the stopped worker), nothing is lost and nothing runs a third time,
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] == result["returned"] == 40
    assert 1 <= len(result["duplicated"]) <= 2
    assert result["unexplained_duplicates"] == []
    assert result["max_runs"] == 2
    # its late acks are refused by their token and each is logged,
    assert result["late_acks_logged"] == len(result["duplicated"])
    # and nothing stays waiting or leased
    assert result["residue"] == {"waiting": 0, "leased": 0}
