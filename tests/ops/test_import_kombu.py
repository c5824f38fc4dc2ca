"""``pq import-kombu``: messages published with kombu's Redis transport (``redis://``, a real
Celery app) move into celery-pq queues, each once, with kombu's priority order, the tenant of
the fair key and the ETA; a dry run changes nothing; an import killed mid-way and run again
loses nothing and stores nothing twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from celery_pq.queue import open_queue
from celery_pq.storage.codec import decode
from celery_pq.testing import wait_for
from celery_pq.transport.kombu_import import KombuLayout, priority_map
from celery_pq.transport.options import Options

from .conftest import World

SEP = "\x06\x16"


class Kombu:
    """A Celery app on kombu's Redis transport, its keys under its own global_keyprefix."""

    def __init__(self, server, prefix):
        self.keyprefix = f"{prefix}-kombu:"
        self.url = f"redis://127.0.0.1:{server.port}/0"
        self.app = Celery("kombu-side", broker=self.url)
        self.app.conf.broker_transport_options = {"global_keyprefix": self.keyprefix}
        self.client = server.client(decode_responses=False)
        self.layout = KombuLayout(global_keyprefix=self.keyprefix)

    def send(self, *args, queue="q", **kw) -> str:
        return self.app.send_task("ops.work", args=args, queue=queue, **kw).id

    def waiting(self, queue="q") -> int:
        return sum(self.client.llen(self.layout.list_key(queue, s)) for s in self.layout.priority_steps)

    def staged(self, queue="q") -> int:
        return self.client.llen(self.layout.staging_key(queue))

    def hold_unacked(self, queue="q", age: float = 0.0) -> str:
        """Take one message off ``queue``'s lists as a worker of kombu's transport does when it
        receives it (unacked hash and index, delivered ``age`` seconds ago); its tag."""
        for step in self.layout.priority_steps:
            raw = self.client.rpop(self.layout.list_key(queue, step))
            if raw:
                break
        message = json.loads(raw)
        tag = message["properties"]["delivery_tag"]
        info = message["properties"]["delivery_info"]
        self.client.hset(self.layout.unacked, tag, json.dumps([message, info["exchange"], info["routing_key"]]))
        self.client.zadd(self.layout.unacked_index, {tag: time.time() - age})
        return tag

    def close(self):
        self.app.close()
        self.client.close()


@pytest.fixture
def kombu(redis_server, key_prefix):
    k = Kombu(redis_server, key_prefix)
    yield k
    k.close()


def entries(world: World, name="q", **kw) -> list:
    q = world.queue(name, **kw)
    return q.peek(100_000)


def test_priority_maps_keep_kombu_order():
    assert priority_map("lower_first") == {k: k for k in range(10)}
    assert priority_map("higher_first")[0] == 9 and priority_map("higher_first")[9] == 0
    assert priority_map("higher_first", {0: 255})[0] == 255
    with pytest.raises(ValueError):
        priority_map("higher_first", {0: 256})


def test_dry_run_counts_and_changes_nothing(world, kombu):
    # Given: kombu holds 3 messages of priority 0, 2 of priority 5, 1 of 9 in queue q
    for p, n in ((0, 3), (5, 2), (9, 1)):
        for i in range(n):
            kombu.send(p, i, priority=p)
    before = kombu.waiting()
    # When: a dry run
    r = world.run(
        "import-kombu",
        "q",
        "--from",
        kombu.url,
        "--global-keyprefix",
        kombu.keyprefix,
        "--visibility-timeout",
        "3600",
        "--dry-run",
        "--json",
    )
    out = json.loads(r.output)
    # Then: counts per kombu priority, mapped (higher_first: 9 - p), and nothing moved
    rows = {(x["kombu_priority"], x["priority"]): x["messages"] for x in out["queues"][0]["rows"]}
    assert rows == {(0, 9): 3, (5, 4): 2, (9, 0): 1}
    assert out["dry_run"] is True and out["queues"][0]["moved"] == 6
    assert kombu.waiting() == before == 6
    assert entries(world) == []
    text = world.run(
        "import-kombu",
        "q",
        "--from",
        kombu.url,
        "--global-keyprefix",
        kombu.keyprefix,
        "--visibility-timeout",
        "3600",
        "--dry-run",
    )
    assert "dry run: nothing changed" in text.output


@pytest.mark.parametrize("order", ["higher_first", "lower_first"])
def test_import_moves_each_message_once_in_kombu_order(redis_server, key_prefix, kombu, order):
    world = World(redis_server, key_prefix, {"priority_order": order})
    try:
        # Given: messages of kombu priorities 9, 0, 5 (kombu serves 0 first), two each, in that order
        sent = {}
        for p in (9, 0, 5):
            for i in range(2):
                sent[kombu.send(p, i, priority=p)] = p
        # When: imported
        r = world.run(
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
            "--json",
        )
        assert json.loads(r.output)["queues"][0]["moved"] == 6
        # Then: kombu's lists are empty, nothing is left staged
        assert kombu.waiting() == 0 and kombu.staged() == 0
        # and celery-pq serves them in kombu's order, FIFO within one priority
        q = world.queue("q", priority_order=order)
        got = q.peek(100)
        assert [sent[e.id] for e in got] == [0, 0, 5, 5, 9, 9]
        assert [e.priority for e in got] == ([9, 9, 4, 4, 0, 0] if order == "higher_first" else [0, 0, 5, 5, 9, 9])
        # the stored message is the kombu message (body, headers), delivery tag dropped
        msg = decode(got[0].payload)
        assert msg["headers"]["task"] == "ops.work" and "delivery_tag" not in msg["properties"]
        # When: run again, nothing more is stored
        world.run(
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
        )
        assert len(q.peek(100)) == 6
    finally:
        world.close()


def test_tenant_from_fair_key_and_eta_delayed(fair_world, kombu):
    world = fair_world
    kombu.send(1, headers={"tenant": "acme"})
    kombu.send(2, headers={"tenant": "globex"})
    later = datetime.now(UTC) + timedelta(hours=1)
    eta_id = kombu.send(3, eta=later)
    world.run(
        "import-kombu", "q", "--from", kombu.url, "--global-keyprefix", kombu.keyprefix, "--visibility-timeout", "3600"
    )
    q = world.queue("q")  # (opened with the mode the import recorded: fair)
    waiting = q.peek(10)
    assert {e.tenant for e in waiting} == {"acme", "globex"}
    stats = q.stats()
    assert stats["delayed"] == 1
    assert eta_id not in {e.id for e in waiting}


def test_a_limited_task_goes_under_the_limit_the_workers_declared(world, kombu):
    # Given workers that limit ops.work on queue q (declared, stored with the queue) and an import
    # run with options that name no limit
    open_queue(
        world.client,
        "q",
        Options.from_transport_options({**world.options, "task_rate": {"ops.work": 0.01}}).queue_settings("q"),
    )
    kombu.send(1)
    kombu.app.send_task("ops.other", queue="q")
    # When the import moves the messages
    world.run("import-kombu", "q", "--from", kombu.url, "--global-keyprefix", kombu.keyprefix, "--unacked", "none")
    # Then the limited task's message is the limit's tenant's, the other the default tenant's
    assert sorted((e.tenant or "") for e in world.queue("q").peek(10)) == ["", "task:ops.work"]


def test_unacked_stale_moves_held_stays_include_moves_all(world, kombu):
    # Given: three messages, one delivered long ago (its worker is gone), one just now (held)
    a, b, c = kombu.send(1), kombu.send(2), kombu.send(3)
    old = kombu.hold_unacked(age=7200)
    fresh = kombu.hold_unacked(age=1)
    base = [
        "import-kombu",
        "q",
        "--from",
        kombu.url,
        "--global-keyprefix",
        kombu.keyprefix,
        "--visibility-timeout",
        "3600",
        "--json",
    ]
    # When: the default import (stale unacked only)
    out = json.loads(world.run(*base).output)["queues"][0]
    # Then: the waiting one and the stale one moved, the fresh one is left to its worker
    assert out["moved"] == 2 and out["unacked_held"] == 1
    assert kombu.client.hexists(kombu.layout.unacked, fresh)
    assert not kombu.client.hexists(kombu.layout.unacked, old)
    assert not kombu.client.zscore(kombu.layout.unacked_index, old)
    assert len(entries(world)) == 2
    # When: --include-unacked (the old workers are retired)
    out = json.loads(world.run(*base, "--include-unacked").output)["queues"][0]
    assert out["moved"] == 1 and out["unacked_held"] == 0
    assert kombu.client.hlen(kombu.layout.unacked) == 0
    assert sorted(e.id for e in entries(world)) == sorted([a, b, c])


def test_unacked_stale_needs_the_old_workers_visibility_timeout(world, kombu):
    # Given: a waiting message and one delivered 1000 s ago
    kombu.send(1)
    kombu.send(2)
    kombu.hold_unacked(age=1000)
    args = ["import-kombu", "q", "--from", kombu.url, "--global-keyprefix", kombu.keyprefix, "--json"]
    # When: --unacked stale (the default) without --visibility-timeout, a dry run or not
    for extra in ([], ["--unacked", "stale"], ["--dry-run"]):
        r = world.run(*args, *extra, ok=False)
        # Then: a usage error naming the option, and nothing moved (no 3600 s assumed)
        assert r.exit_code == 2 and "give it with --visibility-timeout SECONDS" in r.output, r.output
    assert kombu.waiting() == 1 and kombu.client.hlen(kombu.layout.unacked) == 1 and entries(world) == []
    # and the API refuses the same
    from celery_pq.transport.broker import Broker
    from celery_pq.transport.kombu_import import KombuImport

    with Broker.of(world.url, world.options).channel() as channel:
        with pytest.raises(ValueError, match="give it \\(visibility_timeout, seconds\\)"):
            KombuImport(kombu.client, channel, ["q"], layout=kombu.layout)
        with pytest.raises(ValueError, match="visibility_timeout must be a finite number > 0"):
            KombuImport(kombu.client, channel, ["q"], layout=kombu.layout, visibility_timeout=-1)
    # When: the real value is given (600 s): the message delivered 1000 s ago is stale, and moves
    out = json.loads(world.run(*args, "--visibility-timeout", "600").output)["queues"][0]
    assert out["moved"] == 2 and out["unacked_held"] == 0 and len(entries(world)) == 2
    # and --unacked none needs no timeout
    assert json.loads(world.run(*args, "--unacked", "none").output)["queues"][0]["moved"] == 0


def test_staged_and_stored_by_a_crashed_run_is_not_stored_twice(world, kombu):
    # Given: a run that crashed just now, after inserting a staged message and before releasing it
    tid, raw = _stage(kombu, 0)
    layout = kombu.layout
    from celery_pq.transport.broker import Broker
    from celery_pq.transport.kombu_import import KombuImport

    with Broker.of(world.url, world.options).channel() as channel:
        job = KombuImport(kombu.client, channel, ["q"], layout=layout, visibility_timeout=3600)
        item, _, _ = job.item("q", raw, {k: k for k in range(10)})
        channel.queue("q").insert_many([item])
    assert [e.id for e in entries(world)] == [tid]
    # and a worker of celery-pq took it and ran it since (it left the queue)
    assert world.queue("q").remove(tid) == 1
    # When: the import runs again
    out = json.loads(
        world.run(
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
            "--json",
        ).output
    )["queues"][0]
    # Then: it found it staged, its insert was a repeat (the publish id, within the window):
    # not stored again, and released
    assert out["staged"] == 1 and out["repeats"] == 1
    assert entries(world) == []
    assert kombu.staged() == 0


def test_import_killed_midway_and_rerun_loses_nothing_and_doubles_nothing(world, kombu):
    # Given: a backlog of 3,000 messages in kombu's lists, over all four priority steps
    sent = Counter()
    with kombu.app.producer_or_acquire() as producer:
        for i in range(3000):
            tid = kombu.app.send_task("ops.work", args=(i,), queue="q", priority=i % 10, producer=producer).id
            sent[tid] += 1
    assert kombu.waiting() == 3000
    cmd = [
        *world.command(
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
        ),
        "--batch",
        "5",
    ]
    q = world.queue("q")
    # When: the import is killed (SIGKILL) while it moves them
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: q.stats()["waiting"] >= 500, timeout=60, what="the import to move 500")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    moved = q.stats()["waiting"]
    assert 0 < moved < 3000, moved  # killed half-way
    # Then: a rerun finishes the job
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # every message is in celery-pq exactly once, nothing left in kombu's keys
    got = Counter(e.id for e in q.peek(10_000))
    assert got == sent
    assert kombu.waiting() == 0 and kombu.staged() == 0


def test_python_m_and_celery_entry_point(world, kombu, tmp_path):
    kombu.send(1)
    (tmp_path / "proj.py").write_text(
        "import celery_pq\nfrom celery import Celery\n"
        f"app = Celery('proj', broker={world.url!r})\n"
        f"app.conf.broker_transport_options = {world.options!r}\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "proj",
            "pq",
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}"},
    )
    assert r.returncode == 0, r.stderr
    assert "moved" in r.stdout
    assert len(entries(world)) == 1


def _stage(kombu, claimed_ms_ago: int | None) -> tuple[str, bytes]:
    """A message claimed by a run that was then killed, ``claimed_ms_ago`` (None: no record)."""
    tid = kombu.send(1)
    layout = kombu.layout
    raw = kombu.client.lmove(layout.list_key("q", 0), layout.staging_key("q"), "RIGHT", "LEFT")
    if claimed_ms_ago is None:
        kombu.client.delete(layout.claimed_at_key("q"))
    else:
        sec, usec = kombu.client.time()
        kombu.client.set(layout.claimed_at_key("q"), int(sec) * 1000 + int(usec) // 1000 - claimed_ms_ago)
    return tid, raw


def test_staged_beyond_the_dedupe_window_is_refused_then_inserted_or_dropped_as_told(world, kombu):
    # Given: a message staged by a run killed an hour ago (beyond the 300 s window), not in the queue
    tid, _ = _stage(kombu, 3_600_000)
    args = [
        "import-kombu",
        "q",
        "--from",
        kombu.url,
        "--global-keyprefix",
        kombu.keyprefix,
        "--visibility-timeout",
        "3600",
    ]
    # When: rerun, Then: it stops and names the task, nothing changed
    r = world.run(*args, ok=False)
    assert r.exit_code == 1 and tid in r.output and "--staged insert" in r.output
    assert kombu.staged() == 1 and entries(world) == []
    # When: told to insert, Then: stored once, released
    out = json.loads(world.run(*args, "--staged", "insert", "--json").output)["queues"][0]
    assert out["staged"] == 1 and [e.id for e in entries(world)] == [tid] and kombu.staged() == 0
    # Given: another one, and told to drop: released, not stored
    tid2, _ = _stage(kombu, None)
    out = json.loads(world.run(*args, "--staged", "drop", "--json").output)["queues"][0]
    assert out["dropped"] == 1 and kombu.staged() == 0
    assert tid2 not in {e.id for e in entries(world)}


def test_staged_beyond_the_window_and_found_in_the_queue_is_released(world, kombu):
    # Given: staged an hour ago, and inserted before the kill (its entry is in the queue)
    tid, raw = _stage(kombu, 3_600_000)
    world.queue("q").insert(b"stored before the kill", 0, id=tid)
    # When: rerun without --staged
    out = json.loads(
        world.run(
            "import-kombu",
            "q",
            "--from",
            kombu.url,
            "--global-keyprefix",
            kombu.keyprefix,
            "--visibility-timeout",
            "3600",
            "--json",
        ).output
    )["queues"][0]
    # Then: released, not stored again
    assert out["repeats"] == 1 and kombu.staged() == 0
    assert [e.id for e in entries(world)] == [tid]
