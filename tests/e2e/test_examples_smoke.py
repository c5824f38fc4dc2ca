"""The examples in examples/ run as they are, each against a redis-server of its own (the Spark
pipeline's example has its own test: tests/spark/test_pipeline.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from celery_pq.testing import RedisServer, celery_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_unique_tasks_example_shows_one_run_per_merge_debounce_and_two_per_throttle():
    with RedisServer() as server:
        env = celery_env(ROOT, PQ_EXAMPLE_BROKER=f"pq://127.0.0.1:{server.port}/0")
        run = subprocess.run(
            [sys.executable, "-m", "examples.unique_tasks", "--with-worker"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=110,
        )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    lines = run.stdout.splitlines()
    kinds = [line.split()[1] for line in lines if line.startswith("  ") and "stands:" in line]
    assert kinds == (
        ["stored"] + ["merged"] * 4 + ["stored"] + ["debounced"] * 4 + (["stored"] + ["throttled"] * 4) * 2
    ), run.stdout
    assert "  -> 1 run: report r-17 rebuilt (asked by ann)" in lines, run.stdout
    assert any(line.startswith("  -> 1 run, ") and "'draft 5'" in line for line in lines), run.stdout
    assert "  -> 2 runs: ping 1, ping 6" in lines, run.stdout
