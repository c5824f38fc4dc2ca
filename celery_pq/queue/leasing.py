"""What becomes of a lease: ack (done), extend (renewed), requeue (given back), dead_letter
(given up), and the sweep that returns the leases that expired (reclaim)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from .. import constants as C
from ..checks import seconds as _seconds
from ..errors import QueueMigrating, raise_for
from . import calls
from .base import QueueBase
from .calls import ScriptCall
from .running import run_acks, wait_out_migration
from .values import Lease, lease_pair, lease_pairs

logger = logging.getLogger("celery_pq.queue")


class QueueLeases(QueueBase):
    """The lease side of a queue: what its holder (or the sweep) does with a lease."""

    def _lease_ms(self, lease_seconds) -> int:
        if lease_seconds is None:
            return int(1000 * self.lease_seconds)
        return int(1000 * float(_seconds("lease_seconds", lease_seconds) or 0))

    # -- ACK, renew, give back ------------------------------------------------------------------
    def ack(self, lease: Lease | tuple[str, str], *, strict: bool = False) -> bool:
        """Done: delete the entry. False (or LeaseLost with strict) if the lease was lost."""
        return self.ack_many([lease], strict=strict)[0]

    def ack_many(self, leases: Sequence, *, strict: bool = False) -> list[bool]:
        """Ack several leases in one script call."""
        pairs = lease_pairs(leases)
        if not pairs:
            return []
        (codes,) = wait_out_migration(lambda: run_acks(self.client, [self.ack_call(pairs)], [self]))
        return calls.lease_codes(self, pairs, codes, strict)

    def ack_call(self, pairs: Sequence[tuple[str, str]]) -> ScriptCall:
        """The call acking ``(entry id, token)`` pairs, to run with others."""
        return self.call("ack", self.keys_of("ack"), calls.ack_args(self, pairs))

    def extend(self, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]:
        """Renew leases for ``lease_seconds`` from now (Redis clock)."""
        pairs = lease_pairs(leases)
        lease_ms = self._lease_ms(lease_seconds)
        if not pairs:
            return []
        codes = self.scripts.extend(
            keys=self.keys_of("extend"), args=calls.extend_args(self, lease_ms, pairs), client=self.client
        )
        return calls.lease_codes(self, pairs, codes, strict)

    def requeue(
        self, lease: Lease | tuple[str, str], *, count_delivery: bool = True, strict: bool = False
    ) -> str | None:
        """Back to Waiting at its original place; ``"dead"`` when max_deliveries is used up.

        ``count_delivery=False`` undoes the delivery (a consumer giving back work it never
        started). Returns ``"waiting"``, ``"dead"``, or None when the lease was lost.
        """
        return self._requeue(lease, count_delivery, "", strict)

    def dead_letter(
        self, lease: Lease | tuple[str, str], reason: str = "rejected", *, strict: bool = False
    ) -> str | None:
        """Move a leased entry to ``<queue>.dead`` now, with a reason (no "," "@" "|")."""
        if self.is_dead:
            raise ValueError(
                f"{self.name!r} is a dead-letter queue: it has no dead-letter queue of its own "
                "(requeue the entry, or ack it to drop it)"
            )
        if not isinstance(reason, str) or not reason or any(c in reason for c in ",@|"):
            raise ValueError(f"dead-letter reason must be non-empty without ',', '@' or '|': {reason!r}")
        return self._requeue(lease, True, reason, strict)

    def _requeue(self, lease, count_delivery: bool, reason: str, strict: bool) -> str | None:
        eid, token = lease_pair(lease)
        code = self.run("requeue", calls.requeue_args(self, eid, token, count_delivery, reason))
        state, dropped = calls.requeued(code)
        if dropped:
            self._warn_dropped(1)
        if state is None and strict:
            raise_for(code, self.name, entry_id=eid)
        return state

    def reclaim(
        self,
        *,
        limit: int = C.SWEEP_BATCH,
        guard_seconds: float = 0.0,
        consumer: str = "",
        gap_seconds: float = 0.0,
        restore_seconds: float = 0.0,
    ) -> dict:
        """The sweep: expired leases (or all leases of ``consumer``) back to Waiting or to the
        dead-letter queue; delayed entries that are due into the queue.

        With ``guard_seconds`` > 0, runs only if no other caller swept in that interval. With
        ``gap_seconds`` > 0, a sweep that comes more than that long after the last one (Redis
        was paused or down) first gives each lease that expired in between the time it had left
        (``restored``), so that its holder can renew it; at least ``restore_seconds`` from now
        (pass the lease length: the deadline then counts from now, when the holder can reach
        Redis again).

        A consumer's leases are looked for ``limit`` at a time, one script call each (the work of
        one call is bounded, however many leases other consumers hold); this returns when all
        were looked at. While the queue's mode is being migrated a sweep is skipped (it does not
        wait: the thread that sweeps also renews leases); a consumer's recovery waits.
        """
        total: Counter = Counter()
        start = 0
        while True:
            try:
                r = calls.reclaimed(
                    self.run(
                        "reclaim",
                        calls.reclaim_args(self, limit, guard_seconds, consumer, gap_seconds, restore_seconds, start),
                        wait=bool(consumer),
                    )
                )
            except QueueMigrating:
                return dict(calls.RECLAIM_SKIPPED)
            total.update({k: r[k] for k in ("returned", "dead", "promoted", "dropped", "restored")})
            if not consumer or not r["more"]:
                break
            start += r["kept"]
        if total["dropped"]:
            self._warn_dropped(total["dropped"])
        return {
            "returned": total["returned"],
            "dead": total["dead"],
            "skipped": bool(r["skipped"]),
            "more": bool(r["more"]) and not consumer,
            "promoted": total["promoted"],
            "dead_dropped": total["dropped"],
            "restored": total["restored"],
        }

    def _warn_dropped(self, n: int) -> None:
        logger.warning(
            "celery-pq: dead-letter queue %s.dead is full (max_dead_length=%s): its %d oldest "
            "entr%s dropped to make room",
            self.name,
            self.max_dead_length or self.max_length,
            n,
            "y was" if n == 1 else "ies were",
        )
