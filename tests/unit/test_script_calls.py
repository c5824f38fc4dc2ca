"""Every argument builder of the queue's script calls (``queue/calls.py``) held to its script's
header: the ARGV it lays out is the one ``signature(name).args`` lays out from the header's
names, for a plain and a fair queue."""

import pytest
import redis

from celery_pq import constants as C
from celery_pq.ids import encode_id
from celery_pq.queue import PriorityQueue, calls
from celery_pq.scripts import SCRIPT_NAMES, signature


@pytest.fixture(params=[False, True], ids=["plain", "fair"])
def q(request):
    fair = request.param
    return PriorityQueue(
        redis.Redis(),
        "orders",
        fair=fair,
        max_length=100,
        **({"tenant_concurrency": 3, "tenant_rate": 2.5, "max_length_per_tenant": 7} if fair else {}),
    )


def flag(q):
    return "1" if q.fair else "0"


def built(q, name, args):
    """The ARGV a call of ``name`` sends: the builder's arguments, the queue context last."""
    return q.call(name, q.keys_of(name), args).args


def header(q, name, *rest, **named):
    return signature(name).args(*rest, context=q._ctx, **named)


def test_insert(q):
    q.views, q.views_version = [(0, 9), (10, 255)], "4"
    keys, head = calls.insert_head(q)
    items = [(b"p", 5, "a", "t,1", "0", b"pid", "task"), ("s", 200, None, None, "+10", None, None)]
    rest = [encode_id("a"), q.rank(5), "t%2C1", b"p", "0", b"pid", "task", "", q.rank(200), "", b"s", "+10", "", ""]
    assert q.call("insert", keys, calls.insert_args(q, head, items, [b"f"], "0")).args == header(
        q,
        "insert",
        *rest,
        max_length=100,
        max_per_tenant=q.max_length_per_tenant,
        fair=flag(q),
        scope=q.scope,
        views_version="4",
        views=["0,9", "10,255"],
        forget=[b"f"],
        made="0",
    )
    assert len(keys) == len(q.keys_of("insert")) + 2  # each view's wake list after the header's keys


def test_pop(q):
    name = "pop_fair" if q.fair else "pop"
    acks = [("e1", "t1"), ("e2", "t2")]
    fair = {"scope": q.scope, "conc": q.tenant_concurrency, "rate": q.tenant_rate} if q.fair else {}
    assert built(q, name, calls.pop_args(q, 3, 1500, "c1", "tok", (0, 255, 9), acks)) == header(
        q,
        name,
        encode_id("e1"),
        "t1",
        encode_id("e2"),
        "t2",
        lease_ms=1500,
        consumer="c1",
        token_base="tok",
        count=3,
        stale_budget=C.POP_STALE_BUDGET,
        lo=0,
        hi=255,
        take_hi=9,
        **fair,
    )


def test_leases(q):
    pairs = [("e1", "t1")]
    assert built(q, "ack", calls.ack_args(q, pairs)) == header(q, "ack", encode_id("e1"), "t1", fair=flag(q))
    assert calls.extend_args(900, pairs) == signature("extend").args(encode_id("e1"), "t1", lease_ms=900)
    assert built(q, "requeue", calls.requeue_args(q, "e1", "t1", False, "why")) == header(
        q,
        "requeue",
        eid=encode_id("e1"),
        token="t1",
        count_delivery=0,
        max_deliveries=q.max_deliveries,
        dead_reason="why",
        fair=flag(q),
        scope=q.scope,
    )
    assert built(q, "reclaim", calls.reclaim_args(q, 50, 1.5, "c1", 2.0, 3.0, 7)) == header(
        q,
        "reclaim",
        limit=50,
        max_deliveries=q.max_deliveries,
        guard_ms=1500,
        consumer="c1",
        fair=flag(q),
        scope=q.scope,
        gap_ms=2000,
        restore_ms=3000,
        start=7,
    )


def test_by_id_and_priority(q):
    assert built(q, "remove", calls.remove_args(q, "a", "cur", 10)) == header(
        q, "remove", id=encode_id("a"), technique=q.technique, fair=flag(q), scope=q.scope, cursor="cur", step=10
    )
    assert built(q, "change_priority", calls.change_priority_args(q, "a", 9)) == header(
        q, "change_priority", eid=encode_id("a"), rank=q.rank(9), technique=q.technique, fair=flag(q), scope=q.scope
    )
    assert built(q, "retrieve_by_priority", calls.retrieve_by_priority_args(q, 9)) == header(
        q, "retrieve_by_priority", rank=q.rank(9), stale_budget=C.POP_STALE_BUDGET
    )
    assert built(q, "remove_highest", calls.remove_highest_args()) == header(
        q, "remove_highest", stale_budget=C.POP_STALE_BUDGET
    )
    assert built(q, "peek", calls.peek_args(4)) == header(q, "peek", count=4, stale_budget=C.POP_STALE_BUDGET)
    assert built(q, "peek_head", calls.head_args(2, 8)) == header(
        q, "peek_head", lo=2, hi=8, stale_budget=C.POP_STALE_BUDGET
    )


def test_admin(q):
    assert built(q, "cleanup", calls.cleanup_args(3, 20)) == header(q, "cleanup", rank=3, count=20)
    assert built(q, "purge", calls.purge_args(q)) == header(q, "purge", count=C.STEP_CHUNK, fair=flag(q), scope=q.scope)
    assert built(q, "migrate", calls.migrate_args(5)) == header(q, "migrate", step=5)
    assert built(q, "pause", calls.pause_args(True, "t|1")) == header(q, "pause", paused="1", tenant="t%7C1")
    assert built(q, "event_log", calls.event_log_args(None)) == header(q, "event_log", cap=0)
    assert built(q, "replay", calls.replay_args(q, ["a", "b"])) == header(
        q, "replay", encode_id("a"), encode_id("b"), max_length=100, fair=flag(q), scope=q.scope
    )


def test_every_script_has_its_builder_here():
    tested = {
        "insert",
        "pop",
        "pop_fair",
        "ack",
        "extend",
        "requeue",
        "reclaim",
        "remove",
        "change_priority",
        "retrieve_by_priority",
        "remove_highest",
        "peek",
        "peek_head",
        "cleanup",
        "purge",
        "migrate",
        "pause",
        "event_log",
        "replay",
    }
    assert tested == set(SCRIPT_NAMES)
