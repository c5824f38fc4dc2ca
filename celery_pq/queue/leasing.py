"""What becomes of a lease (docs/leases.md): ack (done), extend (renewed), requeue (given back),
dead_letter (given up), and the sweep that returns the leases that expired (reclaim)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..storage import constants as C
from ..storage.errors import QueueMigrating, raise_for
from . import calls
from .running import run_acks, wait_out_migration
from .scripts import Scripts
from .values import lease_pair

logger = logging.getLogger("celery_pq.queue")


def ack(s: Scripts, lease, *, strict: bool = False) -> Any:
    pairs = [lease_pair(x) for x in lease] if isinstance(lease, list) else [lease_pair(lease)]
    if not pairs:
        return []
    (codes,) = wait_out_migration(lambda: run_acks(s.client, [s.ack_call(pairs)], [s]))
    done = calls.lease_codes(s, pairs, codes, strict)
    return done if isinstance(lease, list) else done[0]


def extend(s: Scripts, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]:
    """Renew leases for ``lease_seconds`` (default: the queue's) from now, Redis clock."""
    pairs = [lease_pair(x) for x in leases]
    lease_ms = s.lease_ms(lease_seconds)
    if not pairs:
        return []
    args = s.layout("extend")(*calls.lease_pairs(pairs), lease_ms=lease_ms)
    codes = s.run("extend", args, wait=False)  # (renewals go on in a migration)
    return calls.lease_codes(s, pairs, codes, strict)


def requeue(s: Scripts, lease, *, count_delivery: bool = True, strict: bool = False) -> str | None:
    """Back to waiting at its place: ``"waiting"``, ``"dead"`` (max_deliveries used up) or
    None (the lease was lost). ``count_delivery=False`` undoes the delivery."""
    return _moved(s, lease, count_delivery, "", strict)


def _moved(s: Scripts, lease, count_delivery: bool, reason: str, strict: bool) -> str | None:
    """Back to waiting (``reason`` empty) or dead-lettered with ``reason``."""
    eid, token = lease_pair(lease)
    code = s.run("requeue", calls.requeue_args(s, eid, token, count_delivery, reason))
    state, dropped = calls.requeued(code)
    if dropped:
        _warn_dropped(s, 1)
    if state is None and strict:
        raise_for(code, s.name, entry_id=eid)
    return state


def dead_letter(s: Scripts, lease, reason: str = "rejected", *, strict: bool = False) -> str | None:
    """To ``<name>.dead`` now, with ``reason`` (no "," "@" "|")."""
    if s.is_dead:
        raise ValueError(
            f"{s.name!r} is a dead-letter queue: it has no dead-letter queue of its own "
            "(requeue the entry, or ack it to drop it)"
        )
    if not isinstance(reason, str) or not reason or any(c in reason for c in ",@|"):
        raise ValueError(f"dead-letter reason must be non-empty without ',', '@' or '|': {reason!r}")
    return _moved(s, lease, True, reason, strict)


def reclaim(
    s: Scripts, *, limit=C.SWEEP_BATCH, guard_seconds=0.0, consumer="", gap_seconds=0.0, restore_seconds=0.0
) -> dict:
    """The sweep: expired leases (or all of ``consumer``'s, ``limit`` at a time) back to waiting or
    dead, due delayed entries in; skipped while the mode is migrated. ``guard_seconds``: only if
    nobody swept that recently; ``gap_seconds``: after a longer gap, leases that expired meanwhile
    get at least ``restore_seconds`` again (docs/leases.md, "Recovery")."""
    total: Counter = Counter()
    start = 0
    while True:
        args = calls.reclaim_args(s, limit, guard_seconds, consumer, gap_seconds, restore_seconds, start)
        try:
            r = calls.reclaimed(s.run("reclaim", args, wait=bool(consumer)))
        except QueueMigrating:  # a sweep that did nothing
            return {**dict.fromkeys(calls.RECLAIMED[:-1], 0), "skipped": True, "more": False}
        total.update(r)
        if not consumer or not r["more"]:
            break
        start += r["kept"]
    if total["dead_dropped"]:
        _warn_dropped(s, total["dead_dropped"])
    sums = {k: total[k] for k in calls.RECLAIMED[:-1]}
    return {**sums, "skipped": bool(r["skipped"]), "more": bool(r["more"]) and not consumer}


def _warn_dropped(s: Scripts, n: int) -> None:
    logger.warning(
        "celery-pq: dead-letter queue %s.dead is full (max_dead_length=%s): its %d oldest entr%s dropped to make room",
        s.name,
        s.settings.max_dead_length or s.settings.max_length,
        n,
        "y was" if n == 1 else "ies were",
    )
