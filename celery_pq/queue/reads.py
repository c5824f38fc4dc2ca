"""Read-only questions about a queue (what ``pq stats``, the metrics, the autoscaler and the
dashboard ask): sizes, stats, peeks, leases held, backlog, counters, the event log."""

from __future__ import annotations

from ..storage import constants as C
from ..storage.checks import count as _count
from ..storage.ids import decode_id, encode_id
from ..storage.records import split_entry, split_lease, split_tenant_member
from . import calls
from .scripts import Scripts
from .tenants import held_tenants, recorded, stored_entries, tenant_stats
from .unique import UNIQUE_COUNTS
from .values import COUNTERS, EVENT_INTS, Entry, as_text, escape_tenant, unescape_tenant


def exists(s: Scripts, id: str) -> bool:
    """Whether an entry with this id is stored (waiting, delayed or leased)."""
    return bool(s.client.hexists(s.keys.entries, encode_id(id)))


def _counts(s: Scripts, p) -> None:
    """Queue the reads of (entries, leased, delayed) on pipeline ``p``."""
    p.hlen(s.keys.entries)
    p.hlen(s.keys.leases)
    p.zcard(s.keys.delayed)


def _pointers(s: Scripts, ranks: list[int]) -> list[int]:
    """The pointers of each rank (stale ones too), in one round trip."""
    with s.pipeline() as p:
        for rank in ranks:
            p.llen(s.keys.level(rank))
            p.llen(s.keys.front(rank))
        lengths = p.execute()
    return [n + f for n, f in zip(lengths[::2], lengths[1::2])]


def size(s: Scripts) -> int:
    """Waiting entries (delayed ones not counted)."""
    with s.pipeline() as p:
        _counts(s, p)
        entries, leased, delayed = p.execute()
    return entries - leased - delayed


def stats(s: Scripts) -> dict:
    """waiting, leased, dead, per-priority counts, oldest waiting entry's age (seconds), and
    ``unique``: the unique keys held and the counts of their publishes' outcomes."""
    k = s.keys
    with s.pipeline() as p:
        _counts(s, p)
        p.hlen(k.unique_keys)
        p.hmget(k.counters, [f"unique_{kind}" for kind in UNIQUE_COUNTS])
        if s.dead_keys:
            p.hlen(s.dead_keys.entries)
        p.time()
        res = p.execute()
    entries, leased, delayed = res[0], res[1], res[2]
    held = recorded(s)
    dead = res[5] if s.dead_keys else 0
    unique = {"keys": res[3], **{kind: int(n or 0) for kind, n in zip(UNIQUE_COUNTS, res[4])}}
    now_s, now_us = res[-1]
    ranks = [int(r) for r in s.client.zrange(k.priority_index, 0, -1)]
    per_priority = {s.priority_of_rank(rank): n for rank, n in zip(ranks, _pointers(s, ranks))}
    indexed = sum(per_priority.values())
    head = peek(s, 1)
    oldest_ms = head[0].enqueued_ms if head else None
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    return {
        "queue": s.name,
        "waiting": entries - leased - delayed,
        "delayed": delayed,
        "leased": leased,
        "dead": dead,
        "index_members": indexed,
        "per_priority": dict(sorted(per_priority.items(), reverse=s.settings.priority_order == C.HIGHER_FIRST)),
        "head_age_seconds": (now_ms - oldest_ms) / 1000 if oldest_ms else None,
        "per_tenant": tenant_stats(s, ages=True) if s.settings.fair else {},
        "paused": held["paused"],
        "paused_tenants": held["paused_tenants"],
        "unique": unique,
    }


def peek(s: Scripts, count: int = 1, tenant: str | None = None) -> list[Entry]:
    """The next ``count`` entries in delivery order, not leased; with ``tenant``, that tenant's
    next waiting entries of a fair queue, in the order it gives them."""
    if tenant is None:
        reply = s.run("peek", count=count)
        return [calls.entry_of(s, *reply[i : i + 3]) for i in range(0, len(reply), 3)]
    if not s.settings.fair:
        raise ValueError(f"queue {s.name!r} is not fair: its entries carry no tenant")
    _count("count", count, none=False)
    t = escape_tenant(tenant)
    members = s.client.zrangebylex(s.keys.tenant_entries, f"[{t}\0", f"({t}\1", start=0, num=count)
    parsed = [m for m in (split_tenant_member(x) for x in members) if m]
    return [e for e in stored_entries(s, [m[3] for m in parsed]) if e]


def delayed(s: Scripts, count: int = 10) -> list[tuple[Entry, int]]:
    """The first ``count`` delayed entries (``countdown``/``eta``), soonest due first, each with its
    due time (Unix ms)."""
    _count("count", count, none=False)
    due = s.client.zrange(s.keys.delayed, 0, count - 1, withscores=True)
    entries = stored_entries(s, [eid for eid, _ in due])  # (one due and delivered meanwhile: left out)
    return [(entry, int(due_ms)) for entry, (_, due_ms) in zip(entries, due) if entry]


def leases(s: Scripts, limit: int = 1000, *, id: str | None = None) -> list[dict]:
    """The leases held now, earliest deadline first (at most ``limit``; with ``id``, that entry's
    alone, read in one MULTI): ``id``, ``consumer``, ``deliveries``, ``priority``, ``tenant``,
    ``deadline_ms``, ``seconds_left`` and ``age_seconds`` (since it was enqueued), on Redis's
    clock. Never the tokens: a token is what acks."""
    if id is None:
        _count("limit", limit, none=False)
        with s.pipeline() as p:
            p.zrange(s.keys.lease_deadlines, 0, limit - 1, withscores=True)
            p.time()
            held, (sec, usec) = p.execute()
        if not held:
            return []
        with s.pipeline() as p:
            p.hmget(s.keys.leases, [eid for eid, _ in held])
            p.hmget(s.keys.entries, [eid for eid, _ in held])
            records, values = p.execute()
    else:
        eid = encode_id(id)
        with s.pipeline(transaction=True) as p:
            p.zscore(s.keys.lease_deadlines, eid)
            p.time()
            p.hmget(s.keys.leases, [eid])
            p.hmget(s.keys.entries, [eid])
            deadline, (sec, usec), records, values = p.execute()
        held = [] if deadline is None else [(eid, deadline)]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    out = []
    for (eid, deadline), info, value in zip(held, records, values):
        lease = None if info is None else split_lease(info)
        if lease is None:
            continue
        entry = split_entry(value) if value else None
        out.append(
            {
                "id": decode_id(eid),
                "consumer": lease.consumer,
                "deliveries": lease.deliveries,
                "priority": s.priority_of_score(lease.score),
                "tenant": unescape_tenant(as_text(lease.tenant)) if lease.tenant else None,
                "deadline_ms": int(deadline),
                "seconds_left": (deadline - now_ms) / 1000,
                "age_seconds": (now_ms - entry[0].enqueued_ms) / 1000 if entry and entry[0].enqueued_ms else None,
            }
        )
    return out


def backlog(s: Scripts, view: tuple[int, int] | None = None) -> int:
    """Due waiting entries a consumer of this queue (or of the priority view ``view``) could take
    now: 0 while paused, not those of tenants held back (cap, rate, pause). A view of a plain queue
    counts its ranks' pointers (stale ones too), capped at the waiting total."""
    lo, hi = s.check_view(view)
    whole = (lo, hi) == (0, C.MAX_PRIORITY)
    k = s.keys
    held_now = recorded(s)
    if held_now["paused"]:
        return 0
    with s.pipeline() as p:
        _counts(s, p)
        if not whole and not s.settings.fair:  # (a rank's score is rank + 0.5 during a compaction)
            p.zrangebyscore(k.priority_index, lo, f"({hi + 1}")
        res = p.execute()
    waiting = max(0, res[0] - res[1] - res[2])
    if not s.settings.fair:
        if whole:
            return waiting
        return min(waiting, sum(_pointers(s, [int(r) for r in res[3]])))
    held = held_tenants(s, held_now)
    takeable = {escape_tenant(t): row["waiting"] for t, row in tenant_stats(s).items() if t not in held}
    if whole:
        return min(waiting, sum(takeable.values()))
    with s.pipeline() as p:
        for t in takeable:
            p.zlexcount(k.tenant_entries, f"[{t}\0{lo:03d}", f"({t}\0{hi + 1:03d}")
        return sum(p.execute())


def counters(s: Scripts) -> dict[str, int]:
    """The counters the scripts keep (hash ct): every name of ``COUNTERS`` (0 until it
    happens) and any other field there (``malformed``, ``dead_dropped``)."""
    out = dict.fromkeys(COUNTERS, 0)
    out.update({as_text(k): int(v) for k, v in s.client.hgetall(s.keys.counters).items()})
    return out


def events(s: Scripts, start: str = "-", end: str = "+", count: int | None = None) -> list[dict]:
    """Entries of the event log from stream id ``start`` to ``end`` (inclusive; ``"("`` before an
    id excludes it), at most ``count``: dicts of the fields of docs/events.md (strings but
    ``EVENT_INTS``: int, None when empty) and ``sid``, the stream id."""
    _count("count", count)
    out = []
    for sid, fields in s.client.xrange(s.keys.events, start, end, count):
        row: dict = {"sid": as_text(sid)}
        for k, v in fields.items():
            k, v = as_text(k), v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            row[k] = (int(v) if v else None) if k in EVENT_INTS else v
        out.append(row)
    return out


def retrieve_by_priority(s: Scripts, priority: int) -> str | None:
    """RETRIEVE BY PRIORITY: the id of the first waiting entry of that priority, or None."""
    reply = s.run("retrieve_by_priority", rank=s.rank(priority))
    return decode_id(reply[0]) if reply else None
