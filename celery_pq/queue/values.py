"""What a queue hands out (entries, leases, deliveries, a pop's result) and the small pure
conversions of ids, tenants and priorities every layer of the queue shares."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import unquote

from ..storage import constants as C

#: The counters the scripts keep in a queue's hash ct (``PriorityQueue.counters``; docs/events.md).
COUNTERS = (
    "enqueued",
    "delivered",
    "redelivered",
    "acked",
    "requeued",
    "lease_expired",
    "dead_lettered",
    "removed",
    "refused_full",
    "expired",
    "unique_merged",
    "unique_replaced",
    "unique_debounced",
    "unique_throttled",
)

#: The fields of an event-log entry, in order (docs/events.md), and those read as integers.
EVENT_FIELDS = ("e", "q", "id", "p", "k", "t", "c", "task", "n", "r", "ms")
EVENT_INTS = frozenset(("p", "k", "n", "ms", "h"))

#: The latest due time an insert takes: the end of year 9999 (Unix ms, below 2**53).
MAX_DUE_MS = 253_402_300_799_999

#: Units of virtual time a delivery costs a tenant of weight 1 (fair.lua's VT_UNIT); one of
#: weight w moves on by round(VT_PER_DELIVERY / w) units per delivery.
VT_PER_DELIVERY = 1_000_000
#: Fair weights the 17-digit start tags can carry: above 10,000 the cost of a delivery rounds
#: toward nothing, below 0.01 the tags run out of digits after 1e9 deliveries.
MIN_WEIGHT, MAX_WEIGHT = 0.01, 10_000
#: The rates a tenant may be given, deliveries per second: one per 1,000 s at the least; beyond a
#: million a rate limits nothing.
MIN_RATE, MAX_RATE = 0.001, 1_000_000


@dataclass
class Entry:
    """A waiting (or dead-lettered) entry, as peek and retrieve return it."""

    queue: str
    id: str
    priority: int
    payload: bytes
    deliveries: int
    tenant: str | None
    enqueued_ms: int
    dead_reason: str | None = None
    dead_ms: int | None = None
    #: Deliveries before it was dead-lettered (entries of a dead-letter queue only).
    dead_deliveries: int | None = None
    #: Its expiry deadline (Unix ms, Redis clock), past which no pop delivers it; None: none.
    expires_ms: int | None = None


@dataclass
class Lease(Entry):
    """A delivered entry, leased to one consumer until acked, requeued or expired."""

    token: str = ""


class Delivery(NamedTuple):
    """A leased entry as a lean ``pop`` gives it (the transport's): a ``Lease`` without the fields
    of the entry's header (priority, tenant, times), not parsed for it; ``head`` is the header as
    stored (docs/key-layout.md; ``storage.records.split_entry`` reads it)."""

    id: str
    token: str
    deliveries: int
    payload: bytes
    head: bytes = b""


#: What one pop holds: ``Lease`` objects, or ``Delivery`` tuples for a lean pop.
Held = TypeVar("Held", bound=Lease | Delivery)


class Popped(list[Held], Generic[Held]):
    """The leases one pop took, in delivery order."""

    def __init__(self, items: Iterable[Held] = (), queue: Any = None, due_in: float | None = None):
        super().__init__(items)
        self.acked: Any = []  # ack codes: a list, or by queue for acks of several queues
        self.queue: Any = queue  # the PriorityQueue (a shard) they came from
        #: ms until the queue's next delayed entry is due as the pop saw it (0: due now), None
        #: when nothing is delayed: what bounds an idle consumer's wait (docs/views-and-delays.md)
        self.due_in = due_in


def validate_priority(priority) -> int:
    """An integer 0..255, or ValueError naming the value."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer 0..255, got {priority!r} ({type(priority).__name__})")
    if not C.MIN_PRIORITY <= priority <= C.MAX_PRIORITY:
        raise ValueError(f"priority {priority} is out of range {C.MIN_PRIORITY}..{C.MAX_PRIORITY}")
    return priority


_TENANT_UNSAFE = frozenset("%,|") | {chr(i) for i in range(32)}
_TENANT_UNSAFE_RE = re.compile(f"[{re.escape(''.join(sorted(_TENANT_UNSAFE)))}]")  # (the same set, one search)


def escape_tenant(tenant: str) -> str:
    """No ",", "|" or control characters (the entry header and the fairness index use them)."""
    if not _TENANT_UNSAFE_RE.search(tenant):  # (the usual tenant: nothing to escape)
        return tenant
    return "".join(f"%{ord(c):02X}" if c in _TENANT_UNSAFE else c for c in tenant)


def unescape_tenant(text: str) -> str:
    return unquote(text)


def default_consumer_id() -> str:
    host = socket.gethostname().replace(",", "_")
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def as_text(value) -> str:
    """A reply's bytes (or anything else) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value) -> bytes:
    """A payload or id as bytes."""
    return value if isinstance(value, bytes) else str(value).encode()


def mark_stored(exc: BaseException, stored: list, items: list) -> None:
    """Tell on ``exc`` of a failed bulk insert what was stored (``exc.stored``: an entry id or None
    per item) and which items are not known to be (``exc.items``)."""
    vars(exc).update(stored=stored, items=items)


def lease_pair(x) -> tuple[str, str]:
    """(entry id, token) of a Lease or of such a pair, checked."""
    if isinstance(x, Lease):
        return x.id, x.token
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(v, str) and v for v in x):
        raise ValueError(f"a lease is a Lease or an (entry id, token) pair of non-empty strings, got {x!r}")
    return x[0], x[1]
