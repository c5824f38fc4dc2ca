"""Every argument builder of the queue's script calls (``queue/calls.py``) held to its script's
header: called with sample inputs (a distinct value each), it lays out the ARGV that
``signature(name).bind()`` lays out from the header's names, each value under its own name, the
queue context last, for a plain and a fair queue. Every script of ``SCRIPT_NAMES`` has a sample
here: a script with no builder held to its header fails, named."""

import pytest
import redis

from celery_pq.queue import Item, QueueSettings, calls, escape_tenant
from celery_pq.queue.scripts import Scripts
from celery_pq.scripts import SCRIPT_NAMES, signature
from celery_pq.storage import constants as C
from celery_pq.storage.ids import encode_id


def queue(fair: bool) -> Scripts:
    """The script calls of a queue (``PriorityQueue``'s private member, what ``calls`` builds for)."""
    caps = {"tenant_concurrency": 3, "tenant_rate": 2.5, "max_length_per_tenant": 7} if fair else {}
    q = Scripts(redis.Redis(), "orders", QueueSettings(fair=fair, max_length=100, max_deliveries=4, **caps))
    q.views, q.views_version = [(0, 9), (10, 255)], "4"
    return q


def _insert(q):
    _, head = calls.insert_head(q)
    items = [
        (Item(b"p", 5, "a", tenant="t,1", publish_id=b"pid", task="task", ttl=2), b"pid"),
        (Item("s", 200, delay=0.01), None),
    ]
    built = calls.insert_args(q, head, items, [b"f"], "0")
    rest = [encode_id("a"), q.rank(5), "t%2C1", b"p", "0", b"pid", "task", "+2000", ""]
    rest += ["", q.rank(200), "", b"s", "+10", "", "", "", ""]
    named = {
        "max_length": 100,
        "max_per_tenant": q.settings.max_length_per_tenant or 0,
        "views_version": "4",
        "views": ["0,9", "10,255"],
        "forget": [b"f"],
        "made": "0",
        "unique": [],
    }
    return built, rest, named


def _pop(q):
    pop = calls.pop_layout(q, 3, 1500, "c1", (2, 200, 9))
    built = pop(*calls.lease_pairs([("e1", "t1"), ("e2", "t2")]), token_base="tok")
    named = {
        "lease_ms": 1500,
        "consumer": "c1",
        "token_base": "tok",
        "count": 3,
        "stale_budget": C.POP_STALE_BUDGET,
        "lo": 2,
        "hi": 200,
        "take_hi": 9,
    }
    if q.settings.fair:
        named.update(conc=3, rate=2.5)
    return built, [encode_id("e1"), "t1", encode_id("e2"), "t2"], named


#: script -> (queue -> (the ARGV its builder lays out, the repeated group, the named values)).
SAMPLES = {
    "insert": _insert,
    "pop": _pop,
    "pop_fair": _pop,
    "ack": lambda q: (q.ack_call([("e1", "t1")]).args, [encode_id("e1"), "t1"], {}),
    "extend": lambda q: (
        q.layout("extend")(*calls.lease_pairs([("e1", "t1")]), lease_ms=900),
        [encode_id("e1"), "t1"],
        {"lease_ms": 900},
    ),
    "requeue": lambda q: (
        calls.requeue_args(q, "e1", "t1", False, "why"),
        [],
        {"eid": encode_id("e1"), "token": "t1", "count_delivery": 0, "max_deliveries": 4, "dead_reason": "why"},
    ),
    "reclaim": lambda q: (
        calls.reclaim_args(q, 50, 1.5, "c1", 2.0, 3.0, 7),
        [],
        {
            "limit": 50,
            "max_deliveries": 4,
            "guard_ms": 1500,
            "consumer": "c1",
            "gap_ms": 2000,
            "restore_ms": 3000,
            "start": 7,
        },
    ),
    "remove": lambda q: (
        q.layout("remove")(id=encode_id("a"), cursor="cur", step=10),
        [],
        {"id": encode_id("a"), "cursor": "cur", "step": 10},
    ),
    "change_priority": lambda q: (
        q.layout("change_priority")(eid=encode_id("a"), rank=q.rank(9)),
        [],
        {"eid": encode_id("a"), "rank": q.rank(9)},
    ),
    "retrieve_by_priority": lambda q: (
        q.layout("retrieve_by_priority")(rank=q.rank(9)),
        [],
        {"rank": q.rank(9), "stale_budget": C.POP_STALE_BUDGET},
    ),
    "remove_highest": lambda q: (q.layout("remove_highest")(), [], {"stale_budget": C.POP_STALE_BUDGET}),
    "peek": lambda q: (q.layout("peek")(count=4), [], {"count": 4, "stale_budget": C.POP_STALE_BUDGET}),
    "peek_head": lambda q: (
        q.layout("peek_head")(lo=2, hi=8),
        [],
        {"lo": 2, "hi": 8, "stale_budget": C.POP_STALE_BUDGET},
    ),
    "cleanup": lambda q: (q.layout("cleanup")(rank=3, count=20), [], {"rank": 3, "count": 20}),
    "purge": lambda q: (q.layout("purge")(count=C.STEP_CHUNK), [], {"count": C.STEP_CHUNK}),
    "migrate": lambda q: (q.layout("migrate")(step=5), [], {"step": 5}),
    "pause": lambda q: (
        q.layout("pause")(paused="1", tenant=escape_tenant("t|1")),
        [],
        {"paused": "1", "tenant": "t%7C1"},
    ),
    "event_log": lambda q: (q.layout("event_log")(cap=0), [], {"cap": 0}),
    "replay": lambda q: (
        q.layout("replay")(encode_id("a"), encode_id("b")),
        [encode_id("a"), encode_id("b")],
        {"max_length": 100},
    ),
}


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_builder_lays_out_its_scripts_header(name, fair):
    assert name in SAMPLES, (
        f"scripts with no argument builder held to their header: {sorted(set(SCRIPT_NAMES) - set(SAMPLES))}"
    )
    if name.startswith("pop") and (name == "pop_fair") != fair:
        pytest.skip("pop is a plain queue's, pop_fair a fair queue's")
    q = queue(fair)
    built, rest, named = SAMPLES[name](q)
    sig = signature(name)
    expected = sig.bind()(*rest, **named, **({"context": q.context} if sig.context else {}))
    assert len(built) == len(expected) and built == expected


def test_the_samples_are_the_scripts():
    assert set(SAMPLES) == set(SCRIPT_NAMES)


def test_a_queue_lays_out_its_own_values_once_per_script():
    q = queue(True)
    assert q.layout("ack") is q.layout("ack")
    assert q.layout("requeue").free == ("eid", "token", "count_delivery", "dead_reason")
    keys, _ = calls.insert_head(q)
    assert len(keys) == len(q.keys_of("insert")) + 2  # each view's wake list after the header's keys
