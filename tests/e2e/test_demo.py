"""The demo README's first screen promises (`make demo`) runs and passes its own checks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_pq.testing import celery_env, find_redis_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_the_demo_passes_every_check_on_a_redis_server_of_its_own():
    env = celery_env(ROOT, PQ_REDIS_SERVER=find_redis_server())
    env.pop("PQ_DEMO_REDIS_URL", None)  # never the machine's Redis
    run = subprocess.run(
        [sys.executable, "-m", "celery_pq.demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=230
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    summary = re.search(r"Summary: (\d+) of (\d+) checks passed", run.stdout)
    assert summary and summary[1] == summary[2] and int(summary[2]) >= 14, out[-3000:]
    assert "FAIL" not in run.stdout, out[-3000:]
    assert "redis-server" in run.stdout.splitlines()[0]  # its own server, not a shared Redis
