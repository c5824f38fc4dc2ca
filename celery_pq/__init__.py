"""celery-pq: a prioritized, fair, lease-based Celery broker on Redis.

Importing this package registers the ``pq://`` and ``pqs://`` URL schemes with kombu.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from .errors import ConfigError, EntryNotFound, ErrorCode, LeaseLost, NotWaiting, PQError, QueueFull
from .queue import Entry, Lease, PriorityQueue

__version__ = "0.1.0"

TRANSPORT_ALIASES.setdefault("pq", "celery_pq.transport:Transport")
TRANSPORT_ALIASES.setdefault("pqs", "celery_pq.transport:TLSTransport")


def _queue_for(app, queue: str) -> PriorityQueue:
    from .transport import Channel

    conn = app.connection_for_write()
    transport = conn.transport
    if not hasattr(transport, "redis_client"):
        raise ConfigError(f"the app's broker is not celery-pq (transport {type(transport).__name__})")
    channel = conn.default_channel
    assert isinstance(channel, Channel)
    return channel._queue(queue), conn


def remove(app, queue: str, task_id: str) -> int:
    """Remove waiting messages of ``task_id`` from ``queue`` before delivery; how many."""
    q, conn = _queue_for(app, queue)
    try:
        return q.remove(task_id)
    finally:
        conn.release()


__all__ = [
    "ConfigError",
    "Entry",
    "EntryNotFound",
    "ErrorCode",
    "Lease",
    "LeaseLost",
    "NotWaiting",
    "PQError",
    "PriorityQueue",
    "QueueFull",
    "remove",
]
