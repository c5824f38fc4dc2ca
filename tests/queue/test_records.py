"""The stored records read the same in both languages: written by the scripts and read by
celery_pq.storage.records, written by celery_pq.storage.records and read by the scripts (on a real redis-server)."""

from __future__ import annotations

import pytest

from celery_pq.queue import escape_tenant
from celery_pq.scripts import compose
from celery_pq.storage import constants as C
from celery_pq.storage import records as R
from celery_pq.storage.ids import encode_id

PAYLOAD = b"p|q,r\x00\xff"  # the separators of the header may appear in a payload


def test_records_written_by_the_scripts_read_in_python(redis_client, make_pq):
    # Given a fair queue with an entry, a duplicate of its id and a publish id
    q = make_pq("rec", fair=True)
    k = q.keys
    first = q.insert(PAYLOAD, 7, id="x", tenant="a,b", publish_id=b"pid-1")
    dup = q.insert(b"two", 7, id="x", tenant="a,b")
    assert (first, dup) != ("x", "x") and first == "x"
    # Then the entries read back field by field
    h, payload = R.split_entry(redis_client.hget(k.entries, encode_id("x")))
    rank, seq = R.split_score(h.score)
    assert payload == PAYLOAD and h.deliveries == 0 and rank == q.rank(7)
    assert h.tenant == escape_tenant("a,b").encode() and h.flags == b"" and h.dead_note == b""
    assert h.enqueued_ms > 1_600_000_000_000
    assert R.split_entry(redis_client.hget(k.entries, encode_id(dup)))[0].flags == b"d"
    # and so do the pointers, the tenant-order members, the publish-id value and the mode
    pointers = [R.split_pointer(p) for p in redis_client.lrange(k.level(rank), 0, -1)]
    assert pointers[0] == (seq, encode_id("x")) and len(pointers) == 2
    members = [R.split_tenant_member(m) for m in redis_client.zrange(k.tenant_entries, 0, -1)]
    assert members[0] == (h.tenant, rank, seq, encode_id("x"))
    assert R.publish_entry(redis_client.hget(k.publish_ids, b"pid-1"), encode_id("x")) == encode_id("x")
    assert redis_client.get(k.mode).decode() == R.join_mode(True, "within_priority", C.HIGHER_FIRST, "T")
    # When the first is leased, its lease record reads back
    [lease] = q.pop(1, consumer="c1")
    lr = R.split_lease(redis_client.hget(k.leases, encode_id("x")))
    assert lr == R.LeaseRecord(lease.token, "c1", h.score, 1, b"", h.tenant)
    # and once dead-lettered, so does its note
    q.dead_letter(lease, "rejected")
    [dead] = redis_client.hvals(q.dead.keys.entries)
    reason, ms, deliveries = R.split_dead_note(R.split_entry(dead)[0].dead_note)
    assert (reason, deliveries) == ("rejected", 1) and ms >= h.enqueued_ms


# Every Lua reader and writer of records.lua and fair.lua, run alone on the records Python wrote.
_LUA = """--!include records.lua
--!include fair.lua
local e, bar = split_entry(ARGV[1])
local tok, c, s, d, x, t = split_lease(ARGV[2])
local seq, eid = parse_ptr(ARGV[3])
local rank, tseq, teid = split_te_member(ARGV[5], ARGV[4])
return {
  fmt(e.d), e.s, e.t, e.x, e.r, e.ts, string.sub(ARGV[1], bar + 1),
  tok, c, s, fmt(d), x, t,
  fmt(seq), eid,
  rank, fmt(tseq), teid,
  join_entry(e, ARGV[1], bar), join_lease(tok, c, s, d, x, t), make_ptr(seq, eid),
  te_member(ARGV[5], rank, tseq, teid), dead_note('why', 1700000000123, 4), e.xp,
}
"""


@pytest.mark.parametrize("expires", [0, 1700000009999])
@pytest.mark.parametrize("tenant", [b"", b"acme%2Cco"])
def test_records_written_in_python_read_by_the_scripts(redis_client, tenant, expires):
    eid = encode_id("entry-1~3")
    score = R.score(200, C.SEQ_SPAN - 2)
    header = R.EntryHeader(2, score, tenant, b"d", R.join_dead_note("why", 1700000000123, 4), 1700000000000, expires)
    entry = R.join_entry(header, PAYLOAD)
    assert R.split_entry(entry) == (header, PAYLOAD)
    lease = R.join_lease(R.LeaseRecord("tok.1", "host:1:ab", score, 3, b"d", tenant))
    pointer = R.join_pointer(C.SEQ_SPAN - 2, eid)
    member = R.join_tenant_member(tenant, 200, C.SEQ_SPAN - 2, eid)
    got = redis_client.eval(compose(_LUA), 0, entry, lease, pointer, member, tenant)
    assert got == [
        b"2",
        b"%d" % score,
        tenant,
        b"d",
        b"why@1700000000123@4",
        b"1700000000000",
        PAYLOAD,
        b"tok.1",
        b"host:1:ab",
        b"%d" % score,
        b"3",
        b"d",
        tenant,
        b"%d" % (C.SEQ_SPAN - 2),
        eid,
        200,
        b"%d" % (C.SEQ_SPAN - 2),
        eid,
        entry,
        lease,
        pointer,
        member,
        R.join_dead_note("why", 1700000000123, 4),
        b"%d" % expires if expires else b"",
    ]


def test_an_entry_and_lease_written_in_python_are_served_by_the_scripts(redis_client, make_pq):
    # Given an entry, its pointer and its rank written by hand with the Python codec
    q = make_pq("rec2")
    k = q.keys
    q.insert(b"first", 1, id="first")  # records the queue's mode
    rank, eid = q.rank(9), encode_id("hand")
    s = R.score(rank, 10**6)
    redis_client.hset(k.entries, eid, R.join_entry(R.EntryHeader(1, s, b"", b"", b"", 1700000000000), PAYLOAD))
    redis_client.rpush(k.level(rank), R.join_pointer(10**6, eid))
    redis_client.zadd(k.priority_index, {rank: rank})
    # When it is popped, it comes back as written
    [lease] = q.pop(1)
    assert (lease.id, lease.payload, lease.priority, lease.deliveries, lease.enqueued_ms) == (
        "hand",
        PAYLOAD,
        9,
        2,
        1700000000000,
    )
    # and a lease record written by hand is honoured by extend and ack
    redis_client.hset(k.leases, eid, R.join_lease(R.LeaseRecord("mine", "c", s, 2, b"", b"")))
    assert q.extend([("hand", "mine")], 30) == [True]
    assert q.ack(("hand", lease.token)) is False and q.ack(("hand", "mine")) is True


def test_readers_return_none_on_what_is_not_a_record():
    assert R.split_entry(b"nobar") is None and R.split_entry(b"1,2|x") is None
    assert R.split_lease(b"garbage") is None and R.split_pointer(b"\x01") is None
    assert R.split_tenant_member(b"t\0abc") is None and R.split_dead_note(b"") is None


def test_numbers_are_written_as_redis_takes_them_and_scores_compared_exactly(redis_client):
    # fmt keeps the text of small whole numbers; every number reads as string.format's "%.0f"
    numbers = [0, 1, 7, 1023, 1024, 2.5, 3.5, -1, 17592186044416 * 255 + 17592186044415, 1700000000123]
    lua = "--!include records.lua\nlocal out = {}\nfor i = 1, 2 do\n"
    lua += "".join(f"  out[#out + 1] = fmt({n!r})\n" for n in numbers) + "end\nreturn out"
    want = [(b"%.0f" % n) for n in numbers]
    assert redis_client.eval(compose(lua), 0) == want * 2
    # same_score: the score field's text is the number's own text, no second spelling
    score = 17592186044416 * 200 + 12345
    cases = [(str(score), score, 1), ("0" + str(score), score, 0), (str(score + 1), score, 0), ("0", 0, 1)]
    lua = (
        "--!include records.lua\nreturn {" + ", ".join(f"same_score('{s}', {n}) and 1 or 0" for s, n, _ in cases) + "}"
    )
    assert redis_client.eval(compose(lua), 0) == [ok for _, _, ok in cases]
