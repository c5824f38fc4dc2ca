"""celery-pq: a prioritized, fair, lease-based Celery broker on Redis (docs/index.md).

Importing this package registers the ``pq://`` and ``pqs://`` URL schemes with kombu.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from .queue import Entry, Item, Lease, PriorityQueue, ShardedQueue
from .storage.errors import (
    ClusterUnsettled,
    ConfigError,
    EntryNotFound,
    ErrorCode,
    LeaseLost,
    MessageTooLarge,
    ModeMismatch,
    NotReplicated,
    NotWaiting,
    PQError,
    QueueFull,
    QueueMigrating,
)
from .transport.channel import Channel
from .transport.unique import PublishOutcome, UniqueKey, publish_outcome

__version__ = "0.1.0"

TRANSPORT_ALIASES.setdefault("pq", "celery_pq.transport:Transport")
TRANSPORT_ALIASES.setdefault("pqs", "celery_pq.transport:TLSTransport")


def remove(app, queue: str, task_id: str) -> int:
    """Remove waiting messages of ``task_id`` from ``queue`` before delivery; how many."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        if not isinstance(channel, Channel):
            raise ConfigError(f"the broker is not celery-pq (transport {type(conn.transport).__name__})")
        return channel.queue(queue).remove(task_id)


__all__ = [
    "ClusterUnsettled",
    "ConfigError",
    "Entry",
    "EntryNotFound",
    "ErrorCode",
    "Item",
    "Lease",
    "LeaseLost",
    "MessageTooLarge",
    "ModeMismatch",
    "NotReplicated",
    "NotWaiting",
    "PQError",
    "PriorityQueue",
    "PublishOutcome",
    "QueueFull",
    "QueueMigrating",
    "ShardedQueue",
    "UniqueKey",
    "publish_outcome",
    "remove",
]
