"""benchmarks/rate_limits.py runs in its smoke mode and writes both columns (no timing asserted
beyond task_rate's own bound, which is a promise)."""

import json

import pytest

from benchmarks import rate_limits


@pytest.mark.slow
def test_rate_benchmark_runs_and_writes_both_columns(tmp_path):
    rate_limits.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "rate_limits.json").read_text())
    ours, celery = data["results"]["task_rate"], data["results"]["rate_limit"]
    assert ours["executions"]["count"] > 0 and celery["executions"]["count"] > 0
    assert ours["deliveries"]["max_in_1s_window"] <= ours["bound_1s"]
    assert len(data["load_before"]) == 3
    assert "Celery rate_limit" in (tmp_path / "rate_limits.md").read_text()
