"""BacklogAutoscaler: its decisions on a real redis-server (a stand-in pool that only counts),
then a real prefork worker growing to 4 under a flood and back to 1 after the drain."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kombu import Queue

from celery_pq.autoscale import AutoscaleSettings, BacklogAutoscaler
from celery_pq.testing import celery_env, start_worker

ROOT = Path(__file__).resolve().parents[2]


class CountingPool:
    """Only what the autoscaler touches of a pool: its size, grow and shrink."""

    def __init__(self, n=1):
        self.num_processes = n

    def grow(self, n):
        self.num_processes += n

    def shrink(self, n):
        self.num_processes -= n

    def maintain_pool(self):
        pass


def scaler(world, consumed, max_=4, min_=1, **conf):
    world.app.conf.update({f"pq_autoscale_{k}": v for k, v in {"interval": 0.05, "idle_seconds": 0.3, **conf}.items()})
    worker = SimpleNamespace(
        app=world.app, consumer=SimpleNamespace(task_consumer=SimpleNamespace(queues=[Queue(n) for n in consumed]))
    )
    return BacklogAutoscaler(CountingPool(min_), max_, min_, worker=worker)


def step(s):
    time.sleep(s.settings.interval)
    s.maybe_scale()
    return s.processes


def test_grows_for_the_backlog_of_its_view_only_and_due_entries_only(world):
    for _ in range(10):
        world.send("ops.work", priority=10)  # not in the view
    for _ in range(2):
        world.send("ops.work", priority=250)
    world.send("ops.work", priority=250, countdown=600)  # not due
    s = scaler(world, ["q[>=200]"])
    assert step(s) == 2
    assert s.info()["backlog"] == 2
    whole = scaler(world, ["q"])
    assert step(whole) == 4  # capped at MAX


def test_leaves_out_tenants_held_back(fair_world):
    w = fair_world  # "slow" may hold one lease at a time
    for _ in range(3):
        w.send("ops.work", headers={"tenant": "slow"})
    q = w.queue()
    q.pop(2, consumer="c:1:x")  # one delivered; the second pop parks "slow" at its cap
    s = scaler(w, ["q"])
    assert step(s) == 1 and s.info()["backlog"] == 0
    w.run("pause", "q")
    w.send("ops.work", headers={"tenant": "fast"})
    assert step(s) == 1
    w.run("resume", "q")
    assert step(s) == 1 and s.info()["backlog"] == 1


def test_old_entries_add_a_process(world):
    # (max_age well above what sending and the first step take on a loaded machine: with 0.2 s
    # the entry was once already too old at the first step)
    world.send("ops.work")
    s = scaler(world, ["q"], backlog_per_process=100, max_age=1.0)
    assert step(s) == 1
    time.sleep(1.1)
    assert step(s) == 2
    assert s.info()["oldest_age_seconds"] > 1.0


def test_shrinks_only_after_idle_seconds(world):
    for _ in range(3):
        world.send("ops.work")
    s = scaler(world, ["q"], idle_seconds=0.5)
    assert step(s) == 3
    world.run("purge", "q", "--yes")
    assert step(s) == 3  # lower demand starts the idle clock
    t0 = time.monotonic()
    while s.processes == 3 and time.monotonic() - t0 < 5:
        step(s)
    assert s.processes == 1 and time.monotonic() - t0 >= 0.4


def test_unreachable_redis_falls_back_to_reserved(caplog):
    from celery import Celery

    app = Celery("x", broker="pq://:pw-hidden-42@127.0.0.1:1/0")
    app.conf.pq_autoscale_interval = 0.05
    worker = SimpleNamespace(app=app, consumer=SimpleNamespace(task_consumer=SimpleNamespace(queues=[Queue("q")])))
    s = BacklogAutoscaler(CountingPool(2), 4, 1, worker=worker)
    with caplog.at_level(logging.WARNING, logger="celery_pq.autoscale"):
        assert s.wanted() == 0
    assert "127.0.0.1:1" in caplog.text and "pw-hidden-42" not in caplog.text


@pytest.mark.parametrize(
    "name, value", [("interval", 0), ("backlog_per_process", 0), ("max_age", -1), ("idle_seconds", "soon")]
)
def test_bad_settings_are_named(name, value):
    with pytest.raises(ValueError, match=f"pq_autoscale_{name}"):
        AutoscaleSettings.from_conf({f"pq_autoscale_{name}": value})


@pytest.mark.e2e
def test_a_prefork_worker_grows_to_max_under_a_flood_and_shrinks_after(world, tmp_path):
    # Given a worker with --autoscale=4,1 and the prefork pool
    env = celery_env(
        ROOT,
        PQ_TEST_BROKER=world.url,
        PQ_TEST_OPTIONS=json.dumps(world.options),
        PQ_TEST_RECORD=f"redis://127.0.0.1:{world.server.port}/0",
        PQ_TEST_PREFIX=world.prefix,
    )
    proc = start_worker(
        "tests.ops.autoscale_app",
        cwd=ROOT,
        env=env,
        name="scaler",
        pool="prefork",
        concurrency=None,
        prefetch_multiplier=None,
        heartbeat=False,
        args=["--autoscale=4,1"],
        log=tmp_path / "worker.log",
    )
    try:
        deadline = time.monotonic() + 55
        logged = proc.log_text

        def pool_size():
            """Processes after the autoscaler's last move (1 at start)."""
            size = 1
            for line in logged().splitlines():
                if "Scaling up" in line:
                    size += int(line.split("Scaling up")[1].split()[0])
                elif "Scaling down" in line:
                    size -= int(line.split("Scaling down")[1].split()[0])
            return size

        proc.wait_ready(55)
        # When its queue is flooded with slow-ish tasks
        for i in range(16):
            world.send("e2e.sleep", 0.8, f"t{i}")
        # Then the pool grows to 4
        while pool_size() < 4:
            assert time.monotonic() < deadline, logged()[-3000:]
            time.sleep(0.2)
        assert pool_size() == 4
        # (celery inspect stats shows the autoscaler's view)
        # (a loaded machine may let a 3 s inspect pass without the reply: asked again until the deadline)
        replies = {}
        while not replies and time.monotonic() < deadline:
            replies = world.app.control.inspect(timeout=3, destination=[f"scaler@{socket.gethostname()}"]).stats() or {}
        [info] = [r["autoscaler"] for r in replies.values()]
        assert info["max"] == 4 and info["min"] == 1 and "backlog" in info and "oldest_age_seconds" in info
        # and the four processes run tasks at once
        starts = {}
        while len(starts) < 16:
            assert time.monotonic() < deadline, logged()[-3000:]
            for raw in world.client.lrange(f"{world.prefix}:rec:start", 0, -1):
                tag, pid, _ = json.loads(raw)
                starts[tag] = pid
            time.sleep(0.2)
        assert len(set(starts.values())) == 4
        # And after the drain it shrinks back to 1 (idle_seconds=2)
        while len(world.client.lrange(f"{world.prefix}:rec:done", 0, -1)) < 16:
            assert time.monotonic() < deadline, logged()[-3000:]
            time.sleep(0.2)
        while pool_size() > 1:
            assert time.monotonic() < deadline, logged()[-3000:]
            time.sleep(0.2)
        assert pool_size() == 1
    finally:
        proc.stop(timeout=15)
