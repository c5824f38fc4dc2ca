"""How each stored record of a queue is laid out (entry, dead-letter note, lease, pointer, tenant
member, mode): the Python twin of ``lua/includes/records.lua`` and ``fair.lua``, crossed by
tests/queue/test_records.py; docs/key-layout.md. A reader never raises on stored data:
``split_*`` give None, as the Lua readers give nil."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

from . import constants as C

#: fair_scope -> the letter a mode record and the scripts use.
FAIR_SCOPES = {"within_priority": "P", "tenant_first": "T"}
#: fair_cost -> the first letter of a fair queue's mode record ("0" is a plain queue's).
FAIR_COSTS = {"tasks": "1", "time": "2", "declared": "3"}

_ENTRY = re.compile(rb"(\d*),(\d+),([^,]*),([^,]*),([^,]*),(\d*)(?:,(\d*))?\Z")
_LEASE = re.compile(rb"([^,]*),([^,]*),(\d+),(\d*),([^,]*),([^,]*)\Z")


def _b(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class EntryHeader(NamedTuple):
    """The fields before an entry's ``|``, ``d,s,t,x,r,ts[,xp]`` (a named tuple: one per delivery)."""

    deliveries: int = 0
    score: int = 0
    tenant: bytes = b""  # escaped; b"" for none
    flags: bytes = b""
    dead_note: bytes = b""
    enqueued_ms: int = 0
    expires_ms: int = 0  # the expiry deadline; 0 for none


def split_entry(value) -> tuple[EntryHeader, bytes] | None:
    """An entry's header and payload, or None."""
    header, bar, payload = _b(value).partition(b"|")
    m = _ENTRY.match(header) if bar else None
    if m is None:
        return None
    d, s, t, x, r, ts, xp = m.groups()
    return EntryHeader(int(d or 0), int(s), t, x, r, int(ts or 0), int(xp or 0)), payload


def entry_parts(value) -> tuple[bytes, bytes, bytes]:
    """``(header, b"|", payload)`` of an entry the scripts parsed, the header left unparsed."""
    return _b(value).partition(b"|")


def join_entry(header: EntryHeader, payload) -> bytes:
    h = header
    head = b"%d,%d,%s,%s,%s,%d" % (h.deliveries, h.score, h.tenant, h.flags, h.dead_note, h.enqueued_ms)
    return head + (b",%d|" % h.expires_ms if h.expires_ms else b"|") + _b(payload)


def split_dead_note(note) -> tuple[str, int, int] | None:
    """(reason, ms, deliveries) of a dead-letter note, or None when there is none."""
    parts = _b(note).decode().split("@")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


def join_dead_note(reason: str, ms: int, deliveries: int) -> bytes:
    return f"{reason}@{ms}@{deliveries}".encode()


@dataclass(frozen=True)
class LeaseRecord:
    token: str
    consumer: str
    score: int
    deliveries: int
    flags: bytes
    tenant: bytes  # escaped


def split_lease(info) -> LeaseRecord | None:
    m = _LEASE.match(_b(info))
    if m is None:
        return None
    tok, c, s, d, x, t = m.groups()
    return LeaseRecord(tok.decode(), c.decode(), int(s), int(d or 0), x, t)


def join_lease(lease: LeaseRecord) -> bytes:
    r = lease
    return b"%s,%s,%d,%d,%s,%s" % (r.token.encode(), r.consumer.encode(), r.score, r.deliveries, r.flags, r.tenant)


def join_pointer(seq: int, eid: bytes) -> bytes:
    return struct.pack(">Q", seq)[2:] + eid


def split_pointer(p) -> tuple[int, bytes] | None:
    """(seq, entry id) of a pointer, or None."""
    p = _b(p)
    if len(p) < 7:
        return None
    return int.from_bytes(p[:6], "big"), p[6:]


def join_tenant_member(tenant: bytes, rank: int, seq: int, eid: bytes) -> bytes:
    return tenant + b"\0" + b"%03d%014d" % (rank, seq) + eid


def split_tenant_member(m) -> tuple[bytes, int, int, bytes] | None:
    """(escaped tenant, rank, seq, entry id) of a tenant-order member, or None."""
    tenant, sep, rest = _b(m).partition(b"\0")
    if not sep or len(rest) < 17 or not rest[:17].isdigit():
        return None
    return tenant, int(rest[:3]), int(rest[3:17]), rest[17:]


def publish_entry(value, given_id: bytes) -> bytes:
    """A publish id's stored value (of ``pd``/``pe``) as bytes, or ``given_id`` (the encoded id the
    insert gave) when it is ``""``; a whole call's packed ids (each behind a 2-byte length) as they are."""
    return _b(value) or given_id


def score(rank: int, seq: int) -> int:
    return rank * C.SEQ_SPAN + seq


def split_score(s) -> tuple[int, int]:
    """(rank, seq) of a score."""
    return divmod(int(float(s)), C.SEQ_SPAN)


def join_mode(fair: bool, fair_scope: str, priority_order: str, technique: str, fair_cost: str = "tasks") -> str:
    scope = FAIR_SCOPES[fair_scope] if fair else "-"
    return (
        f"{FAIR_COSTS[fair_cost] if fair else '0'}{scope}{'h' if priority_order == C.HIGHER_FIRST else 'l'}{technique}"
    )


def split_switches(mode: str) -> tuple[bool, int]:
    """(paused, event-log cap or 0) of a mode record's switches: ``p``, ``e<cap>``, ``m``."""
    rest = mode[4:]
    m = re.search(r"e(\d+)", rest)
    return "p" in rest, int(m.group(1)) if m else 0


def mode_dict(mode: str) -> dict:
    """A mode record's four letters (fair with its cost ``1`` tasks / ``2`` time / ``3`` declared or
    ``0`` plain, scope ``P``/``T``/``-``, order ``h``/``l``, technique) as settings."""
    scopes = {v: k for k, v in FAIR_SCOPES.items()}
    costs = {v: k for k, v in FAIR_COSTS.items()}
    return {
        "fair": mode[:1] in costs,
        "fair_scope": scopes.get(mode[1:2]),
        "fair_cost": costs.get(mode[:1]),
        "priority_order": C.HIGHER_FIRST if mode[2:3] == "h" else C.LOWER_FIRST,
        "technique": mode[3:4],
    }
