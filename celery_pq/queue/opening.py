"""The one way a queue is opened (``open_queue``): a ``PriorityQueue`` or ``ShardedQueue`` with the
mode recorded in Redis and its tenants' tables declared or followed. Which settings are the
queue's, who writes them and what a process whose options differ is told: docs/settings.md.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import redis

from ..storage import constants as C
from ..storage.keys import shard_names
from ..storage.records import mode_dict
from .core import PriorityQueue
from .protocol import Queue
from .settings import QueueSettings
from .sharded import ShardedQueue
from .tenants import TASK_RATES
from .values import as_text, escape_tenant, unescape_tenant

logger = logging.getLogger("celery_pq")

#: What this process was told already: each difference is logged once per process.
_TOLD: set[tuple[str, str]] = set()


def open_queue(
    client: redis.Redis,
    name: str,
    settings: QueueSettings | None = None,
    *,
    declare: bool = True,
    rng: random.Random | None = None,
) -> Queue:
    """The queue ``name`` with ``settings`` (a ``ShardedQueue`` for more than one shard, ``rng``
    picks those peeked); the mode recorded in Redis wins over the one of ``settings``.
    ``declare``: the tenants' tables of ``settings`` are written (``declare_tables``); else the
    stored ones stand, and ``task_limits`` are the stored ``task_rate`` limits and those of
    ``settings``. A difference is logged once, naming both values."""
    settings = settings or QueueSettings()
    shards = [name] if settings.shards == 1 else shard_names(name, settings.shards)
    opened = [_open_shard(client, shard, settings.one_shard()) for shard in shards]
    queue: Any = opened[0][0]
    if len(opened) > 1:
        queue = ShardedQueue([q for q, _ in opened], name, peek=settings.peek, rng=rng)
    _tell(queue.shards[0], _mode_differences(queue.shards[0], opened[0][1]))
    if declare:
        declare_tables(queue, settings)
    else:
        fair = queue.settings.fair
        stored = _stored_tables(queue.shards[0], settings) if fair else {}
        _tell(queue.shards[0], _table_differences(settings, stored, "the queue's stands"))
        queue.task_limits = {**_own_limits(settings), **stored.get("limits", {})} if fair else {}
    return queue


def declare_tables(queue: Queue, settings: QueueSettings) -> None:
    """A consumer's declaration: the queue's mode recorded where it has none yet (so a producer
    with fewer options that comes first follows the consumer's), and the tenants' tables of
    ``settings`` written to every shard of a fair ``queue`` (differences logged once); its
    ``task_limits`` are then the declared ones."""
    for q in queue.shards:
        q.client.set(q.keys.mode, q._scripts.mode, nx=True)
    if not queue.settings.fair:
        queue.task_limits = {}
        return
    stored = _stored_tables(queue.shards[0], settings)
    own = _own_limits(settings)
    # A consumer whose options limit no task on the queue declares no limits: the stored ones
    # stand (an old worker restarted during a rolling deploy lifts nothing); one that limits any
    # declares the whole set, and the limits it no longer names are lifted.
    declared = "this process's now stands (it declares it)"
    _tell(queue.shards[0], _table_differences(settings, stored, declared, declared if own else "the queue's stands"))
    for q in queue.shards:
        q.configure_tenants(**settings.tenant_tables(), keep_task_rates=own or None)
    queue.task_limits = own or stored["limits"]


def _open_shard(client: redis.Redis, name: str, settings: QueueSettings) -> tuple[PriorityQueue, dict]:
    """(the shard with its recorded mode, the mode ``settings`` wanted)."""
    wanted = PriorityQueue(client, name, settings)
    raw = client.get(wanted.keys.mode)
    if raw is None:
        return wanted, wanted.mode
    return PriorityQueue(client, name, settings.with_mode(mode_dict(as_text(raw)))), wanted.mode


def _stored_tables(q: PriorityQueue, settings: QueueSettings) -> dict:
    """What a fair queue stores of the tenants' tables that ``settings`` name, and every stored
    ``task_rate`` limit: {"weights": {tenant: value}, ..., "limits": {tenant: rate}}."""
    tables = settings.tenant_tables()
    named = [(label, t) for label, table in tables.items() for t in (table or {})]
    out: dict = {label: {} for label in tables}
    if named:
        fields = [f"{label[0]}:{escape_tenant(t)}" for label, t in named]
        for (label, t), value in zip(named, q.client.hmget(q.keys.tenant_settings, fields)):
            if value is not None:
                out[label][t] = float(value)
    out["limits"] = {
        unescape_tenant(as_text(field)[2:]): float(value)
        for field, value in q.client.hscan_iter(q.keys.tenant_settings, match=f"{TASK_RATES}*", count=1000)
    }
    return out


def _own_limits(settings: QueueSettings) -> dict[str, float]:
    """The ``task_rate`` limits among the settings' rates: {tenant ``task:<name>``: rate}."""
    return {t: r for t, r in (settings.rate or {}).items() if t.startswith(C.TASK_TENANT_PREFIX)}


def _mode_differences(q: PriorityQueue, wanted: dict) -> list[str]:
    return [
        f"{key} is {q.mode[key]!r} in Redis, {mine!r} in this process's options: the queue's stands "
        "(PriorityQueue.migrate_mode changes it on purpose; docs/settings.md)"
        for key, mine in wanted.items()
        if q.mode.get(key) not in (None, mine)
    ]


def _table_differences(
    settings: QueueSettings, stored: dict, outcome: str, limits_outcome: str | None = None
) -> list[str]:
    """What the ``stored`` tenants' tables say otherwise than ``settings``, and the stored
    ``task_rate`` limits they do not name; ``outcome`` (``limits_outcome`` for those limits): which stands."""
    if not stored:
        return []
    said = []
    for label, table in settings.tenant_tables().items():
        for tenant, mine in (table or {}).items():
            theirs = stored[label].get(tenant)
            if label == "rate" and tenant.startswith(C.TASK_TENANT_PREFIX):
                theirs = stored["limits"].get(tenant)
            if theirs is not None and float(theirs) != float(mine):
                said.append(
                    f"{label}[{tenant!r}] is {theirs:g} in Redis, {mine:g} in this process's options: {outcome}"
                )
    for tenant in sorted(set(stored["limits"]) - set(_own_limits(settings))):
        said.append(
            f"task_rate limits {tenant!r} to {stored['limits'][tenant]:g}/s in Redis, not in this "
            f"process's options: {limits_outcome or outcome}"
        )
    return said


def _tell(q: PriorityQueue, said: list[str]) -> None:
    """Log each difference, once per process."""
    for text in said:
        line = f"queue {q.name!r}: {text}"
        if (q.keys.mode, line) not in _TOLD:
            _TOLD.add((q.keys.mode, line))
            logger.warning(line)
