"""A stored record made to cost a reader hours (a varint of 16 million 0xFF bytes in 542 bytes
of zstd), published raw into a queue: a real Celery worker sets it aside as a ``malformed``
dead letter and runs the next task; ``pq peek``, ``pq dead`` and the dashboard show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_pq.ops.dashboard import Board
from celery_pq.testing import celery_env, start_worker, wait_for
from celery_pq.transport.broker import Broker, queue_and_view

try:
    from support.bombs import varint_bomb
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.bombs import varint_bomb

ROOT = Path(__file__).resolve().parents[2]
WHY = "varint at byte 1 runs over 5 bytes"


@pytest.mark.e2e
def test_a_worker_dead_letters_a_varint_bomb_as_malformed_and_runs_the_next_task(world, tmp_path):
    # Given a worker of the queue, running
    env = celery_env(
        ROOT,
        PQ_TEST_BROKER=world.url,
        PQ_TEST_OPTIONS=json.dumps(world.options),
        PQ_TEST_RECORD=f"redis://127.0.0.1:{world.server.port}/0",
        PQ_TEST_PREFIX=world.prefix,
    )
    worker = start_worker("tests.e2e.app", cwd=ROOT, env=env, name="w1", log=tmp_path / "w1.log")
    stamps = f"{world.prefix}:rec:stamp"
    try:
        worker.wait_ready(60)
        # When the bomb is published raw, ahead of a good task (the queue paused meanwhile, so
        # that the worker finds both)
        q = world.queue()
        q.pause()
        q.insert(varint_bomb(), 255, id="bomb")
        world.send("e2e.stamp", "after", priority=1)
        q.resume()
        # Then the good task runs (with the bomb unread, the worker would spend hours on it while
        # its lease keeper renewed the bomb's lease), and the bomb is a malformed dead letter
        wait_for(lambda: world.client.llen(stamps) == 1, 30, lambda: "the task behind the bomb:\n" + worker.log_text())
        [dead] = q.dead.peek(5)
        assert (dead.id, dead.dead_reason) == ("bomb", "malformed") and dead.payload == varint_bomb()
        assert q.size() == 0 and q.stats()["leased"] == 0
        assert worker.poll() is None
        assert WHY in worker.log_text()
    finally:
        worker.stop(timeout=15)


def test_peek_dead_and_the_dashboard_show_a_varint_bomb(world):
    # Given the bomb waiting ahead of a good task
    q = world.queue()
    q.insert(varint_bomb(), 200, id="bomb")
    good = world.send("ops.work", 1)
    # Then pq peek names why it is unreadable, and the good one as usual
    rows = json.loads(world.run("peek", "q", "--json").output)
    assert [(r["id"], r["task"]) for r in rows] == [("bomb", None), (good, "ops.work")]
    assert rows[0]["args"] == f"unreadable: {WHY}"
    assert "unreadable: varint at byte 1" in world.run("peek", "q").output
    # and so do pq dead and the dashboard's state once it is a dead letter
    [lease] = q.pop(1, consumer="host:1:abcd")
    assert lease.id == "bomb" and q.dead_letter(lease, "malformed") == "dead"
    [row] = json.loads(world.run("dead", "q", "--json").output)
    assert (row["id"], row["reason"], row["task"], row["args"]) == ("bomb", "malformed", None, f"unreadable: {WHY}")
    with Broker.of(world.url, transport_options=world.options).channel() as channel:
        state = Board(lambda: ["q"], lambda name: queue_and_view(channel, name)[0]).state()
    [queue] = state["queues"]
    assert [(d["id"], d["reason"]) for d in queue["dead_letters"]] == [("bomb", "malformed")]
