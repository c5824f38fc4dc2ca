"""What operators do on purpose (migrate the mode, purge, delete, replay dead letters, pause and
resume, the event log's switch) and the patent's operations by id and priority (remove by id,
remove highest priority, change priority, the lazy deletion's clean-up sweep)."""

from __future__ import annotations

from collections.abc import Sequence

from ..storage import constants as C
from ..storage.checks import count as _count
from ..storage.checks import text as _text
from ..storage.errors import ConfigError, raise_for
from ..storage.ids import encode_id
from . import calls
from .scripts import Scripts
from .values import Entry, escape_tenant


def migrate_mode(s: Scripts, *, step: int = C.MIGRATE_STEP) -> dict:
    """Change the queue's mode to this object's: the priority index and the fairness state are
    rebuilt from the stored entries (leases kept), in script calls of ``step`` entries. Meanwhile
    other calls answer ``QueueMigrating`` (the queue API waits them out, up to
    ``C.MIGRATION_WAIT`` s) but lease renewals go on; calling it again with the same mode finishes
    a migration that stopped half way. Returns {"waiting": n, "leased": n, "malformed": n}."""
    _count("step", step, low=1, none=False)
    total = [0, 0, 0]
    while True:
        waiting, leased, bad, done = s.run("migrate", step=step)
        for i, n in enumerate((waiting, leased, bad)):
            total[i] += int(n)
        if int(done):
            return {"waiting": total[0], "leased": total[1], "malformed": total[2]}


def purge(s: Scripts) -> int:
    """Delete every waiting entry (leased ones stay leased); returns how many."""
    total = 0
    while True:
        deleted, taken = s.run("purge", count=C.STEP_CHUNK)
        total += int(deleted)
        if not taken:
            return total


def delete(s: Scripts) -> None:
    """Drop every key of this queue (waiting and leased entries alike)."""
    s.client.delete(*s.keys.all())


def replay(s: Scripts, ids: Sequence[str]) -> dict:
    """Dead letters (by the ids ``<queue>.dead`` shows) back to this queue, each atomically, the
    delivery count reset: ``{"replayed": {dead id: live id}, "missing": [...], "leased": [...],
    "refused": [...]}``; refused ones stay dead (``max_length`` reached)."""
    if s.is_dead:
        raise ValueError(f"{s.name!r} is a dead-letter queue: replay its live queue")
    ids = list(ids)
    for i in ids:
        _text("id", i)
    out: dict = {"replayed": {}, "missing": [], "leased": [], "refused": []}
    for start in range(0, len(ids), C.STEP_CHUNK):
        part = ids[start : start + C.STEP_CHUNK]
        calls.add_replayed(out, part, s.run("replay", s.layout("replay")(*map(encode_id, part))))
    return out


def pause(s: Scripts, tenant: str | None = None) -> bool:
    """Stop delivering the queue (or a fair queue's tenant); inserts go on. True if not paused yet."""
    return _set_paused(s, True, tenant)


def resume(s: Scripts, tenant: str | None = None) -> bool:
    """Deliver again what ``pause`` held back, idle consumers woken at once. True if it was paused."""
    return _set_paused(s, False, tenant)


def _set_paused(s: Scripts, paused: bool, tenant: str | None) -> bool:
    if tenant is not None:
        _text("tenant", tenant)
        if not s.settings.fair:
            raise ConfigError(
                f"queue {s.name!r} is not fair: only a fair queue pauses one tenant "
                f"(pause the whole queue with tenant=None)"
            )
    return bool(s.run("pause", paused="1" if paused else "0", tenant=escape_tenant(tenant or "")))


def set_event_log(s: Scripts, cap: int | None) -> int:
    """Switch the queue's event log on with this cap, or off with None/0 (the stream is kept), for
    every process (one whose own ``event_log`` is set turns it on again); returns the old cap."""
    _count("event_log", cap, low=0)
    return int(s.run("event_log", cap=int(cap or 0)))


def remove(s: Scripts, id: str) -> int:
    """REMOVE BY ID of waiting entries with this id or duplicates of it; returns how many."""
    _text("id", id)
    total, cursor = 0, ""
    while True:
        removed, _leased, cursor = s.run("remove", id=encode_id(id), cursor=cursor, step=C.STEP_CHUNK)
        total += int(removed)
        if not cursor:
            return total


def remove_highest_priority(s: Scripts) -> Entry | None:
    """REMOVE HIGHEST PRIORITY: take the next entry and delete it, with no lease."""
    if s.settings.fair:
        raise ValueError("remove_highest_priority takes no tenant turn; use pop and ack on a fair queue")
    reply = s.run("remove_highest")
    return calls.entry_of(s, *reply) if reply else None


def cleanup(s: Scripts, count: int = 1000) -> int:
    """Lazy deletion's clean-up sweep: up to ``count`` pointers of each priority, from where the
    last sweep stopped, the stale ones dropped; returns how many."""
    removed = 0
    for rank in s.client.zrange(s.keys.priority_index, 0, -1):
        seen = 0
        while seen < count:
            n = min(C.COMPACT_STEP, count - seen)
            gone, looked, more = s.run("cleanup", rank=int(rank), count=n)
            removed += int(gone)
            seen += int(looked)
            if not more or not looked:
                break
    return removed


def change_priority(s: Scripts, id: str, priority: int) -> None:
    """Move a waiting entry to ``priority``, behind the entries already waiting there."""
    _text("id", id)
    code = s.run("change_priority", eid=encode_id(id), rank=s.rank(priority))
    raise_for(code, s.name, entry_id=id)
