"""What every queue answers, plain or sharded: ``Queue``. A ``PriorityQueue`` is its own single
shard (``shards == [q]``), so callers never tell the two apart: they pop with
``q.pop_with_acks`` and walk ``q.shards`` either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from .values import Entry, InsertOptions, Lease, Popped

if TYPE_CHECKING:
    import redis

    from ..scripts import Flight
    from .core import PriorityQueue
    from .unique import PublishOutcome, UniqueKey


class Queue(Protocol):
    """A queue as its callers use it (see ``PriorityQueue`` for each method)."""

    name: str
    client: redis.Redis
    key_prefix: str
    fair: bool
    fair_scope: str
    technique: str
    priority_order: str
    lease_seconds: float
    max_deliveries: int
    is_dead: bool
    task_limits: dict[str, float]

    @property
    def shards(self) -> list[PriorityQueue]: ...

    @property
    def mode(self) -> dict: ...

    @property
    def dead(self) -> Queue: ...

    # -- writes -----------------------------------------------------------------------------
    def insert(self, payload: bytes | str, priority: int = 0, **options: Unpack[InsertOptions]) -> str: ...

    def insert_many(self, items: Any, *, chunk: int = ..., repeats: bool = False, remember: bool = True) -> Any: ...

    def insert_unique(
        self, payload: bytes | str, priority: int = 0, *, unique: UniqueKey, **options: Unpack[InsertOptions]
    ) -> PublishOutcome: ...

    def pop(
        self,
        count: int = 1,
        *,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> Popped[Lease]: ...

    def send_pop(
        self,
        count: int = 1,
        *,
        acks: Sequence[tuple[str, str]] = (),
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> Flight | None: ...

    def pop_with_acks(
        self,
        count: int = 1,
        *,
        acks: dict | None = None,
        lean: bool = False,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> tuple[Popped, dict]: ...

    def ack(self, lease: Lease, *, strict: bool = False) -> bool: ...

    def ack_many(self, leases: Sequence[Lease], *, strict: bool = False) -> list[bool]: ...

    def extend(
        self, leases: Sequence[Lease], lease_seconds: float | None = None, *, strict: bool = False
    ) -> list[bool]: ...

    def requeue(self, lease: Lease, *, count_delivery: bool = True, strict: bool = False) -> str | None: ...

    def dead_letter(self, lease: Lease, reason: str = "rejected", *, strict: bool = False) -> str | None: ...

    def reclaim(
        self,
        *,
        limit: int = ...,
        guard_seconds: float = 0.0,
        consumer: str = "",
        gap_seconds: float = 0.0,
        restore_seconds: float = 0.0,
    ) -> dict: ...

    # -- by id, admin -----------------------------------------------------------------------
    def exists(self, id: str) -> bool: ...

    def remove(self, id: str) -> int: ...

    def change_priority(self, id: str, priority: int) -> None: ...

    def replay(self, ids: Sequence[str]) -> dict: ...

    def pause(self, tenant: str | None = None) -> bool: ...

    def resume(self, tenant: str | None = None) -> bool: ...

    def purge(self) -> int: ...

    def delete(self) -> None: ...

    def register_view(self, lo: int, hi: int) -> Any: ...

    def refresh_views(self) -> None: ...

    def configure_tenants(
        self, *, weights: dict | None = None, concurrency: dict | None = None, rate: dict | None = None
    ) -> None: ...

    def set_event_log(self, cap: int | None) -> int: ...

    # -- reads ------------------------------------------------------------------------------
    def lease_of(self, id: str) -> dict | None: ...

    def leases(self, limit: int = 1000) -> list[dict]: ...

    def peek(self, count: int = 1) -> list[Entry]: ...

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]: ...

    def peek_tenant(self, tenant: str, count: int = 10) -> list[Entry]: ...

    def retrieve_highest_priority(self) -> str | None: ...

    def size(self) -> int: ...

    def backlog(self, view: tuple[int, int] | None = None) -> int: ...

    def counters(self) -> dict[str, int]: ...

    def tenant_deliveries(self) -> dict[str, int]: ...

    def held_tenants(self, paused: dict | None = None) -> dict[str, str]: ...

    def paused(self) -> dict: ...

    def stats(self) -> dict: ...

    def event_log_cap(self) -> int: ...

    def stored_mode(self) -> dict | None: ...

    def rank(self, priority: int) -> int: ...

    def priority_of_rank(self, rank: int) -> int: ...
