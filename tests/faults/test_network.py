"""Network faults between clients and Redis, through a TCP proxy the test controls
(celery_pq/testing/proxy.py FaultProxy; benchmarks/faults.py::worker_partition, ::connection_cuts)."""

import pytest

from benchmarks.faults import connection_cuts, half_open, network_latency, worker_partition

pytestmark = pytest.mark.e2e


def test_a_worker_partitioned_longer_than_its_lease_loses_nothing_and_recovers(tmp_path):
    # Given two workers (lease 2 s, 1 s tasks), one of them behind a proxy, when the proxy
    # partitions it for 6 s with a task under way in each of its processes, then heals
    result = worker_partition("celery-pq", tmp_path, tasks=12, lease=2.0, partition=6.0, task_seconds=1.0)
    # Then nothing is lost or unexpected; what it was running ran again on the other worker, once,
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] == result["returned"] == 24
    assert 1 <= len(result["duplicated"]) <= 2 and result["max_runs"] == 2
    assert result["unexplained_duplicates"] == []
    # its renewals and late acks were refused by their token, never applied to the new delivery,
    # and each lost lease was reported (a renewal refused, or an ack: with socket_timeout below
    # the lease, an ack sent into the partition times out and is sent again after it)
    assert result["lost_leases_reported"] == len(result["duplicated"])
    # and once the network is back it takes work again, without a restart
    assert result["partitioned_worker_ran_after_heal"] >= 1 and result["workers_alive"] == 2
    assert result["residue"] == {"waiting": 0, "leased": 0}


def test_connections_cut_mid_command_lose_and_repeat_nothing(tmp_path):
    # Given producers (Celery's publish retry) and two workers all reaching Redis through a proxy,
    # when it cuts every connection every 0.5-1.5 s while 120 tasks are published
    result = connection_cuts("celery-pq", tmp_path, tasks=120, rate=30.0)
    # Then every publish that returned ran, a publish retried after a cut was stored once,
    assert result["kills"] >= 2
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] >= result["returned"] >= 120 - result["raised"]
    # a task ran twice only if it was under way at a cut, the workers carried on, nothing stays behind
    assert result["unexplained_duplicates"] == [] and result["max_runs"] <= 2
    assert result["workers_alive"] == 2 and result["workers_restarted"] == 0
    assert result["residue"] == {"waiting": 0, "leased": 0}


def test_latency_on_every_command_loses_and_repeats_nothing(tmp_path):
    # Given producers and two workers whose every chunk, each way, waits 50-200 ms in a proxy
    # (a round trip of 100-400 ms for every publish, pop, renewal and ack; lease 2 s)
    result = network_latency("celery-pq", tmp_path, tasks=40, rate=20.0, lease=2.0, low=0.05, high=0.2)
    # Then every publish ran exactly once and nothing stays behind
    assert result["lost"] == [] and result["unexpected"] == [] and result["raised"] == 0
    assert result["done"] == result["returned"] == 40
    assert result["duplicated"] == []
    assert result["workers_alive"] == 2
    assert result["residue"] == {"waiting": 0, "leased": 0}


def test_half_open_connections_that_never_answer_are_left_and_lose_nothing(tmp_path):
    # Given two workers (lease 3 s, socket_timeout 1 s) with 1 s tasks under way, when every
    # connection open at that moment goes half-open for good (writes taken, no reply, no close)
    result = half_open("celery-pq", tmp_path, tasks=12, lease=3.0, task_seconds=1.0, socket_timeout=1.0)
    # Then the clients give up on them and reconnect: nothing is lost or run twice (the running
    # tasks keep their leases: the renewals go through on new connections within the lease),
    assert result["under_way_at_fault"] >= 1
    assert result["lost"] == [] and result["unexpected"] == []
    assert result["done"] == result["returned"] == 24
    assert result["duplicated"] == []
    # and both workers, never restarted, run the work published after it
    assert result["workers_alive"] == 2 and result["workers_restarted"] == 0
    assert all(n >= 1 for n in result["ran_after_fault"].values())
    assert result["residue"] == {"waiting": 0, "leased": 0}
