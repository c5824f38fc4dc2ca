"""What a queue answers, plain (``PriorityQueue``) or sharded (``ShardedQueue``), by who asks:
a producer, a consumer, an inspector (what operators read) and an operator (what they change).
A ``PriorityQueue`` is its own single shard (``shards == [q]``), so callers never tell the two
apart. ``Queue`` is all four, for a holder that does each (the channel)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .item import Item
from .values import Entry, Lease, Popped

if TYPE_CHECKING:
    import redis

    from .core import PriorityQueue
    from .settings import QueueSettings
    from .unique import UniqueKey


class Opened(Protocol):
    name: str
    client: redis.Redis
    settings: QueueSettings
    task_limits: dict[str, float]

    @property
    def shards(self) -> list[PriorityQueue]: ...

    @property
    def is_dead(self) -> bool: ...


class Producer(Opened, Protocol):
    def insert(
        self,
        item: Item | bytes | str,
        priority: int = 0,
        id: str | None = None,
        *,
        unique: UniqueKey | None = None,
        **options,
    ) -> Any: ...

    def insert_many(self, items: Any, *, chunk: int = ..., repeats: bool = False, remember: bool = True) -> Any: ...


class Consumer(Opened, Protocol):
    def pop(self, count: int = 1, *, acks=..., lean=False, lease_seconds=None, consumer=None, view=None) -> Popped: ...

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> Any: ...

    def register_view(self, lo: int, hi: int) -> Any: ...

    def ack(self, lease: Any, *, strict: bool = False) -> Any: ...

    def extend(self, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]: ...

    def requeue(self, lease: Lease, *, count_delivery: bool = True, strict: bool = False) -> str | None: ...

    def dead_letter(self, lease: Lease, reason: str = "rejected", *, strict: bool = False) -> str | None: ...

    def reclaim(self, **kwargs) -> dict: ...

    def exists(self, id: str) -> bool: ...


class Inspector(Opened, Protocol):
    @property
    def mode(self) -> dict: ...

    def stats(self) -> dict: ...

    def size(self) -> int: ...

    def backlog(self, view: tuple[int, int] | None = None) -> int: ...

    def counters(self) -> dict[str, int]: ...

    def peek(self, count: int = 1, tenant: str | None = None) -> list[Entry]: ...

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]: ...

    def leases(self, limit: int = 1000, *, id: str | None = None) -> list[dict]: ...

    def tenants(self) -> dict[str, dict]: ...

    def recorded(self) -> dict: ...


class Operator(Opened, Protocol):
    @property
    def dead(self) -> Any: ...

    def rank(self, priority: int) -> int: ...

    def remove(self, id: str) -> int: ...

    def change_priority(self, id: str, priority: int) -> None: ...

    def replay(self, ids: Sequence[str]) -> dict: ...

    def pause(self, tenant: str | None = None) -> bool: ...

    def resume(self, tenant: str | None = None) -> bool: ...

    def purge(self) -> int: ...

    def delete(self) -> None: ...

    def configure_tenants(self, *, weights=None, concurrency=None, rate=None, keep_task_rates=None) -> None: ...

    def set_event_log(self, cap: int | None) -> int: ...


class Queue(Producer, Consumer, Inspector, Operator, Protocol):
    """A queue held for everything (the channel's)."""
