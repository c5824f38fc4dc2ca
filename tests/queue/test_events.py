"""The event log, the counters the scripts keep, and pause/resume, on a real redis-server.

Every event comes from the script that makes the change, so each test does an operation
and reads the stream and the raw keys after it.
"""

import time
import uuid

import pytest

from celery_pq import ConfigError, Item
from celery_pq.queue import COUNTERS, EVENT_FIELDS, PriorityQueue, QueueSettings, open_queue
from celery_pq.storage.keys import queue_keys
from celery_pq.transport.options import Options
from tests.support.tenants import pauses, tenant_counts, tenant_deliveries


def q_of(make_pq, name="ev", **kw):
    kw.setdefault("event_log", 1000)
    return make_pq(name, **kw)


def last(q, e):
    """The last event of type e."""
    rows = [r for r in q.events() if r["e"] == e]
    assert rows, f"no {e!r} event in {q.events()}"
    return rows[-1]


def test_stream_entries_have_every_field_in_order(redis_client, make_pq, key_prefix):
    q = q_of(make_pq)
    tid = str(uuid.uuid4())
    q.insert(b"x", 200, id=tid, tenant="a|b", task="proj.tasks.resize")
    [(sid, fields)] = redis_client.xrange(q.keys.events)
    assert [k.decode() for k in fields] == list(EVENT_FIELDS)
    row = q.events()[0]
    assert row["sid"] == sid.decode()
    assert (row["e"], row["q"], row["id"], row["p"], row["k"], row["t"], row["c"], row["task"], row["n"], row["r"]) == (
        "enqueue",
        "ev",
        tid,
        200,
        55,
        "a|b",
        "",
        "proj.tasks.resize",
        None,
        "",
    )
    # the entry id's ms part and the ms field are both Redis time
    assert abs(int(row["sid"].split("-")[0]) - row["ms"]) < 1000
    assert q.keys.events == queue_keys("ev", key_prefix).events == f"{key_prefix}:{{ev}}:ev"


def test_lower_first_priority_and_rank(make_pq):
    q = q_of(make_pq, priority_order="lower_first")
    q.insert(b"x", 7)
    row = last(q, "enqueue")
    assert (row["p"], row["k"]) == (7, 7)


def test_deliver_ack_requeue_and_redelivery(make_pq):
    q = q_of(make_pq)
    q.insert(b"x", 5, id="a")
    [lease] = q.pop(consumer="w1")
    d = last(q, "deliver")
    assert (d["id"], d["p"], d["c"], d["n"], d["task"]) == ("a", 5, "w1", 1, "")
    assert q.requeue(lease) == "waiting"
    r = last(q, "requeue")
    assert (r["id"], r["c"], r["n"], r["r"]) == ("a", "w1", 1, "rejected")
    [lease] = q.pop(consumer="w2")
    assert last(q, "deliver")["n"] == 2
    assert q.requeue(lease, count_delivery=False) == "waiting"
    assert last(q, "requeue")["r"] == "restored"
    assert last(q, "requeue")["n"] == 1
    [lease] = q.pop(consumer="w3", acks=())
    assert q.ack(lease)
    a = last(q, "ack")
    assert (a["id"], a["c"], a["p"]) == ("a", "w3", 5)
    # an ack that carries a lost lease logs nothing
    before = len(q.events())
    assert not q.ack(lease)
    assert len(q.events()) == before


def test_acks_carried_by_a_pop_are_logged(make_pq):
    q = q_of(make_pq, fair=True)
    q.insert(b"x", 1, id="a", tenant="t1")
    q.insert(b"y", 1, id="b", tenant="t1")
    [lease] = q.pop(consumer="c")
    q.pop(consumer="c", acks=[(lease.id, lease.token)])
    kinds = [r["e"] for r in q.events()]
    assert kinds == ["enqueue", "enqueue", "deliver", "ack", "deliver"]
    assert [r["t"] for r in q.events()] == ["t1"] * 5


def test_expire_recover_and_dead(redis_client, make_pq):
    q = q_of(make_pq, max_deliveries=2)
    q.insert(b"x", 9, id="a")
    q.pop(consumer="w1", lease_seconds=0.05)
    time.sleep(0.1)
    assert q.reclaim()["returned"] == 1
    x = last(q, "expire")
    assert (x["id"], x["c"], x["n"], x["p"]) == ("a", "w1", 1, 9)
    q.pop(consumer="w2", lease_seconds=0.05)
    time.sleep(0.1)
    assert q.reclaim()["dead"] == 1  # the second delivery used max_deliveries up
    dead = last(q, "dead")
    assert (dead["id"], dead["q"], dead["r"], dead["n"]) == ("a", "ev", "max_deliveries", 2)
    assert not redis_client.exists(q.dead.keys.events)  # dead-lettering is logged in the live queue
    # all leases of a named consumer come back at once: requeue, reason "recovered"
    q.insert(b"y", 9, id="b")
    q.pop(consumer="gone")
    assert q.reclaim(consumer="gone")["returned"] == 1
    r = last(q, "requeue")
    assert (r["id"], r["c"], r["r"]) == ("b", "gone", "recovered")
    [lease] = q.pop(consumer="w")
    q.dead_letter(lease, "bad_input")
    assert (last(q, "dead")["id"], last(q, "dead")["r"]) == ("b", "bad_input")


def test_due_remove_purge_reprioritize(make_pq):
    q = q_of(make_pq)
    q.insert(b"x", 1, id="later", delay=0.05)
    assert last(q, "enqueue")["id"] == "later"
    time.sleep(0.1)
    assert q.reclaim()["promoted"] == 1
    assert (last(q, "due")["id"], last(q, "due")["p"]) == ("later", 1)
    q.change_priority("later", 250)
    rp = last(q, "reprioritize")
    assert (rp["id"], rp["p"], rp["k"]) == ("later", 250, 5)
    assert q.remove("later") == 1
    assert (last(q, "remove")["id"], last(q, "remove")["r"], last(q, "remove")["p"]) == ("later", "", 250)
    for i in range(3):
        q.insert(b"p", i, id=f"p{i}")
    q.insert(b"d", 1, id="delayed", delay=60)
    assert q.purge() == 4
    purged = [r for r in q.events() if r["e"] == "remove" and r["r"] == "purge"]
    assert sorted(r["id"] for r in purged) == ["delayed", "p0", "p1", "p2"]
    q.insert(b"h", 3, id="h")
    q.remove_highest_priority()
    assert (last(q, "remove")["id"], last(q, "remove")["r"]) == ("h", "highest")


def test_technique_s_remove_is_logged_with_its_priority(make_pq):
    q = q_of(make_pq, technique="S")
    q.insert(b"x", 77, id="s", tenant="t")
    assert q.remove("s") == 1
    r = last(q, "remove")
    assert (r["id"], r["p"], r["t"]) == ("s", 77, "t")


def test_pause_and_resume_events(make_pq):
    q = q_of(make_pq, fair=True)
    assert q.pause() and not q.pause()  # the second changes nothing and logs nothing
    assert q.resume()
    assert q.pause(tenant="acme") and q.resume(tenant="acme")
    rows = [(r["e"], r["t"], r["id"], r["p"]) for r in q.events()]
    assert rows == [
        ("pause", "", "", None),
        ("resume", "", "", None),
        ("pause", "acme", "", None),
        ("resume", "acme", "", None),
    ]


def test_log_off_writes_no_stream_and_no_switch(redis_client, make_pq):
    q = make_pq("off", max_deliveries=1)
    q.insert(b"x", 1, id="a", task="t")
    [lease] = q.pop()
    q.requeue(lease)  # -> dead
    q.insert(b"y", 1, id="b")
    q.remove("b")
    q.pause()
    q.resume()
    assert not redis_client.exists(q.keys.events)
    assert redis_client.get(q.keys.mode) == b"0-hT"
    assert q.events() == []


def test_the_cap_holds(redis_client, make_pq):
    q = q_of(make_pq, event_log=100, dedupe_seconds=0)
    q.insert_many([Item(b"x", 1)] * 3000, chunk=50)
    n = redis_client.xlen(q.keys.events)
    # MAXLEN ~ trims whole stream nodes (100 entries each by default), at the first event of a
    # call: the stream holds at most one call's events (50) more
    assert 100 <= n <= 100 + 100 + 50, n
    assert q.events()[-1]["e"] == "enqueue"


def test_the_recorded_switch_makes_every_process_log(redis_client, make_pq, key_prefix):
    on = q_of(make_pq, name="shared")
    off = make_pq("shared")  # a process without the option
    assert off.recorded()["event_log"] == 0
    on.insert(b"x", 1, id="a", task="t.a")
    assert off.recorded()["event_log"] == 1000
    off.insert(b"y", 1, id="b")
    [lease] = off.pop(consumer="other")
    off.ack(lease)
    assert [(r["e"], r["id"]) for r in on.events()] == [
        ("enqueue", "a"),
        ("enqueue", "b"),
        ("deliver", "a"),
        ("ack", "a"),
    ]
    # switched off on purpose: nobody logs until a process with the option calls again
    assert off.set_event_log(None) == 1000
    off.insert(b"z", 1, id="c")
    assert len(on.events()) == 4
    assert on.recorded()["event_log"] == 0
    on.insert(b"w", 1, id="d")
    assert on.recorded()["event_log"] == 1000 and last(on, "enqueue")["id"] == "d"
    assert off.set_event_log(50) == 1000 and on.recorded()["event_log"] == 50


def test_insert_many_carries_task_names(make_pq):
    q = q_of(make_pq)
    q.insert_many(
        [Item(b"a", 1, "i1", task="proj.a"), Item(b"b", 2, "i2"), Item(b"c", 3, "i3", tenant="t", task="proj.c")]
    )
    assert [(r["id"], r["task"], r["t"]) for r in q.events()] == [
        ("i1", "proj.a", ""),
        ("i2", "", ""),
        ("i3", "proj.c", "t"),
    ]


def test_a_repeated_publish_logs_nothing(make_pq):
    q = q_of(make_pq)
    q.insert(b"x", 1, publish_id=b"p1")
    q.insert(b"x", 1, publish_id=b"p1")
    assert [r["e"] for r in q.events()] == ["enqueue"]
    assert q.counters()["enqueued"] == 1


def test_event_reader_range_and_count(make_pq):
    q = q_of(make_pq)
    for i in range(5):
        q.insert(b"x", 1, id=f"i{i}")
    rows = q.events()
    assert [r["id"] for r in q.events(count=2)] == ["i0", "i1"]
    assert [r["id"] for r in q.events(start="(" + rows[1]["sid"])] == ["i2", "i3", "i4"]
    assert [r["id"] for r in q.events(start=rows[1]["sid"], end=rows[2]["sid"])] == ["i1", "i2"]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q: q.events(count=0), "count"),
        (lambda q: q.events(count="5"), "count"),
        (lambda q: q.set_event_log(-1), "event_log"),
        (lambda q: q.set_event_log(1.5), "event_log"),
        (lambda q: q.insert(b"x", 1, task=5), "task"),
        (lambda q: q.pause(tenant=5), "tenant"),
        (lambda q: q.pause(tenant=""), "tenant"),
    ],
)
def test_bad_input_is_named_and_writes_nothing(redis_client, make_pq, key_prefix, call, match):
    q = q_of(make_pq, fair=True)
    with pytest.raises(ValueError, match=match):
        call(q)
    assert not redis_client.keys(f"{key_prefix}*")


@pytest.mark.parametrize("value", [-1, "100", 1.5, True])
def test_bad_event_log_setting_is_named(make_pq, value):
    with pytest.raises(ValueError, match="event_log"):
        make_pq("q", event_log=value)
    with pytest.raises(ConfigError, match="event_log"):
        Options(event_log=value)
    assert Options(event_log=100).queue_settings("q").event_log == 100
    assert Options().queue_settings("q").event_log == 0  # off


# -- counters ----------------------------------------------------------------------------------
def test_counters_after_a_scripted_sequence(make_pq):
    q = make_pq("ct", max_deliveries=3, max_length=10)
    assert q.counters() == dict.fromkeys(COUNTERS, 0)
    q.insert_many([Item(b"x", 1, f"i{i}") for i in range(6)])  # enqueued 6
    leases = q.pop(3, consumer="w")  # delivered 3
    q.ack(leases[:2])  # acked 2
    q.requeue(leases[2])  # requeued 1 (i2 back, 1 delivery so far)
    q.pop(1, consumer="w", lease_seconds=0.05)  # delivered 1 (i2 again: redelivered 1)
    time.sleep(0.1)
    q.reclaim()  # lease_expired 1 (i2 back, 2 deliveries)
    [again] = q.pop(1, consumer="w")  # delivered 1, redelivered 1 (i2, its 3rd)
    assert again.id == "i2" and again.deliveries == 3
    assert q.requeue(again) == "dead"  # dead_lettered 1 (max_deliveries used up)
    assert q.remove("i3") == 1  # removed 1
    with pytest.raises(Exception):
        q.insert_many([Item(b"y", 1)] * 9)  # 3 waiting + 9 > 10: refused_full 9, nothing stored
    assert q.size() == 2
    assert q.counters() == {
        "enqueued": 6,
        "delivered": 5,
        "redelivered": 2,
        "acked": 2,
        "requeued": 1,
        "lease_expired": 1,
        "dead_lettered": 1,
        "removed": 1,
        "refused_full": 9,
        "expired": 0,
        **{f"unique_{k}": 0 for k in ("merged", "replaced", "debounced", "throttled")},
    }
    assert tenant_deliveries(q) == {}


def test_a_refused_insert_writes_only_its_counter(redis_client, make_pq, key_prefix):
    q = q_of(make_pq, max_length=1, fair=True, max_length_per_tenant=1)
    q.insert(b"x", 1, tenant="a")
    keys_before = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*") if not k.endswith(b":ct")}
    with pytest.raises(Exception, match="full"):
        q.insert(b"y", 1, tenant="b")
    with pytest.raises(Exception, match="full"):
        q.insert(b"y", 1, tenant="a")
    keys_after = {k: redis_client.dump(k) for k in redis_client.keys(f"{key_prefix}*") if not k.endswith(b":ct")}
    assert keys_after == keys_before  # no event, no entry
    assert q.counters()["refused_full"] == 2 and q.counters()["enqueued"] == 1


def test_tenant_deliveries_on_a_fair_queue(make_pq):
    q = make_pq("fq", fair=True)
    q.insert_many([Item(b"x", 1, None, tenant=t) for t in ["a", "a", "a", "b", "c,d"]])
    leases = q.pop(4, consumer="w")
    q.ack(leases)
    q.pop(1)
    assert tenant_deliveries(q) == {"a": 3, "b": 1, "c,d": 1}
    assert q.counters()["delivered"] == 5 and q.counters()["acked"] == 4


# -- pause / resume ----------------------------------------------------------------------------
def test_paused_queue_delivers_nothing_and_inserts_go_on(redis_client, make_pq):
    q = make_pq("pz")
    q.insert(b"before", 1, id="a")
    assert q.pause()
    assert pauses(q) == (True, [])
    assert q.pop(5) == []
    assert redis_client.llen(q.keys.wake) == 0  # a pop of a paused queue drops its wake list
    q.insert(b"during", 1, id="b")
    assert redis_client.llen(q.keys.wake) == 0  # nobody is woken for a paused queue
    assert q.pop(5) == []
    assert q.size() == 2
    st = q.stats()
    assert st["paused"] is True and st["paused_tenants"] == [] and st["waiting"] == 2
    assert q.resume()
    assert redis_client.llen(q.keys.wake) == 1  # a blocked consumer wakes at once
    assert [x.id for x in q.pop(5)] == ["a", "b"]
    assert pauses(q) == (False, []) and q.stats()["paused"] is False


def test_pause_holds_acks_and_priority_views(redis_client, make_pq):
    q = make_pq("pv")
    wake = q.register_view(0, 55)  # priorities 200..255
    q.insert(b"x", 250, id="hi")
    [lease] = q.pop(view=(0, 55))
    q.insert(b"y", 250, id="hi2")
    q.pause()
    redis_client.delete(wake)
    q.insert(b"z", 250, id="hi3")
    assert redis_client.llen(wake) == 0
    got = q.pop(view=(0, 55), acks=[(lease.id, lease.token)])
    assert got == [] and got.acked == [1]  # the ack still applies; nothing is delivered
    q.resume()
    assert redis_client.llen(wake) == 1 and redis_client.llen(q.keys.wake) == 1
    assert [x.id for x in q.pop(2, view=(0, 55))] == ["hi2", "hi3"]


def test_paused_tenant_is_skipped_while_others_are_served(redis_client, make_pq):
    q = make_pq("ft", fair=True)
    q.insert_many(
        [Item(b"x", 1, f"a{i}", tenant="a") for i in range(3)] + [Item(b"x", 1, f"b{i}", tenant="b") for i in range(3)]
    )
    assert q.pause(tenant="a")
    assert pauses(q) == (False, ["a"])
    got = q.pop(10)
    assert [x.id for x in got] == ["b0", "b1", "b2"]
    assert tenant_counts(q)["a"]["waiting"] == 3
    q.insert(b"x", 1, id="a3", tenant="a")  # publishing goes on
    assert q.pop(10) == []
    assert q.stats()["paused_tenants"] == ["a"]
    redis_client.delete(q.keys.wake)
    assert q.resume(tenant="a")
    assert redis_client.llen(q.keys.wake) == 1
    assert [x.id for x in q.pop(10)] == ["a0", "a1", "a2", "a3"]
    assert q.recorded()["paused_tenants"] == []


def test_a_tenant_paused_before_it_has_entries_and_at_its_cap(make_pq):
    q = make_pq("fc", fair=True, tenant_concurrency=1)
    q.pause(tenant="late")
    q.insert(b"x", 1, id="l0", tenant="late")
    q.insert(b"x", 1, id="o0", tenant="other")
    [o0] = q.pop(5)
    assert o0.id == "o0"
    q.ack(o0)
    # a tenant parked at its cap that is paused stays held when its lease ends
    q.insert(b"x", 1, id="o1", tenant="other")
    q.insert(b"x", 1, id="o2", tenant="other")
    [o1] = q.pop(1)
    assert o1.id == "o1"
    assert q.pop(1) == []  # other is at its cap of 1
    q.pause(tenant="other")
    q.ack(o1)
    assert q.pop(5) == []
    q.resume(tenant="late")
    q.resume(tenant="other")
    assert sorted(x.id for x in q.pop(5)) == ["l0", "o2"]


def test_paused_fair_queue_delivers_nothing(make_pq):
    q = make_pq("fp", fair=True)
    q.insert(b"x", 1, tenant="a")
    q.pause()
    assert q.pop(3) == []
    q.resume()
    assert len(q.pop(3)) == 1


def test_pausing_a_tenant_of_a_plain_queue_is_refused(redis_client, make_pq, key_prefix):
    q = make_pq("pl")
    with pytest.raises(ConfigError, match="not fair"):
        q.pause(tenant="acme")
    with pytest.raises(ConfigError, match="not fair"):
        q.resume(tenant="acme")
    assert not redis_client.keys(f"{key_prefix}*")


def test_switches_survive_migrations(redis_client, make_pq, key_prefix):
    a = make_pq("mq", event_log=10)
    a.pause()  # an empty queue with no record yet: the pause records a's mode
    # b and c made directly: open_queue would take the recorded mode
    b = PriorityQueue(redis_client, "mq", key_prefix=key_prefix, priority_order="lower_first")
    b.migrate_mode()  # the queue is empty: b's mode now, the switches stay
    b.insert(b"x", 1)
    assert b.recorded()["paused"] and b.recorded()["event_log"] == 10
    assert b.pop() == []
    c = PriorityQueue(redis_client, "mq", key_prefix=key_prefix, fair=True)
    c.migrate_mode()
    assert c.recorded()["paused"] and c.recorded()["event_log"] == 10
    assert c.recorded()["mode"]["fair"] is True
    assert open_queue(redis_client, "mq", QueueSettings(key_prefix=key_prefix), declare=False).settings.fair is True
    c.resume()
    assert len(c.pop()) == 1


def test_uuid_ids_are_logged_as_their_text(make_pq):
    q = q_of(make_pq)
    ids = [
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "80000000-8000-8000-8000-800000000000",
        "00000000-0000-0000-0000-000000000000",
        str(uuid.uuid4()),
        "\x01odd",
        "\x02odd",
        "plain",
    ]
    for i in ids:
        q.insert(b"x", 1, id=i)
    dup = q.insert(b"x", 1, id=ids[0])  # a duplicate id "<uuid>~<seq>"
    assert [r["id"] for r in q.events()] == [*ids, dup]
