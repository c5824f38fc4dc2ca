"""``pq dashboard`` on the command line: its flags' errors, an unreachable Redis, a taken port,
and a real ``python -m celery_pq ... dashboard`` process serving the page and the state."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from celery_pq.__main__ import main
from celery_pq.testing import celery_env, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_token_without_actions_is_a_usage_error(world):
    r = world.run("dashboard", "--token", "x" * 30, ok=False)
    assert r.exit_code == 2 and "only used with actions allowed" in r.output


def test_a_short_token_is_a_usage_error(world):
    r = world.run("dashboard", "--allow-actions", "--token", "short", ok=False)
    assert r.exit_code == 2 and "at least 16" in r.output


def test_an_unreachable_redis_is_one_line_without_its_password():
    r = CliRunner().invoke(main, ["--broker", "pq://:s3cr3t-pw@127.0.0.1:1/0", "dashboard", "--port", "0"])
    assert r.exit_code == 1
    assert "cannot reach Redis at 127.0.0.1:1" in r.output and "s3cr3t-pw" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_taken_port_is_one_line(world):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = world.run("dashboard", "--port", str(port), ok=False)
    assert r.exit_code == 1
    assert f"the dashboard cannot listen on 127.0.0.1:{port}" in r.output
    assert len(r.output.strip().splitlines()) == 1


def said(proc, log, pattern):
    """The match of ``pattern`` in the command's log so far (None yet); fails once it exited."""
    assert proc.poll() is None, log.read_text()
    return re.search(pattern, log.read_text())


def test_python_m_celery_pq_dashboard_serves_the_stats_of_pq_stats(world, tmp_path):
    world.send("ops.work", 1, priority=42)
    world.send("ops.work", 2, priority=7)
    log = tmp_path / "dashboard.log"
    env = celery_env(ROOT)
    proc = subprocess.Popen(
        [
            *world.command(),
            "dashboard",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        pattern = r"dashboard on (http://\S+/) \(read-only\)"
        m = wait_for(lambda: said(proc, log, pattern), 20, "the dashboard's address")
        with urllib.request.urlopen(m.group(1) + "api/state", timeout=5) as reply:
            state = json.loads(reply.read())
        assert state["actions"] == []
        [q] = state["queues"]
        [row] = json.loads(world.run("stats", "--json").output)
        assert q["stats"]["per_priority"] == row["per_priority"] == {"42": 1, "7": 1}
        assert (q["stats"]["waiting"], q["stats"]["paused"]) == (row["waiting"], row["paused"]) == (2, False)
    finally:
        proc.terminate()
        proc.wait(10)


def test_beyond_loopback_the_command_prints_a_token_the_state_needs(world, tmp_path):
    # Given `pq dashboard --host 0.0.0.0`, read-only, no token given
    log = tmp_path / "dashboard.log"
    env = celery_env(ROOT)
    proc = subprocess.Popen(
        [
            *world.command(),
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        pattern = r"dashboard on http://0\.0\.0\.0:(\d+)/ \(read-only\); token: (\S+) \(the page's state needs it"
        m = wait_for(lambda: said(proc, log, pattern), 20, "the dashboard's address and token")
        url, token = f"http://127.0.0.1:{m.group(1)}/api/state", m.group(2)
        # Then the state answers 401 without the printed token, and 200 with it
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("the state was served without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        with urllib.request.urlopen(urllib.request.Request(url, headers={"X-PQ-Token": token}), timeout=5) as reply:
            assert json.loads(reply.read())["actions"] == []
    finally:
        proc.terminate()
        proc.wait(10)
