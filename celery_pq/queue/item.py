"""One entry to insert, the one shape every insert takes (``insert``, ``insert_many``, a
producer's batch, the Spark writer, a sharded queue), checked when made, and the one function
that lays it out as the insert script's arguments (``lua_group``)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from ..storage.checks import seconds
from ..storage.ids import encode_id
from .values import MAX_DUE_MS, as_bytes, escape_tenant, validate_priority


def _unix_ms(label: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DUE_MS:
        raise ValueError(f"{label} must be a Unix time in milliseconds, 0..{MAX_DUE_MS}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Item:
    """An entry to insert: ``payload`` at ``priority`` (0..255) with entry id ``id`` (None: the
    queue numbers it), and by keyword: ``tenant`` (a fair queue's), ``due_ms`` (Unix ms) or
    ``delay`` (seconds from now, Redis clock) to keep it delayed, ``publish_id`` (stored once
    however often it is sent within ``dedupe_seconds``), ``task`` (the name the event log gives),
    ``expires_ms`` (Unix ms) or ``ttl`` (seconds), the earlier one the deadline past which no pop
    delivers it, ``cost`` (a queue with ``fair_cost="declared"`` charges its tenant this much:
    ``MIN_COST``..``MAX_COST``, None for 1). ValueError names a bad value."""

    payload: bytes | str  # (kept as bytes)
    priority: int = 0
    id: str | None = None
    _: KW_ONLY
    tenant: str | None = None
    due_ms: int | None = None
    delay: float | None = None
    publish_id: bytes | None = None
    task: str | None = None
    expires_ms: int | None = None
    ttl: float | None = None
    cost: float | None = None

    def __post_init__(self):
        keep = object.__setattr__  # frozen: a str payload or publish id is kept as bytes, once
        if type(self.payload) is not bytes:
            if not isinstance(self.payload, (bytes, str)):
                raise ValueError(f"payload must be bytes or str, got {type(self.payload).__name__}")
            keep(self, "payload", as_bytes(self.payload))
        validate_priority(self.priority)
        if self.id is not None and (type(self.id) is not str or not self.id):
            raise ValueError(f"entry id must be a non-empty string or None, got {self.id!r}")
        if self.tenant is not None and type(self.tenant) is not str:
            raise ValueError(f"tenant must be a string or None, got {self.tenant!r}")
        pid = self.publish_id
        if pid is not None and (type(pid) is not bytes or not pid):
            if not isinstance(pid, (bytes, str)) or not pid:
                raise ValueError(f"publish_id must be non-empty bytes or str, got {pid!r}")
            keep(self, "publish_id", as_bytes(pid))
        if self.task is not None and type(self.task) is not str:
            raise ValueError(f"task must be a task name (str) or None, got {self.task!r}")
        if self.due_ms is not None:
            if self.delay is not None:
                raise ValueError("give delay or due_ms, not both")
            _unix_ms("due_ms", self.due_ms)
        elif self.delay is not None:
            seconds("delay", self.delay, zero=True)
        if self.expires_ms is not None:
            _unix_ms("expires_ms", self.expires_ms)
        if self.ttl is not None:
            seconds("ttl", self.ttl, zero=True)
        if self.cost is not None:
            keep(self, "cost", check_cost(self.cost))


#: A declared cost (``fair_cost="declared"``) from this ...
MIN_COST = 0.001
#: ... to this (one delivery counted by tasks is worth 10; the finish tags must stay below 2^53).
MAX_COST = 10_000


def check_cost(cost) -> float:
    """A declared cost, checked: a positive number, ``MAX_COST`` at most (ValueError)."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not MIN_COST <= cost <= MAX_COST:
        raise ValueError(f"cost must be a number from {MIN_COST} to {MAX_COST}, got {cost!r}")
    return float(cost)


def lua_group(item: Item, rank: int, publish_id: bytes | None) -> list:
    """The item's group of the insert script's ARGV (its header: id, rank, tenant, payload, due,
    publish id, task, expires, cost), at ``rank``, under ``publish_id`` (the item's, or one made for
    the call). Due: "0" now, "+<ms>" from Redis's now, or absolute Unix ms; expires: "" none,
    absolute Unix ms, "+<ms>" from Redis's now, or "<abs>+<ms>" (the earlier of the two)."""
    due = "0" if item.delay is None else f"+{int(float(item.delay) * 1000)}"
    expires = "" if item.expires_ms is None else str(item.expires_ms)
    if item.ttl is not None:
        expires += f"+{max(0, int(float(item.ttl) * 1000))}"
    return [
        encode_id(item.id) if item.id else "",
        rank,
        escape_tenant(item.tenant) if item.tenant else "",
        item.payload,
        due if item.due_ms is None else str(item.due_ms),
        publish_id or "",
        item.task or "",
        expires,
        "" if item.cost is None else f"c{item.cost:.3f}".rstrip("0").rstrip("."),
    ]
