"""The prioritized, lease-based queue (docs/architecture.md): ``PriorityQueue`` (core.py), with
its script calls as a private member (scripts.py, calls.py), and ``ShardedQueue`` (sharded.py);
``open_queue`` (opening.py) is the one way to open either. ``Item`` is what every insert takes.
"""

from ..storage.records import FAIR_SCOPES
from .core import PriorityQueue, ack_all, pop_with_acks
from .item import Item
from .opening import declare_tables, open_queue
from .protocol import Queue
from .running import readable_mode, run_acks, run_calls, run_replicated, translate_error, wait_out_migration
from .settings import MAX_PEEK, QueueSettings
from .sharded import ShardedQueue, new_id
from .unique import MODES as UNIQUE_MODES
from .unique import PublishOutcome, UniqueKey
from .values import (
    COUNTERS,
    EVENT_FIELDS,
    MAX_DUE_MS,
    MAX_RATE,
    MAX_WEIGHT,
    MIN_RATE,
    MIN_WEIGHT,
    VT_PER_DELIVERY,
    Delivery,
    Entry,
    Lease,
    Popped,
    default_consumer_id,
    escape_tenant,
    unescape_tenant,
    validate_priority,
)

__all__ = [
    "COUNTERS",
    "EVENT_FIELDS",
    "FAIR_SCOPES",
    "MAX_DUE_MS",
    "MAX_PEEK",
    "MAX_RATE",
    "MAX_WEIGHT",
    "MIN_RATE",
    "MIN_WEIGHT",
    "UNIQUE_MODES",
    "VT_PER_DELIVERY",
    "Delivery",
    "Entry",
    "Item",
    "Lease",
    "Popped",
    "PriorityQueue",
    "PublishOutcome",
    "Queue",
    "QueueSettings",
    "ShardedQueue",
    "UniqueKey",
    "ack_all",
    "declare_tables",
    "default_consumer_id",
    "escape_tenant",
    "new_id",
    "open_queue",
    "pop_with_acks",
    "readable_mode",
    "run_acks",
    "run_calls",
    "run_replicated",
    "translate_error",
    "unescape_tenant",
    "validate_priority",
    "wait_out_migration",
]
