"""benchmarks/memory_tasks.py runs in its smoke mode and writes its figures (none asserted)."""

import json

import pytest

from benchmarks import memory_tasks


@pytest.mark.slow
def test_memory_benchmark_runs_and_writes_both_columns(tmp_path):
    memory_tasks.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "memory_tasks.json").read_text())
    assert set(data["results"]) == {"small", "medium", "large"}
    assert all({"ratio", "celery-pq", "kombu-redis"} <= set(row) for row in data["results"].values())
    assert "celery-pq, no compression" in data["results"]["large"]
    assert any(":ii" in key for key in data["small_keys"]["celery-pq"])
    assert "kombu-redis bytes/task" in (tmp_path / "memory_tasks.md").read_text()
