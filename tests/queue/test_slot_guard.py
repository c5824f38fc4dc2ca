"""The scripts' slot guard (lua/includes/queue.lua, take_context): on a Redis Cluster each script
first reads two keys of its queue's slot that never exist, so that a call made while the slot
migrates stops before its first write (tests/cluster/test_resharding.py runs it on a real
migration). Here, on one Redis: a queue on one Redis sends no guard and its scripts run no extra
command; a context marked "~" runs the one read first, and the scripts do the same otherwise."""

from __future__ import annotations

import uuid

import pytest
import redis

from celery_pq import Item


def _guard_reads(server, ops) -> tuple[int, int]:
    """(commands naming a guard key ``~1``, script calls) the server ran while ``ops()`` ran
    (MONITOR shows the commands scripts run too)."""
    marker = f"end-{uuid.uuid4().hex}"
    client = redis.Redis(port=server.port)
    with client.monitor() as m:
        ops()
        client.echo(marker)
        guards = calls = 0
        while True:
            cmd = m.next_command()["command"]
            if marker in cmd:
                return guards, calls
            if cmd.startswith("EXISTS") and "~1" in cmd:
                guards += 1
            elif cmd.startswith(("FCALL ", "EVALSHA ")):
                calls += 1


def _work(q):
    def ops():
        q.insert(b"a", 3, id="a")
        q.insert_many([Item(b"b", 1), Item(b"c", 2)])
        got = q.pop(3)
        assert next(x.id for x in got) == "a"
        assert q.ack(got) == [True, True, True]
        q.reclaim()
        assert q.stats()["waiting"] == 0

    return ops


def test_a_queue_on_one_redis_runs_no_guard(redis_server, make_pq):
    q = make_pq("g1")
    assert not q._scripts.context.startswith("~")
    guards, calls = _guard_reads(redis_server, _work(q))
    assert guards == 0 and calls >= 5


def test_a_cluster_context_runs_the_guard_once_per_call_and_the_scripts_work_the_same(redis_server, make_pq):
    q = make_pq("g2")
    q._scripts.context = (
        "~" + q._scripts.context
    )  # as on a cluster (queue/base.py marks the context of a RedisCluster client)
    # insert, insert_many, pop, ack, reclaim, ...: one guard read per script call
    guards, calls = _guard_reads(redis_server, _work(q))
    assert guards == calls >= 5
    assert q.counters()["enqueued"] == 3 and q.counters()["acked"] == 3
    assert q.recorded()["mode"] == make_pq("g1").mode


def test_a_context_of_another_form_is_refused_before_any_write(redis_client, make_pq, key_prefix):
    """One form of the queue context (take_context): a caller's context of another form (fewer
    fields, as an older caller sent) is an error naming it, and nothing is written."""
    fields = make_pq("g3")._scripts.context.split("|")
    for wrong in ("|".join(fields[:4]), "|".join(fields[:5]), fields[0]):
        q = make_pq("g3")
        q._scripts.context = wrong  # (before the first call: its scripts' arguments are laid out then)
        with pytest.raises(redis.ResponseError, match="the queue context is not mode"):
            q.insert(b"a", 1)
    assert not list(redis_client.scan_iter(match=f"{key_prefix}:*"))
