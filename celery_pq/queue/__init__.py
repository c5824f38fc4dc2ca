"""The prioritized, lease-based queue, in layers (each module one question):

- ``values``: what a queue hands out and takes in (``Entry``, ``Lease``, ``Delivery``,
  ``Popped``) and the small conversions every layer shares;
- ``settings``: ``QueueSettings``, a queue's settings, checked once (``ConfigError``);
- ``calls``: each script's arguments and reply, one pair per script, no I/O;
- ``running``: running script calls (one, several, with WAIT), error replies as exceptions;
- ``base``: a queue's context (keys, ranks, the script context) and ``run``;
- ``leasing``: what becomes of a lease (ack, extend, requeue, dead_letter, the sweep);
- ``views``: the registry of priority views an insert wakes;
- ``unique``: the insert with a unique key (``UniqueKey``, ``PublishOutcome``);
- ``inserts``, ``tenants``, ``reads``, ``admin``: the writes of producers, the tenants of a fair
  queue, the read-only questions, the operators' changes;
- ``core``: ``PriorityQueue`` on top of them all, with the pop that leases;
- ``protocol``: ``Queue``, what a plain and a sharded queue both answer;
- ``opening``: ``open_queue``, the one way to open a queue (plain or sharded), and
  ``declare_tables``, a consumer's declaration of the settings that are the queue's.
"""

from ..records import FAIR_SCOPES
from .core import PriorityQueue
from .opening import declare_tables, open_queue
from .protocol import Queue
from .running import (
    ack_all,
    pop_with_acks,
    readable_mode,
    run_acks,
    run_calls,
    run_replicated,
    translate_error,
    wait_out_migration,
)
from .settings import MAX_PEEK, QueueSettings
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
    "Lease",
    "Popped",
    "PriorityQueue",
    "PublishOutcome",
    "Queue",
    "QueueSettings",
    "UniqueKey",
    "ack_all",
    "declare_tables",
    "default_consumer_id",
    "escape_tenant",
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
