"""The benchmark suite runs in a tiny smoke mode and writes its files (no timing asserted beyond
task_rate's own bound, which is a promise)."""

import json

import pytest

from benchmarks import run


@pytest.mark.slow
def test_benchmarks_run_and_write_results(tmp_path):
    run.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "latency.json").read_text())
    assert set(data["results"]) == {
        "celery-pq",
        "kombu-redis",
        "celery-pq (Celery worker)",
        "kombu-redis (Celery worker)",
    }
    assert all(row["received"] == 5 for row in data["results"].values())
    assert "celery-pq" in (tmp_path / "latency.md").read_text()
    on_time = json.loads((tmp_path / "on_time.json").read_text())
    assert set(on_time["lateness"]) == {"celery-pq", "kombu-redis"}
    assert all(row["started"] == 5 and row["p99_ms"] >= row["p50_ms"] for row in on_time["lateness"].values())
    assert set(on_time["volume"]) == {"plain", "fair", "sharded"}
    for row in on_time["volume"].values():  # every entry came due, and was delivered, without waiting minutes
        assert 0 <= row["all_deliverable_s"] <= row["all_delivered_s"] < 60 and row["slowest_script_ms"] >= 0
    tput = json.loads((tmp_path / "throughput.json").read_text())
    assert set(tput["results"]) == {"publish", "consume_prefetch_1", "consume_prefetch_10"}
    assert all(row["ratio"] > 0 for row in tput["results"].values())
    batches = json.loads((tmp_path / "publish_batch.json").read_text())["results"]
    assert set(batches) == {"direct", "exchange"}
    assert all(r["vs_kombu_batch"] > 0 and r["vs_one_by_one"] > 0 for r in batches.values())
    events = json.loads((tmp_path / "events_cost.json").read_text())
    assert set(events["results"]) == {"publish", "consume_prefetch_1", "consume_prefetch_10"}
    assert all(row["ratio"] > 0 for row in events["results"].values())
    assert events["stream"]["entries"] > 0  # the "on" runs logged
    fair = json.loads((tmp_path / "fairness.json").read_text())
    assert {"dwell_ratio", "tenant_cost_ratio"} <= set(fair["summary"])
    cases = {(c["fair_cost"], c["weights"]) for c in fair["by_cost"]}
    assert cases == {(cost, w) for cost in ("tasks", "time", "declared") for w in ("1:1", "3:1")}
    assert all(c["share_a"] is not None and 0 <= c["share_a"] <= 1 for c in fair["by_cost"])  # both tenants ran
    assert {"share_a_time_1to1", "share_a_declared_3to1"} <= set(fair["summary"])
    e2e = json.loads((tmp_path / "celery_e2e.json").read_text())
    assert set(e2e["results"]) == {"solo", "prefork-2", "solo, late acks", "solo, Celery defaults"}
    for row, r in e2e["results"].items():
        assert {"celery-pq", "kombu-redis"} <= set(r["tasks_per_second"]) and r["ratio"] > 0
        if row == "prefork-2":  # (memory:// is polled: no ceiling for a pool of processes)
            assert "memory" not in r["tasks_per_second"] and r["of_ceiling"] == {}
        else:  # the ceiling, kombu's in-process memory://, measured beside the two
            assert r["tasks_per_second"]["memory"] > 0
            assert set(r["of_ceiling"]) == {"celery-pq", "kombu-redis"} and min(r["of_ceiling"].values()) > 0
    assert e2e["results"]["solo, late acks"]["settings"] == {
        "pool": "solo",
        "concurrency": 1,
        "prefetch_multiplier": 1,
        "acks_late": True,
    }
    assert "of ceiling" in (tmp_path / "celery_e2e.md").read_text()
    api = json.loads((tmp_path / "queue_api.json").read_text())
    assert set(api["memory_bytes_beyond_payload"]) == {"celery-pq T", "celery-pq S", "kombu-redis"}
    assert json.loads((tmp_path / "bulk.json").read_text())["ours_per_second"] > 0
    peers = json.loads((tmp_path / "peers.json").read_text())
    assert peers["per_second"]["pq pop+ack x8"] > 0
    spark = json.loads((tmp_path / "spark_bulk.json").read_text())
    assert spark["stored"] == spark["rows"] == 2_000 and spark["ratio"] > 0
    faults = json.loads((tmp_path / "faults.json").read_text())["results"]
    assert set(faults) == {"redis_kills", "aof_kill_rounds"}
    assert all(r["returned"] > 0 and r["lost"] >= 0 for r in faults["aof_kill_rounds"].values())
    assert faults["redis_kills"]["celery-pq"]["returned"] > 0 and faults["redis_kills"]["kombu-redis"]["returned"] > 0
    relaxed = json.loads((tmp_path / "relaxed.json").read_text())
    plain = [c for c in relaxed["cases"] if c["shards"] == 1 and c["consumers"] == 1]
    assert plain and all(c["max"] == 0 for c in plain)  # one shard, one consumer: exact order
    assert {(c["shards"], c["peek"]) for c in relaxed["cases"]} >= {(4, 2), (16, 4)}
    slow = json.loads((tmp_path / "slowlog.json").read_text())
    assert {"fair_paused_head", "publish_window_expiry", "migrate_mode"} <= set(slow["results"])
    assert all(r["by_script"] for r in slow["results"].values())  # every case's calls were read
    rates = json.loads((tmp_path / "rate_limits.json").read_text())
    ours, celery = rates["results"]["task_rate"], rates["results"]["rate_limit"]
    assert ours["executions"]["count"] > 0 and celery["executions"]["count"] > 0
    assert ours["deliveries"]["max_in_1s_window"] <= ours["bound_1s"]  # task_rate's bound is a promise
    assert len(rates["load_before"]) == 3
    assert "Celery rate_limit" in (tmp_path / "rate_limits.md").read_text()


@pytest.mark.slow
def test_profile_runs_and_writes_its_files(tmp_path):
    from benchmarks import profile

    data = profile.main(["--smoke", "--out", str(tmp_path)])
    assert set(data["profiles"]) == {f"{t} {p}" for t in ("celery-pq", "kombu-redis") for p in ("publish", "consume")}
    assert "PriorityQueue.insert" in (tmp_path / "profile-celery-pq-publish.txt").read_text()
    assert "celery-pq consume" in (tmp_path / "profile.md").read_text()
