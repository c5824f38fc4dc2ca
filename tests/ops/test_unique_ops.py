"""Unique keys as operators see them: ``pq stats`` (text and --json), the Prometheus metrics
``celery_pq_unique_total{queue,outcome}`` and ``celery_pq_unique_keys{queue}``, published
through Celery (``send_task(headers=...)``) and told by ``celery_pq.publish_outcome``."""

from __future__ import annotations

import json

import pytest

from celery_pq import publish_outcome
from celery_pq.ops.metrics import PQCollector

try:
    from ops.conftest import World
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.ops.conftest import World


@pytest.fixture
def world(redis_server, key_prefix):
    w = World(redis_server, key_prefix, {"event_log": 1000})
    yield w
    w.close()


def test_stats_metrics_and_outcomes_of_unique_publishes(world):
    first = world.app.send_task("ops.work", args=(1,), queue="q", headers={"pq_unique": "u1"})
    again = world.app.send_task("ops.work", args=(2,), queue="q", headers={"pq_unique": "u1"})
    hold = {"pq_unique": "t1", "pq_unique_mode": "throttle", "pq_unique_seconds": 60}
    world.app.send_task("ops.work", args=(3,), queue="q", headers=hold)
    world.app.send_task("ops.work", args=(4,), queue="q", headers=hold)
    out = publish_outcome(again)
    assert (out.kind, out.task_id, out.requested, out.key) == ("merged", first.id, again.id, "u1")
    assert publish_outcome(first.id).kind == "stored"

    rows = json.loads(world.run("stats", "--json").output)
    [row] = [r for r in rows if r["queue"] == "q"]
    assert row["unique"] == {"keys": 2, "merged": 1, "replaced": 0, "debounced": 0, "throttled": 1}
    assert row["waiting"] == 2
    text = world.run("stats").output
    [line] = [ln for ln in text.splitlines()[text.splitlines().index("unique keys") :] if ln.split()[:1] == ["q"]]
    assert line.split() == ["q", "2", "1", "0", "0", "1"]

    fams = {f.name: f for f in PQCollector(world.url, transport_options=world.options).collect()}
    counts = {s.labels["outcome"]: s.value for s in fams["celery_pq_unique"].samples if s.labels["queue"] == "q"}
    assert counts == {"merged": 1, "replaced": 0, "debounced": 0, "throttled": 1}
    [keys] = [s.value for s in fams["celery_pq_unique_keys"].samples if s.labels["queue"] == "q"]
    assert keys == 2
    events = [(e["e"], e["id"], e["r"], e["task"]) for e in world.queue().events() if e["e"] in ("merged", "throttled")]
    assert [e[0] for e in events] == ["merged", "throttled"]
    assert events[0] == ("merged", first.id, "u1", "ops.work")
