"""Every ``pq`` command through ``python -m celery_pq`` (click's CliRunner) on a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_pq.testing import celery_env
from tests.support.tenants import held_tenants

ROOT = Path(__file__).resolve().parents[2]


def dead_letter(world, n=1, reason="rejected", consumer="host:1:abcd"):
    """Deliver the next n entries of q and dead-letter them; their ids."""
    q = world.queue()
    out = []
    for lease in q.pop(n, consumer=consumer):
        assert q.dead_letter(lease, reason) == "dead"
        out.append(lease.id)
    return out


def test_stats_text_and_json(world):
    world.send("ops.work", 1, priority=9)
    world.send("ops.work", 2, priority=200, countdown=60)
    rows = json.loads(world.run("stats", "--json").output)
    [row] = [r for r in rows if r["queue"] == "q"]
    assert (row["waiting"], row["delayed"], row["leased"], row["dead"]) == (1, 1, 0, 0)
    text = world.run("stats").output
    assert text.splitlines()[2].split()[:5] == ["q", "1", "1", "0", "0"]


def test_stats_watch_refreshes(world):
    world.send("ops.work", 1)
    env = celery_env(ROOT)
    proc = subprocess.Popen(
        [
            *world.command(),
            "stats",
            "--watch",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        blocks, deadline = 0, time.monotonic() + 20
        while blocks < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("-- ") and line.rstrip().endswith("UTC"):
                blocks += 1
                if blocks == 2:
                    world.send("ops.work", 2)  # a later block shows the new count
        assert blocks == 3
        counts = []
        while time.monotonic() < deadline and "2" not in counts:
            line = proc.stdout.readline()
            if line.startswith("q "):
                counts.append(line.split()[1])
        assert counts[-1] == "2" and set(counts) <= {"1", "2"}
    finally:
        proc.terminate()
        proc.wait(10)


def test_stats_watch_refuses_a_bad_interval(world):
    r = world.run("stats", "--watch=0", ok=False)
    assert r.exit_code == 2 and "must be a number of seconds > 0" in r.output


def test_peek_shows_delivery_order_task_and_args(world):
    low = world.send("ops.resize", 1, "small", priority=3)
    high = world.send("ops.resize", 2, "big", priority=250)
    rows = json.loads(world.run("peek", "q", "--json").output)
    assert [r["id"] for r in rows] == [high, low]
    assert rows[0]["priority"] == 250 and rows[0]["task"] == "ops.resize" and rows[0]["args"] == "(2, 'big')"
    assert rows[0]["age_seconds"] >= 0
    text = world.run("peek", "q", "-n", "1").output
    assert high in text and low not in text


def test_peek_delayed_shows_countdown_tasks_soonest_due_first(world):
    # what Celery's `inspect scheduled` shows of other brokers: ETA tasks wait in Redis here
    waiting = world.send("ops.work", 0)
    later = world.send("ops.resize", 1, "late", priority=7, countdown=600)
    sooner = world.send("ops.resize", 2, "soon", priority=200, countdown=60)
    rows = json.loads(world.run("peek", "q", "--delayed", "--json").output)
    assert [r["id"] for r in rows] == [sooner, later]
    assert rows[0]["task"] == "ops.resize" and rows[0]["args"] == "(2, 'soon')" and rows[0]["priority"] == 200
    assert 50 < rows[0]["due_in_seconds"] <= 60 and 590 < rows[1]["due_in_seconds"] <= 600
    assert rows[1]["due_ms"] - rows[0]["due_ms"] == pytest.approx(540_000, abs=2000)
    assert [r["id"] for r in json.loads(world.run("peek", "q", "--json").output)] == [waiting]
    text = world.run("peek", "q", "--delayed", "-n", "1").output
    assert sooner in text and later not in text and "1 delayed, soonest due first" in text
    r = world.run("peek", "q", "--delayed", "--tenant", "acme", ok=False)
    assert r.exit_code == 2 and "leave out --tenant" in r.output


def test_peek_by_tenant(fair_world):
    w = fair_world
    a = w.send("ops.work", 1, headers={"tenant": "acme"})
    w.send("ops.work", 2, headers={"tenant": "zeta"})
    rows = json.loads(w.run("peek", "q", "--tenant", "acme", "--json").output)
    assert [(r["id"], r["tenant"]) for r in rows] == [(a, "acme")]


def test_peek_by_tenant_on_a_plain_queue_is_an_error(world):
    world.send("ops.work", 1)
    r = world.run("peek", "q", "--tenant", "acme", ok=False)
    assert r.exit_code == 1 and "is not fair" in r.output


def test_unknown_queue_is_one_line_and_exit_1(world):
    world.send("ops.work", 1)
    r = world.run("peek", "nope", ok=False)
    assert r.exit_code == 1
    assert r.output.strip() == "Error: unknown queue 'nope' (declared: q)"


def test_remove(world):
    t = world.send("ops.work", 1)
    keep = world.send("ops.work", 2)
    assert world.run("remove", "q", t, "--yes").output.strip() == "1"
    assert [e.id for e in world.queue().peek(10)] == [keep]
    r = world.run("remove", "q", t, "--yes", ok=False)
    assert r.exit_code == 1 and "no waiting message" in r.output


def test_reprioritize(world):
    first = world.send("ops.work", 1, priority=100)
    second = world.send("ops.work", 2, priority=50)
    world.run("reprioritize", "q", second, "200")
    assert [(e.id, e.priority) for e in world.queue().peek(10)] == [(second, 200), (first, 100)]
    r = world.run("reprioritize", "q", second, "300", ok=False)
    assert r.exit_code == 1 and "300" in r.output and "out of range" in r.output
    r = world.run("reprioritize", "q", "no-such-task", "5", ok=False)
    assert r.exit_code == 1 and "no-such-task" in r.output


def test_dead_shows_reason_time_and_deliveries(world):
    t = world.send("ops.fail", 7)
    assert dead_letter(world, reason="boom") == [t]
    [row] = json.loads(world.run("dead", "q", "--json").output)
    assert row["id"] == t and row["reason"] == "boom" and row["deliveries"] == 1 and row["task"] == "ops.fail"
    assert abs(row["dead_ms"] / 1000 - time.time()) < 30
    assert "boom" in world.run("dead", "q").output


def test_peek_and_dead_show_a_decompression_bomb_as_unreadable(world):
    try:
        from support.bombs import zstd_bomb
    except ImportError:  # collected with the repository root on sys.path instead of tests/
        from tests.support.bombs import zstd_bomb
    # Given a 9.6 KB entry whose zstd frame declares 300 MB, waiting before a good task
    q = world.queue()
    q.insert(zstd_bomb(), 200, id="bomb")
    good = world.send("ops.work", 1)
    # Then pq peek shows it as unreadable (with why), without inflating it, and the good one as usual
    rows = json.loads(world.run("peek", "q", "--json").output)
    assert [(r["id"], r["task"]) for r in rows] == [("bomb", None), (good, "ops.work")]
    assert rows[0]["args"].startswith("unreadable: zstd frame declares 314572800 bytes")
    assert "unreadable: zstd frame" in world.run("peek", "q").output
    # and so does pq dead once it is dead-lettered
    assert dead_letter(world, reason="malformed") == ["bomb"]
    [row] = json.loads(world.run("dead", "q", "--json").output)
    assert (row["id"], row["reason"], row["task"]) == ("bomb", "malformed", None)
    assert row["args"].startswith("unreadable: zstd frame declares 314572800 bytes")


def test_replay_by_id_and_all(world):
    ids = [world.send("ops.fail", i, priority=p) for i, p in enumerate([10, 240, 30])]
    assert sorted(dead_letter(world, 3)) == sorted(ids)
    r = world.run("replay", "q", ids[1])
    assert "replayed 1" in r.output
    [back] = world.queue().peek(10)
    assert (back.id, back.priority, back.deliveries) == (ids[1], 240, 0)
    world.run("replay", "q", "--all", "--yes")
    assert world.queue().dead.size() == 0
    assert sorted((e.id, e.priority) for e in world.queue().peek(10)) == sorted(zip(ids, [10, 240, 30]))
    r = world.run("replay", "q", "missing-id", ok=False)
    assert r.exit_code == 1 and "not in the dead-letter queue: missing-id" in r.output
    r = world.run("replay", "q", ok=False)
    assert r.exit_code == 2 and "TASK_IDs or --all" in r.output


def test_replay_keeps_the_tenant(fair_world):
    w = fair_world
    t = w.send("ops.fail", 1, headers={"tenant": "acme"}, priority=77)
    dead_letter(w)
    w.run("replay", "q", t)
    [e] = w.queue().peek(5, tenant="acme")
    assert (e.id, e.tenant, e.priority, e.deliveries) == (t, "acme", 77, 0)


def test_leases_never_show_the_token(world):
    t = world.send("ops.work", 1)
    [lease] = world.queue().pop(consumer="worker-7:42:cafe", lease_seconds=30)
    [row] = json.loads(world.run("leases", "q", "--json").output)
    assert row["id"] == t and row["consumer"] == "worker-7:42:cafe" and row["deliveries"] == 1
    assert 0 < row["seconds_left"] <= 30
    assert "token" not in row
    for out in (world.run("leases", "q").output, world.run("leases", "q", "--json").output):
        assert lease.token not in out and lease.token.split(".")[0] not in out


def test_recover_returns_one_consumers_leases_at_once(world):
    for i in range(3):
        world.send("ops.work", i)
    q = world.queue()
    q.pop(2, consumer="crashed:1:dead", lease_seconds=600)
    q.pop(1, consumer="alive:2:beef", lease_seconds=600)
    r = world.run("recover", "--consumer", "crashed:1:dead", "--yes")
    assert "2 lease(s) returned" in r.output
    assert q.stats()["leased"] == 1 and q.size() == 2
    assert [x["consumer"] for x in q.leases()] == ["alive:2:beef"]
    r = world.run("recover", "--consumer", " ", "--yes", ok=False)
    assert r.exit_code == 2
    r = world.run("recover", "--consumer", "alive:2:beef", "nope", "--yes", ok=False)
    assert r.exit_code == 1 and "unknown queue 'nope'" in r.output
    assert q.stats()["leased"] == 1


def test_explain_uses_the_queue_technique(world):
    world.send("ops.work", 1)
    data = json.loads(world.run("explain", "q", "--json").output)
    assert data["technique"] == "T" and data["waiting"] == 1
    assert data["costs"]["pop"]["reads"] > 0
    assert "remove_by_id" in world.run("explain", "q").output


def test_purge_asks_unless_yes(world):
    for i in range(3):
        world.send("ops.work", i)
    r = world.run("purge", "q", input="y\n", ok=False)  # (not a terminal: not read as an answer)
    assert r.exit_code == 1 and "add --yes" in r.output and world.queue().size() == 3
    assert "purged 3" in world.run("purge", "q", "--yes").output
    assert world.queue().size() == 0


def _on_a_terminal(world, *args, answer: str) -> tuple[int, str]:
    """``python -m celery_pq ... ARGS`` with a terminal as stdin, answering ``answer`` to what it
    asks; (exit code, what it printed)."""
    import pty

    parent, child = pty.openpty()
    try:
        proc = subprocess.Popen(
            world.command(*args), stdin=child, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=celery_env(ROOT)
        )
        os.write(parent, answer.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(parent)
        os.close(child)
    return proc.returncode, out.decode()


CONFIRMED = {
    "remove": ("remove", "q", "{id}"),
    "replay --all": ("replay", "q", "--all"),
    "recover": ("recover", "--consumer", "gone:1:dead"),
    "purge": ("purge", "q"),
}


@pytest.mark.parametrize("name", list(CONFIRMED))
def test_commands_that_cannot_be_undone_ask_first_and_refuse_a_stdin_that_is_no_terminal(world, name):
    # Given a queue with a waiting message, a leased one and a dead letter
    for i in range(3):
        world.send("ops.work", i)
    q = world.queue()
    first, second = q.pop(2, consumer="gone:1:dead", lease_seconds=600)
    q.dead_letter(first, "boom")
    waiting = [e.id for e in q.peek(5)]
    args = [a.format(id=waiting[0]) for a in CONFIRMED[name]]

    def unchanged():
        return [e.id for e in q.peek(5)] == waiting and q.dead.size() == 1 and q.stats()["leased"] == 1

    # When stdin is not a terminal (a script, a pipe) and there is no --yes: refused, even with
    # a "y" waiting on stdin, naming --yes; nothing changes
    r = world.run(*args, input="y\n", ok=False)
    assert r.exit_code == 1 and "stdin is not a terminal; add --yes" in r.output and unchanged()
    # On a terminal, it asks: "n" changes nothing, "y" goes ahead
    code, out = _on_a_terminal(world, *args, answer="n")
    assert code == 1 and "? [y/N]" in out and "Aborted" in out and unchanged(), out
    code, out = _on_a_terminal(world, *args, answer="y")
    assert code == 0 and "? [y/N]" in out and not unchanged(), out


def test_backlog_counts_due_entries_in_the_view(world):
    world.send("ops.work", 1, priority=250)
    world.send("ops.work", 2, priority=10)
    world.send("ops.work", 3, priority=250, countdown=600)
    assert world.run("backlog", "q").output.strip() == "2"
    assert world.run("backlog", "q[>=200]").output.strip() == "1"
    assert world.run("backlog", "q[<5]").output.strip() == "0"


def test_backlog_leaves_out_tenants_held_at_their_cap(fair_world):
    w = fair_world  # tenant "slow" may hold one lease at a time
    for i in range(3):
        w.send("ops.work", i, headers={"tenant": "slow"})
    w.send("ops.work", 9, headers={"tenant": "fast"})
    assert w.run("backlog", "q").output.strip() == "4"
    q = w.queue()
    got = q.pop(2, consumer="c:1:x")  # one of each: slow reaches its cap
    assert sorted(x.tenant for x in got) == ["fast", "slow"]
    q.pop(1, consumer="c:1:x")  # parks "slow"
    assert w.run("backlog", "q").output.strip() == "0"
    assert held_tenants(q) == {"slow": "cap"}
    rows = json.loads(w.run("peek", "q", "--json").output)
    assert [r["held"] for r in rows] == ["cap", "cap"]


def test_unreachable_redis_is_named_without_its_password(world):
    from click.testing import CliRunner

    from celery_pq.__main__ import main

    r = CliRunner().invoke(main, ["--broker", "pq://:s3cr3t-pw@127.0.0.1:1/0", "stats"])
    assert r.exit_code == 1
    assert "cannot reach Redis at 127.0.0.1:1" in r.output
    assert "s3cr3t-pw" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_bad_transport_options_json():
    from click.testing import CliRunner

    from celery_pq.__main__ import main

    r = CliRunner().invoke(main, ["--broker", "pq://127.0.0.1:1/0", "--transport-options", "{nope", "stats"])
    assert r.exit_code == 2 and "not JSON" in r.output


@pytest.mark.e2e
def test_celery_a_proj_pq_runs_the_same_commands(world, tmp_path):
    """``celery -A app pq peek`` (the Celery entry point) sees what was published."""
    t = world.send("ops.work", 1, priority=42)
    app = tmp_path / "opsapp.py"
    app.write_text(
        "import celery_pq\nfrom celery import Celery\n"
        f"app = Celery('x', broker={world.url!r})\n"
        f"app.conf.broker_transport_options = {world.options!r}\n"
    )
    env = celery_env(os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "opsapp", "pq", "peek", "q", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert (row["id"], row["priority"]) == (t, 42)


def test_pause_and_resume_a_queue(world):
    world.send("ops.work", 1)
    assert "q: paused" in world.run("pause", "q").output
    [row] = [r for r in json.loads(world.run("stats", "--json").output) if r["queue"] == "q"]
    assert row["paused"] is True
    assert world.queue().pop(1) == []
    assert world.run("backlog", "q").output.strip() == "0"
    assert "running" in world.run("resume", "q").output
    assert world.run("backlog", "q").output.strip() == "1"
    assert len(world.queue().pop(1)) == 1


def test_pause_one_tenant(fair_world):
    w = fair_world
    w.send("ops.work", 1, headers={"tenant": "acme"})
    w.send("ops.work", 2, headers={"tenant": "zeta"})
    assert "paused tenants: acme" in w.run("pause", "q", "--tenant", "acme").output
    [row] = [r for r in json.loads(w.run("stats", "--json").output) if r["queue"] == "q"]
    assert row["paused"] is False and row["paused_tenants"] == ["acme"]
    assert w.run("backlog", "q").output.strip() == "1"
    assert [x.tenant for x in w.queue().pop(5, consumer="c:1:x")] == ["zeta"]
    w.run("resume", "q", "--tenant", "acme")
    assert [x.tenant for x in w.queue().pop(5, consumer="c:1:x")] == ["acme"]


def test_pause_a_tenant_of_a_plain_queue_is_an_error(world):
    world.send("ops.work", 1)
    r = world.run("pause", "q", "--tenant", "acme", ok=False)
    assert r.exit_code == 1 and "not fair" in r.output
