"""The one way a queue is opened: from a client, a name and ``QueueSettings``, a ``PriorityQueue``
or, with more than one shard, a ``ShardedQueue`` of them. The channel, the broker's tools (the
command line, metrics, autoscaler, dashboard) and the Spark writer all open queues here.
"""

from __future__ import annotations

import random

import redis

from ..keys import queue_keys, shard_names
from ..records import mode_dict
from .core import PriorityQueue
from .protocol import Queue
from .settings import QueueSettings
from .values import as_text


def open_queue(
    client: redis.Redis,
    name: str,
    settings: QueueSettings | None = None,
    *,
    recorded: bool = False,
    rng: random.Random | None = None,
) -> Queue:
    """The queue ``name`` with ``settings``: a ``ShardedQueue`` of ``settings.shards`` shards
    (``peek`` of them peeked per pop; ``rng`` picks them) when there is more than one.

    ``recorded``: each queue (or shard) takes the mode it recorded in Redis (fairness, scope,
    priority order, technique) and ``settings`` for the rest, so that a tool works on a queue
    made by workers with other settings; one with no record takes ``settings`` as they are.
    A fair queue opened with its settings as given gets the tenants' tables written (and the
    ``task_rate`` limits its rate table no longer names removed).
    """
    settings = settings or QueueSettings()
    if settings.shards == 1:
        return open_shard(client, name, settings, recorded=recorded)
    from ..shards import ShardedQueue

    shards = [open_shard(client, shard, settings, recorded=recorded) for shard in shard_names(name, settings.shards)]
    return ShardedQueue(shards, name, peek=settings.peek, rng=rng)


def open_shard(client: redis.Redis, name: str, settings: QueueSettings, *, recorded: bool = False) -> PriorityQueue:
    """One queue, or one shard of a sharded queue (``open_queue``)."""
    settings = settings.one_shard()
    raw = client.get(queue_keys(name, settings.key_prefix).mode) if recorded else None
    if raw is not None:
        return PriorityQueue(client, name, settings.with_mode(mode_dict(as_text(raw))))
    q = PriorityQueue(client, name, settings)
    if q.fair:
        q.configure_tenants(**settings.tenant_tables())
        if settings.rate is not None:  # the options' whole table: limits taken out of task_rate go
            q.drop_task_rates(settings.rate)
    return q
