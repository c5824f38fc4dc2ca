"""Celery's revoke reaching the broker, end to end: real Celery workers (tests/e2e/app.py) as
subprocesses, the revoke sent by ``celery control revoke`` and by ``app.control.revoke``."""

import os
import subprocess
import sys
import time

import pytest

from celery_pq.testing import wait_for

from .test_celery_e2e import ROOT, Harness, celery_inspect

pytestmark = pytest.mark.e2e


@pytest.fixture
def h(request, redis_server, key_prefix, tmp_path):
    acks_late = getattr(request, "param", False)
    harness = Harness(redis_server, key_prefix, tmp_path, {"sweep_interval": 0.2}, acks_late=acks_late)
    yield harness
    harness.close()


def ran(h) -> list:
    return [n for n, _ in h.records("order")]


def test_a_countdown_task_revoked_with_celery_control_is_gone_and_a_worker_started_later_never_runs_it(h):
    h.worker("elsewhere", "-Q", "other")  # alive (it answers the revoke), never consuming q
    later = h.send("e2e.record", 1, countdown=3600)
    soon = h.send("e2e.record", 2, countdown=1)  # due before any worker of q knows of the revoke
    marker = h.send("e2e.record", 3, countdown=2)
    assert h.queue().stats()["delayed"] == 3
    command = ["control", "revoke", later.id, soon.id, "--timeout", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", *command],
        cwd=ROOT,
        env=h.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"elsewhere@{os.uname().nodename}" in out.stdout  # the broadcast reached the workers too
    stats = h.queue().stats()  # (what ``celery pq stats`` shows)
    assert stats["delayed"] + stats["waiting"] == 1  # the marker (due by now, or not yet)
    h.worker("w1")
    h.send("e2e.record", 4)
    wait_for(lambda: 3 in ran(h) and 4 in ran(h), 20, "the tasks not revoked")
    assert sorted(ran(h)) == [3, 4], marker.id
    assert h.queue().stats()["delayed"] == 0 and h.queue().stats()["waiting"] == 0


def test_a_waiting_task_revoked_while_no_worker_runs_never_runs(h):
    revoked = h.send("e2e.record", 1)
    h.send("e2e.record", 2)
    h.app.control.revoke(revoked.id)
    assert h.queue().stats()["waiting"] == 1
    h.worker("w1")
    wait_for(lambda: 2 in ran(h), 20, "the task sent after the revoked one")
    time.sleep(0.5)
    assert ran(h) == [2]


@pytest.mark.parametrize("h", [True], indirect=True, ids=["acks_late"])  # (leased while it runs)
def test_a_running_task_revoked_runs_on_as_celery_has_it_and_the_worker_learns_the_id(h):
    h.worker("w1", "-P", "prefork")  # (a solo worker reads no broadcast while its task runs)
    running = h.send("e2e.sleep", 2, "run")
    wait_for(lambda: h.records("start"), 20, "the task's start")
    h.app.control.revoke(running.id)  # no terminate: Celery lets a running task finish
    assert h.queue().stats()["leased"] == 1  # the running task's message is the worker's
    out = celery_inspect(h.env, "w1", "revoked")
    assert out.returncode == 0 and running.id in out.stdout, out.stdout + out.stderr
    wait_for(lambda: h.records("done"), 20, "the revoked running task's end")
    wait_for(lambda: h.queue().stats()["leased"] == 0, 10, "its ack")
    assert [r[0] for r in h.records("start")] == ["run"]
