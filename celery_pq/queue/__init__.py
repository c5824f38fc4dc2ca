"""The prioritized, lease-based queue (docs/architecture.md): ``PriorityQueue`` (core.py), with
its script calls as a private member (scripts.py, calls.py), and ``ShardedQueue`` (sharded.py);
``open_queue`` (opening.py) is the one way to open either. ``Item`` is what every insert takes.
"""

from .core import PriorityQueue, ack_all, pop_with_acks
from .inserts import batch_call
from .item import Item
from .opening import declare_tables, open_queue
from .protocol import Consumer, Inspector, Operator, Producer, Queue
from .running import run_calls
from .settings import QueueSettings
from .sharded import ShardedQueue
from .unique import MODES as UNIQUE_MODES
from .unique import PublishOutcome, UniqueKey
from .values import (
    COUNTERS,
    EVENT_FIELDS,
    MAX_WEIGHT,
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
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "UNIQUE_MODES",
    "VT_PER_DELIVERY",
    "Consumer",
    "Delivery",
    "Entry",
    "Inspector",
    "Item",
    "Lease",
    "Operator",
    "Popped",
    "PriorityQueue",
    "Producer",
    "PublishOutcome",
    "Queue",
    "QueueSettings",
    "ShardedQueue",
    "UniqueKey",
    "ack_all",
    "batch_call",
    "declare_tables",
    "default_consumer_id",
    "escape_tenant",
    "open_queue",
    "pop_with_acks",
    "run_calls",
    "unescape_tenant",
    "validate_priority",
]
