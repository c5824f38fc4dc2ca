"""The script calls of a queue: for each Lua script, the function that lays out its ARGV by the
names in its header (``Signature.bind``: a name a header adds, drops or moves is a TypeError
naming it) and the one that reads its reply. Pure functions of a queue's ``Scripts``: nothing
here talks to Redis. tests/unit/test_script_calls.py holds each to its header."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from ..scripts import Layout, signature
from ..storage import constants as C
from ..storage.errors import ErrorCode, raise_for
from ..storage.ids import decode_id, encode_id
from ..storage.records import entry_parts, split_dead_note, split_entry
from .item import lua_group
from .values import Delivery, Entry, Lease, as_text, unescape_tenant


class Context(Protocol):  # (a ``scripts.Scripts``)
    name: str
    settings: Any  # QueueSettings
    keys: Any  # keys.QueueKeys
    context: str
    views: list[tuple[int, int]]
    views_version: str

    def rank(self, priority: int) -> int: ...

    def priority_of_score(self, score) -> int: ...

    def layout(self, name: str) -> Layout: ...

    def keys_of(self, script: str, **given: str) -> list[str]: ...


class ScriptCall(NamedTuple):
    """One script call: the script, its KEYS, its ARGV (as ``scripts.run_replicated`` takes it)."""

    script: Any
    keys: list
    args: list


def layout(q: Context, name: str, **fixed) -> Layout:
    """The ARGV layout of script ``name`` for queue ``q``, the queue's own values its header names
    (context, settings) and ``fixed`` laid out once (``Scripts.layout`` keeps one per script)."""
    s, sig = q.settings, signature(name)
    own = {
        "context": q.context,
        "max_length": s.max_length or 0,
        "max_per_tenant": s.max_length_per_tenant or 0,
        "max_deliveries": s.max_deliveries,
        "conc": s.tenant_concurrency or 0,
        "rate": float(s.tenant_rate or 0),
        "stale_budget": C.POP_STALE_BUDGET,
    }
    return sig.bind(**{n: v for n, v in own.items() if n in sig.wanted}, **fixed)


def lease_pairs(pairs: Sequence[tuple[str, str]]) -> list:
    """``(entry id, token)`` pairs as a script takes them: flat, the ids encoded."""
    return [v for eid, token in pairs for v in (encode_id(eid), token)]


# -- reading entries --------------------------------------------------------------------------
def entry_of(q: Context, eid, score, value, cls: type[Entry] = Entry, **extra) -> Entry:
    """An entry (or lease) of a script's reply: its id, score and stored value."""
    parsed = split_entry(value)
    if parsed is None:  # the scripts return only entries they parsed
        raise ValueError(f"queue {q.name!r}: entry {eid!r} is malformed")
    h, payload = parsed
    note = split_dead_note(h.dead_note)
    dead_reason, dead_ms, dead_deliveries = (None, None, None) if note is None else note
    return cls(
        queue=q.name,
        id=decode_id(eid),
        priority=q.priority_of_score(score),
        payload=payload,
        deliveries=h.deliveries,
        tenant=unescape_tenant(as_text(h.tenant)) if h.tenant else None,
        enqueued_ms=h.enqueued_ms,
        dead_reason=dead_reason,
        dead_ms=dead_ms,
        dead_deliveries=dead_deliveries,
        expires_ms=h.expires_ms or None,
        **extra,
    )


# -- insert.lua -------------------------------------------------------------------------------
def insert_head(q: Context) -> tuple[list, Layout]:
    """(KEYS, ARGV layout) of an insert: the same until the registry of priority views changes."""
    keys = [*q.keys_of("insert"), *(q.keys.view_wake(*v) for v in q.views)]
    views = [f"{lo},{hi}" for lo, hi in q.views]
    return keys, layout(q, "insert", views_version=q.views_version, views=views)


def insert_args(q: Context, head: Layout, sent, forget=(), made="0", unique=None) -> list:
    """The ARGV of an insert of ``sent``, ``(Item, publish id)`` pairs (``item.lua_group``).
    ``made``: "0" (the items carry publish ids of their own, or none; "R" the same, the reply
    marking repeats), "1" (the first item's publish id was made here and stands for the call), or
    ``FIRST_SEND`` (the same, on the call's first send). ``unique``: {item index:
    ``UniqueKey.spec``} of the items with a unique key, or None."""
    entries: list = []
    alone = made in ("0", "R")  # else a made publish id stands for the whole call: the first group's
    for n, (item, pid) in enumerate(sent):
        entries += lua_group(item, q.rank(item.priority), pid if alone or not n else None)
    specs = [f"{i},{m},{ms},{r},{key}" for i, (m, ms, r, key) in sorted(unique.items())] if unique else []
    return head(*entries, forget=forget, made=made, unique=specs)


def inserted(reply) -> list[tuple[str, bool]]:
    """(entry id, repeated) of each item of an insert's reply (a repeat comes as [entry id], an
    item with a unique key as [entry id, outcome])."""
    return [(decode_id(e[0]), len(e) == 1) if isinstance(e, list) else (decode_id(e), False) for e in reply]


def insert_outcome(reply) -> tuple[str, str | None]:
    """(entry id, unique outcome) of a one-item insert's reply: the entry id standing for the
    item's unique key and its outcome ("stored", ...), or None without a key (or for a repeat)."""
    e = reply[0]
    if not isinstance(e, list):  # (an entry stored: the usual reply)
        return decode_id(e), None
    return decode_id(e[0]), as_text(e[1]) if len(e) > 1 else None


class Inserted(NamedTuple):
    """An insert's reply, read only as far as asked: a publish batch counts its items and
    repeats at each flush, and wants the entry ids only for a failed one (``exc.stored``)."""

    reply: list

    def __len__(self) -> int:
        return len(self.reply)

    @property
    def repeated(self) -> int:
        """Items stored before under their publish ids (``inserted``'s repeated)."""
        return sum(1 for e in self.reply if isinstance(e, list) and len(e) == 1)

    def ids(self) -> list[str]:
        """The entry ids, one per item."""
        return [eid for eid, _ in inserted(self.reply)]


# -- pop.lua, pop_fair.lua --------------------------------------------------------------------
def pop_layout(q: Context, count: int, lease_ms: int, consumer: str | None, ranks: tuple[int, int, int]) -> Layout:
    """The ARGV layout of a consumer's pops with these arguments (``Scripts.pop_call``); ``ranks``:
    the view's (lo, hi) and the worst rank to take. A fair pop leases at most FAIR_POP_MAX."""
    lo, hi, take_hi = ranks
    name, count = ("pop_fair", min(count, C.FAIR_POP_MAX)) if q.settings.fair else ("pop", count)
    return layout(q, name, lease_ms=lease_ms, consumer=consumer or "", count=count, lo=lo, hi=hi, take_hi=take_hi)


def ack_codes(reply) -> list[int]:
    """The codes of the acks a pop call carried (1 acked, or an ErrorCode value)."""
    return [int(c) for c in reply[3 : 3 + int(reply[1])]]


def due_in(reply) -> float | None:
    """A pop's (or a head peek's) ms until the queue's next delayed entry is due (0: due now),
    None when nothing is delayed; to the microsecond (includes/delays.lua)."""
    us = int(reply[2])
    return None if us < 0 else us / 1000


def _popped(reply) -> list:
    """(entry id, token, deliveries, score, value) of each lease of a pop's reply."""
    return [reply[i : i + 5] for i in range(3 + int(reply[1]), len(reply), 5)]


def popped_leases(q: Context, reply) -> list[Lease]:
    """The leases of a pop's reply."""
    leases = []
    for eid, token, d, score, value in _popped(reply):
        lease = entry_of(q, eid, score, value, Lease, token=as_text(token))
        lease.deliveries = int(d)
        leases.append(lease)
    return leases  # type: ignore[return-value]


def popped_deliveries(reply) -> list[Delivery]:
    """``popped_leases``, lean: ``Delivery`` tuples (the payload is what follows the entry's
    header, which is kept unparsed; the scripts return only entries they parsed)."""
    return [
        Delivery(decode_id(e), as_text(t), int(d), p[2], p[0])
        for e, t, d, _, v in _popped(reply)
        for p in (entry_parts(v),)  # (one assignment: Python compiles this as one)
    ]


# -- ack.lua, extend.lua (their ARGV: lease_pairs) ----------------------------------------------
def lease_codes(q: Context, pairs, codes, strict: bool) -> list[bool]:
    """True for each pair acked (renewed); False, or with ``strict`` the error, for the others."""
    if strict:
        for (eid, _), code in zip(pairs, codes):
            if code != 1:
                raise_for(code, q.name, entry_id=eid)
    return [code == 1 for code in codes]


# -- requeue.lua ------------------------------------------------------------------------------
def requeue_args(q: Context, eid: str, token: str, count_delivery: bool, reason: str) -> list:
    return q.layout("requeue")(
        eid=encode_id(eid), token=token, count_delivery=1 if count_delivery else 0, dead_reason=reason
    )


def requeued(code) -> tuple[str | None, bool]:
    """(``"waiting"``, ``"dead"`` or None when the lease was lost; whether the dead-letter
    queue dropped its oldest entry to make room)."""
    if code == 1:
        return "waiting", False
    if code in (2, 3):
        return "dead", code == 3
    return None, False


# -- reclaim.lua ------------------------------------------------------------------------------
def reclaim_args(
    q: Context,
    limit: int,
    guard_seconds: float,
    consumer: str,
    gap_seconds: float,
    restore_seconds: float,
    start: int,
) -> list:
    return q.layout("reclaim")(
        limit=limit,
        guard_ms=int(guard_seconds * 1000),
        consumer=consumer,
        gap_ms=int(gap_seconds * 1000),
        restore_ms=int(restore_seconds * 1000),
        start=start,
    )


#: A reclaim reply's fields, in order: a sweep's result but ``kept`` (leases of the consumer
#: looked at and kept).
RECLAIMED = ("returned", "dead", "skipped", "more", "promoted", "dead_dropped", "restored", "kept")


def reclaimed(reply) -> dict:
    """A reclaim reply by name."""
    return {name: int(v) for name, v in zip(RECLAIMED, reply)}


# -- replay.lua -------------------------------------------------------------------------------
#: Why replay left a dead letter where it is, by the code of its reply.
_REPLAY_REFUSED: dict[int, str] = {ErrorCode.NOT_FOUND: "missing", ErrorCode.NOT_WAITING: "leased"}


def add_replayed(out: dict, ids: Sequence[str], reply) -> None:
    """Sort one replay reply into ``out`` (replayed, missing, leased, refused)."""
    for i, r in zip(ids, reply):
        if not isinstance(r, int):
            out["replayed"][i] = decode_id(r)
        else:
            out[_REPLAY_REFUSED.get(r, "refused")].append(i)
