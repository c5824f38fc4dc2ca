"""What becomes of a lease (docs/leases.md): ack (done), extend (renewed), requeue (given back),
dead_letter (given up), and the sweep that returns the leases that expired (reclaim)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from ..storage.errors import QueueMigrating, raise_for
from . import calls
from .running import run_acks, wait_out_migration
from .scripts import Scripts
from .values import lease_pair, lease_pairs

logger = logging.getLogger("celery_pq.queue")


def ack_many(s: Scripts, leases: Sequence, strict: bool) -> list[bool]:
    pairs = lease_pairs(leases)
    if not pairs:
        return []
    (codes,) = wait_out_migration(lambda: run_acks(s.client, [s.ack_call(pairs)], [s]))
    return calls.lease_codes(s, pairs, codes, strict)


def extend(s: Scripts, leases: Sequence, lease_seconds: float | None, strict: bool) -> list[bool]:
    pairs = lease_pairs(leases)
    lease_ms = s.lease_ms(lease_seconds)
    if not pairs:
        return []
    script, keys, args = s.call("extend", s.keys_of("extend"), calls.extend_args(s, lease_ms, pairs))
    return calls.lease_codes(s, pairs, script(keys=keys, args=args, client=s.client), strict)


def requeue(s: Scripts, lease, count_delivery: bool, reason: str, strict: bool) -> str | None:
    """Back to waiting (``reason`` empty) or to the dead-letter queue with ``reason``."""
    eid, token = lease_pair(lease)
    code = s.run("requeue", calls.requeue_args(s, eid, token, count_delivery, reason))
    state, dropped = calls.requeued(code)
    if dropped:
        _warn_dropped(s, 1)
    if state is None and strict:
        raise_for(code, s.name, entry_id=eid)
    return state


def dead_letter(s: Scripts, lease, reason: str, strict: bool) -> str | None:
    if s.is_dead:
        raise ValueError(
            f"{s.name!r} is a dead-letter queue: it has no dead-letter queue of its own "
            "(requeue the entry, or ack it to drop it)"
        )
    if not isinstance(reason, str) or not reason or any(c in reason for c in ",@|"):
        raise ValueError(f"dead-letter reason must be non-empty without ',', '@' or '|': {reason!r}")
    return requeue(s, lease, True, reason, strict)


def reclaim(s: Scripts, limit, guard_seconds, consumer, gap_seconds, restore_seconds) -> dict:
    """``PriorityQueue.reclaim``: a consumer's leases are looked at ``limit`` at a time, one
    script call each, until all were; a sweep is skipped while the queue's mode is migrated."""
    total: Counter = Counter()
    start = 0
    while True:
        args = calls.reclaim_args(s, limit, guard_seconds, consumer, gap_seconds, restore_seconds, start)
        try:
            r = calls.reclaimed(s.run("reclaim", args, wait=bool(consumer)))
        except QueueMigrating:
            return dict(calls.RECLAIM_SKIPPED)
        total.update({k: r[k] for k in ("returned", "dead", "promoted", "dropped", "restored")})
        if not consumer or not r["more"]:
            break
        start += r["kept"]
    if total["dropped"]:
        _warn_dropped(s, total["dropped"])
    return {
        "returned": total["returned"],
        "dead": total["dead"],
        "skipped": bool(r["skipped"]),
        "more": bool(r["more"]) and not consumer,
        "promoted": total["promoted"],
        "dead_dropped": total["dropped"],
        "restored": total["restored"],
    }


def _warn_dropped(s: Scripts, n: int) -> None:
    logger.warning(
        "celery-pq: dead-letter queue %s.dead is full (max_dead_length=%s): its %d oldest entr%s dropped to make room",
        s.name,
        s.settings.max_dead_length or s.settings.max_length,
        n,
        "y was" if n == 1 else "ies were",
    )
