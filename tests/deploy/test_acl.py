"""ACL: the whole transport as a Redis user confined to ``~pq:*`` and ``&pq:*`` with only the
commands it needs: publish, consume, priority views, fairness, delayed tasks, lease renewal,
dead letters, ``celery inspect ping``, ``celery control add_consumer`` and ``celery pq stats``,
against real Celery worker subprocesses.

The ACL lines are the ones docs/deployments.md and docs/key-layout.md print (a test reads them
from there): one for a user that may load the scripts as a library of functions (FUNCTION LOAD,
then FCALL), one for a user that may only run them by EVALSHA.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import Connection

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.ids import decode_id
from celery_pq.testing import RedisServer, WorkerProcess, celery_env, start_worker, wait_for
from tests.support.consume import drain, make_queue, publish_numbers

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "deployments.md"
PASSWORD = "s3cret-pq"


def acl_lines() -> dict[str, str]:
    """{"functions": line, "evalsha": line}: the ``ACL SETUSER`` lines docs/deployments.md prints,
    each under a comment naming its form."""
    text = DOCS.read_text(encoding="utf-8")
    found = dict(re.findall(r"^# (functions|evalsha):.*\n(ACL SETUSER .+)$", text, re.M))
    assert set(found) == {"functions", "evalsha"}, "docs/deployments.md lost an ACL line"
    return found


def test_key_layout_prints_the_same_lines():
    layout = (ROOT / "docs" / "key-layout.md").read_text(encoding="utf-8")
    for line in acl_lines().values():
        assert line in layout


def setuser(server: RedisServer, line: str) -> str:
    """Make the user of a documented line (its password replaced by ours); the user name."""
    words = line.split()
    assert words[:2] == ["ACL", "SETUSER"]
    words = [f">{PASSWORD}" if w.startswith(">") else w for w in words]
    server.client().execute_command(*words)
    return words[2]


def start(env, tmp, name, queues) -> WorkerProcess:
    """A worker of tests.e2e.app as the confined user, on ``queues`` (mingle and gossip on, as a
    worker runs by default), once ready."""
    worker = start_worker(
        "tests.e2e.app",
        cwd=ROOT,
        env=env,
        name=name,
        queues=queues,
        prefetch_multiplier=None,
        gossip=True,
        mingle=True,
        log=tmp / f"{name}.log",
    )
    try:
        return worker.wait_ready(60)
    except BaseException:
        worker.stop()
        raise


@pytest.mark.parametrize("form", ["functions", "evalsha"])
def test_the_whole_transport_as_the_documented_acl_user(form, tmp_path):
    line = acl_lines()[form]
    broker = RedisServer("--enable-debug-command", "no")
    records = RedisServer()
    workers: list[WorkerProcess] = []
    try:
        user = setuser(broker, line)
        url = f"pq://{user}:{PASSWORD}@127.0.0.1:{broker.port}/0"
        options = {"fair_key": "tenant", "lease_seconds": 3, "sweep_interval": 0.3, "block_seconds": 1}
        env = celery_env(
            ROOT,
            PQ_TEST_BROKER=url,
            PQ_TEST_OPTIONS=json.dumps(options),
            PQ_TEST_RECORD=records.url,
            PQ_TEST_PREFIX="acl",
            PQ_TEST_ACKS_LATE="1",
        )
        rec = records.client()

        def recorded(kind):
            return [json.loads(x) for x in rec.lrange(f"acl:rec:{kind}", 0, -1)]

        app = Celery("acl-producer", broker=url)
        app.conf.broker_transport_options = options

        # Given two workers as the confined user: one on queue q (fair by tenant), one on the
        # priority view hi[>=200] of queue hi
        workers.append(start(env, tmp_path, "w1", "q"))
        workers.append(start(env, tmp_path, "w2", "hi[>=200]"))

        # publish, fairness, priorities, a delayed task, a task longer than its lease (renewed)
        app.send_task("e2e.sleep", args=[4.5, "long"], queue="q", headers={"tenant": "c"})
        wait_for(lambda: recorded("start"), 30, "the long task started")  # the others wait behind it
        for t, n in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]:
            app.send_task("e2e.tenant_record", args=[t, n], queue="q", headers={"tenant": t})
        app.send_task("e2e.tenant_record", args=["late", 1], queue="q", countdown=1, headers={"tenant": "d"})
        for p in (10, 250, 220, 199):
            app.send_task("e2e.record", args=[p, p], queue="hi", priority=p)
        wait_for(lambda: len(recorded("tenant")) == 6 and len(recorded("done")) == 1, 60, "the tasks on q")
        wait_for(lambda: len(recorded("order")) == 2, 30, "the view's tasks")
        assert sorted(r[0] for r in recorded("order")) == [220, 250]  # the view takes only >= 200
        order = [tuple(r) for r in recorded("tenant") if r[0] in "ab"]
        assert order == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]  # the tenants took turns
        assert [tuple(r) for r in recorded("start")] and len(recorded("start")) == 1  # renewed: ran once

        # remote control through pub/sub and the reply queue: inspect ping, add_consumer (each
        # named, so the command returns once they answered instead of waiting out its timeout)
        both = ",".join(f"{w}@{os.uname().nodename}" for w in ("w1", "w2"))
        ping = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "inspect", "ping", "-t", "10", "-d", both],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ping.stdout.count("pong") == 2, ping.stdout + ping.stderr
        added = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.e2e.app",
                "control",
                "add_consumer",
                "extra",
                "-d",
                "w1@" + os.uname().nodename,
                "-t",
                "10",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "add consumer extra" in added.stdout, added.stdout + added.stderr
        app.send_task("e2e.record", args=[7, None], queue="extra")
        wait_for(lambda: [7, None] in recorded("order"), 30, "the added queue consumed")

        stats = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", "stats", "--json", "q", "hi"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        rows = {row["queue"]: row for row in json.loads(stats.stdout)}
        assert rows["hi"]["waiting"] == 2 and rows["q"]["waiting"] == 0, stats.stdout

        # dead letters: a rejected message goes to dl.dead, which is consumed like any queue
        queue, dead = make_queue("dl"), make_queue("dl.dead")
        with Connection(url, transport_options=options) as conn:
            publish_numbers(conn, queue, [1])
            got = drain(conn, queue, 1, ack=False)
            got[0][1].reject()
            assert [body for body, _ in drain(conn, dead, 1)] == [{"i": 1}]

        for w in workers:
            assert w.poll() is None, w.log_text()
        app.close()
        # Then Redis refused nothing but what the docs say is left out on purpose: CLIENT UNBLOCK
        # (a change of consumed queues then waits for block_seconds) and, for the evalsha
        # form, FUNCTION LOAD (the scripts then run by EVALSHA); every key is pq:...
        expected = {"client|unblock"} | ({"function|load"} if form == "evalsha" else set())
        log = [entry for entry in broker.client().acl_log() if entry["object"] not in expected]
        assert not log, log
        assert all(k.startswith(b"pq:") for k in broker.client().keys("*"))
        uses_functions = bool(broker.client().function_list())
        assert uses_functions == (form == "functions")
    finally:
        for w in workers:
            w.stop()
        broker.close()
        records.close()


@pytest.mark.parametrize("form", ["functions", "evalsha"])
def test_wait_replicas_and_a_lease_by_id_as_the_documented_acl_user(form, tmp_path):
    # Given a master with one replica, and the documented user on the master: its +wait (publishes
    # and acks end with WAIT under wait_replicas) and +multi +exec (PriorityQueue.leases with an id)
    master = RedisServer("--repl-diskless-sync-delay", "0")
    replica = RedisServer("--replicaof", "127.0.0.1", str(master.port))
    try:
        wait_for(
            lambda: replica.client(decode_responses=True).info("replication").get("master_link_status") == "up",
            30,
            "the replica in sync",
        )
        user = setuser(master, acl_lines()[form])
        url = f"pq://{user}:{PASSWORD}@127.0.0.1:{master.port}/0"
        queue = make_queue("wq")
        with Connection(url, transport_options={"wait_replicas": 1, "wait_timeout": 5}) as conn:
            # When it publishes (each publish waits for the replica)
            publish_numbers(conn, queue, range(5))
            # Then the replica has them the moment the publishes returned
            assert open_queue(replica.client(), "wq", QueueSettings(key_prefix="pq"), declare=False).size() == 5
            # and a leased message's lease reads in one MULTI as the same user
            confined = redis.Redis(host="127.0.0.1", port=master.port, username=user, password=PASSWORD)
            q = open_queue(confined, "wq", QueueSettings(key_prefix="pq"), declare=False)
            held = drain(conn, queue, 1, ack=False)
            [(body, message)] = held
            [leased] = confined.zrange(q.keys.lease_deadlines, 0, -1)  # the one lease deadline
            [lease] = q.leases(id=decode_id(leased))
            assert lease["deliveries"] == 1 and lease["seconds_left"] > 0
            message.ack()  # the ack waits for the replica too
            got = drain(conn, queue, 4)
            assert sorted(b["i"] for b, _ in got + held) == list(range(5))
            confined.close()
        lt = q.keys.leases
        wait_for(
            lambda: replica.client().hlen(lt) == 0 and replica.client().zcard(q.keys.lease_deadlines) == 0,
            10,
            "the acks on the replica",
        )
        # and Redis refused nothing but what the docs leave out on purpose (as above)
        expected = {"client|unblock"} | ({"function|load"} if form == "evalsha" else set())
        log = [entry for entry in master.client().acl_log() if entry["object"] not in expected]
        assert not log, log
    finally:
        replica.close()
        master.close()
