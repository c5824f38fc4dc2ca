"""Pure-Python units: no Redis needed."""

import pytest
import redis

from celery_pq.queue import PriorityQueue, escape_tenant, unescape_tenant, validate_priority
from celery_pq.storage import constants as C
from celery_pq.storage.keys import dead_queue_name, queue_keys, split_dead


@pytest.mark.parametrize("p", [0, 1, 128, 255])
def test_valid_priorities(p):
    assert validate_priority(p) == p


@pytest.mark.parametrize(
    "p,msg",
    [
        (-1, "out of range"),
        (256, "out of range"),
        (1.0, "integer"),
        ("3", "integer"),
        (None, "integer"),
        (True, "integer"),
    ],
)
def test_invalid_priorities_name_the_value(p, msg):
    with pytest.raises(ValueError, match=msg) as err:
        validate_priority(p)
    assert repr(p) in str(err.value) or str(p) in str(err.value)


def test_keys_share_one_tag_and_dead_queue_shares_it():
    k = queue_keys("orders", "pq")
    d = queue_keys("orders.dead", "pq")
    assert k.entries == "pq:{orders}:ii" and k.priority_index == "pq:{orders}:pi"
    assert d.entries == "pq:{orders}:dead:ii"
    assert all("{orders}" in key for key in k.all() + d.all())
    # 32 suffixes, 256 priority lists and 256 front lists each, 256 + 1 keys of a migration
    assert len(set(k.all() + d.all())) == 2 * (32 + 2 * 256 + 257)
    assert k.level(0) == "pq:{orders}:pi:0" and d.level(255) == "pq:{orders}:dead:pi:255"


def test_braces_in_queue_names_cannot_break_the_tag():
    k = queue_keys("a}b{c", "pq")
    tag = k.entries[k.entries.index("{") + 1 : k.entries.index("}")]
    assert "{" not in tag and "}" not in tag
    assert queue_keys("a}b{c").entries != queue_keys("a%7Db%7Bc").entries


def test_dead_names():
    assert split_dead("x.dead") == ("x", True)
    assert split_dead("x") == ("x", False)
    assert split_dead(".dead") == (".dead", False)
    assert dead_queue_name("x") == "x.dead"
    with pytest.raises(ValueError):
        dead_queue_name("x.dead")


@pytest.mark.parametrize("tenant", ["acme", "a,b", "a|b", "100%", "%2C", ""])
def test_tenant_escaping_round_trips(tenant):
    esc = escape_tenant(tenant)
    assert "," not in esc and "|" not in esc
    assert unescape_tenant(esc) == tenant


def test_score_layout_fits_a_double():
    assert (C.MAX_PRIORITY + 1) * C.SEQ_SPAN <= 2**53


def test_rank_follows_priority_order():
    hi = PriorityQueue(None, "q", priority_order="higher_first")  # no Redis call is made
    lo = PriorityQueue(None, "q", priority_order="lower_first")
    assert hi.rank(255) == 0 and hi.rank(0) == 255
    assert lo.rank(0) == 0 and lo.rank(255) == 255
    assert hi._scripts.priority_of_score(3 * C.SEQ_SPAN + 17) == 252


@pytest.mark.parametrize("kw", [{"technique": "Q"}, {"priority_order": "up"}, {"lease_seconds": 0}, {"max_length": 0}])
def test_queue_settings_are_checked(kw):
    with pytest.raises(ValueError):
        PriorityQueue(None, "q", **kw)


def test_entry_ids_round_trip_and_uuids_take_17_bytes():
    import uuid

    from celery_pq.storage.ids import decode_id, encode_id

    tid = str(uuid.uuid4())
    assert len(encode_id(tid)) == 17 and len(encode_id(tid + "~12")) == 20
    samples = [tid, tid + "~12", tid.upper(), "plain", "12", "\x01odd", "\x02", "é~3", "a" * 16, "x~1"]
    for x in samples:
        assert decode_id(encode_id(x)) == x
    assert len({encode_id(x) for x in samples}) == len(samples)  # no two ids share a stored form


def test_scripts_carry_only_the_helpers_they_call():
    import re

    from celery_pq.scripts import SCRIPT_NAMES, source
    from celery_pq.scripts.assembly import _without_unused_functions

    text = (
        "local function a()\n  return b()\nend\n"
        "local function b()\n  return 1\nend\n"
        "local function unused()\n  return a()\nend\n"
        "return a()\n"
    )
    assert _without_unused_functions(text) == (
        "local function a()\n  return b()\nend\nlocal function b()\n  return 1\nend\nreturn a()\n"
    )
    for name in SCRIPT_NAMES:  # every helper left in a script is named somewhere else in it
        body = source(name)
        for helper in re.findall(r"^local function (\w+)\(", body, re.M):
            assert len(re.findall(rf"\b{helper}\b", body)) >= 2, (name, helper)
    assert "local function fair_add" not in source("pop") and "local function to_dead" not in source("ack")


def test_a_script_call_is_packed_by_hiredis_and_anything_else_goes_redis_pys_way():
    from celery_pq.scripts import FIRST_SEND, wire

    class Conn(redis.Connection):  # (not connected: packing needs no server)
        def send_packed_command(self, command, check_health=True):
            sent.append(b"".join(command))

    sent: list = []
    conn = Conn()
    wire.send(conn, ("FCALL", "f", 2, "k", b"v", 7, FIRST_SEND))
    assert sent == [b"*7\r\n$5\r\nFCALL\r\n$1\r\nf\r\n$1\r\n2\r\n$1\r\nk\r\n$1\r\nv\r\n$1\r\n7\r\n$1\r\nF\r\n"]
    with pytest.raises(redis.DataError):  # hiredis packs no None: redis-py's path says why
        wire.send(conn, ("FCALL", "f", 0, None))


def test_an_id_decoded_lately_encodes_to_its_stored_form_from_memory(monkeypatch):
    from celery_pq.storage import ids

    monkeypatch.setattr(ids, "RECENT_MAX", 3)
    ids._RECENT.clear()
    raws = [b"\x01" + bytes([i]) * 16 for i in range(5)]
    texts = [ids.decode_id(r) for r in raws]
    assert texts[0] == "00000000-0000-0000-0000-000000000000"
    assert len(ids._RECENT) <= 3  # started again when full
    for raw, text in zip(raws, texts):
        assert ids.encode_id(text) == raw  # remembered or parsed again: the same stored form
    dup = b"\x01" + b"\xab" * 16 + b"~7"
    assert ids.encode_id(ids.decode_id(dup)) == dup and ids.decode_id(dup) not in ids._RECENT


def test_made_ids_are_unique_across_threads_forks_and_the_counter_going_round(monkeypatch):
    import os
    import threading

    from celery_pq.storage import ids

    made = []
    threads = [threading.Thread(target=lambda: made.extend(ids.unique_bytes() for _ in range(2000))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == len(made) == 8000 and {len(x) for x in made} == {12}

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's ids have a prefix of their own
        os.write(w, ids.unique_bytes())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 12)
    os.close(r)
    os.close(w)
    assert child[:8] != ids.unique_bytes()[:8]

    before = ids.unique_bytes()[:8]
    monkeypatch.setattr(ids, "_COUNTER_SPAN", 0)  # the counter has gone round: a new prefix
    assert ids.unique_bytes()[:8] != before
