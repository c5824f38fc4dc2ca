"""The prioritized, lease-based queue: ``PriorityQueue``, the verbs over one queue's Lua scripts
(docs/architecture.md), each a function of its private script calls (``scripts.Scripts``) in
``inserts``, ``leasing``, ``reads``, ``tenants`` or ``admin``::

    q = open_queue(redis.Redis(), "orders")
    q.insert(b"payload", priority=200, id="task-1")
    [lease] = q.pop()
    q.ack(lease)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

import redis

from ..scripts import Flight
from ..storage import constants as C
from ..storage.keys import dead_queue_name
from . import admin, calls, inserts, leasing, reads
from . import tenants as fair
from .item import Item
from .running import readable_mode, run_acks, run_calls, wait_out_migration
from .scripts import Scripts
from .settings import QueueSettings
from .unique import PublishOutcome, UniqueKey
from .values import Lease, Popped

P = ParamSpec("P")
R = TypeVar("R")


def _verb(f: Callable[Concatenate[Scripts, P], R]) -> Callable[Concatenate[PriorityQueue, P], R]:
    """The method that runs ``f`` on the queue's script calls (its docstring is ``f``'s)."""

    @functools.wraps(f)
    def verb(self: PriorityQueue, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return f(self._scripts, *args, **kwargs)

    return verb


class PriorityQueue:
    """One queue (or shard) with ``settings`` (docs/settings.md); ``open_queue`` opens it with the
    mode recorded in Redis. Settings that cannot work raise ``ConfigError`` (a ``ValueError``)."""

    def __init__(self, client: redis.Redis, name: str, settings: QueueSettings | None = None, **given):
        if settings is not None and given:
            raise TypeError("give settings or keyword settings, not both")
        self._scripts = s = Scripts(client, name, (settings or QueueSettings(**given)).one_shard())
        self.client, self.name, self.settings, self.keys = client, name, s.settings, s.keys
        self.is_dead = s.is_dead
        #: {tenant ``task:<name>``: rate}: the ``task_rate`` limits a publish follows (``open_queue``)
        self.task_limits: dict[str, float] = {}

    def __repr__(self):
        return f"<PriorityQueue {self.name!r}>"

    @property
    def mode(self) -> dict:
        """This object's mode: the settings a queue records in Redis on first use."""
        return readable_mode(self._scripts.mode)

    @property
    def shards(self) -> list[PriorityQueue]:
        """A plain queue is its own single shard."""
        return [self]

    @property
    def dead(self) -> PriorityQueue:
        """The dead-letter queue ``<name>.dead``."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        return PriorityQueue(self.client, dead_queue_name(self.name), self.settings.dead())

    @property
    def last_publish_id(self) -> bytes | None:
        """The publish id of the last insert (to retry it by hand after an error)."""
        return self._scripts.last_publish_id

    rank = _verb(Scripts.rank)

    # -- INSERT (docs/publishing.md) ------------------------------------------------------------
    @overload
    def insert(
        self, item: Item | bytes | str, priority: int = ..., id: str | None = ..., *, unique: UniqueKey, **options
    ) -> PublishOutcome: ...
    @overload
    def insert(
        self, item: Item | bytes | str, priority: int = ..., id: str | None = ..., *, unique: None = None, **options
    ) -> str: ...
    def insert(
        self,
        item: Item | bytes | str,
        priority: int = 0,
        id: str | None = None,
        *,
        unique: UniqueKey | None = None,
        first_send: bool = False,
        remember: bool | None = None,
        **fields,
    ) -> Any:
        """INSERT one ``Item`` (or its payload, priority, id and fields): its entry id (``item.id``,
        or ``"<id>~<seq>"`` when taken); with a ``unique`` key, the ``PublishOutcome`` (docs/unique.md).
        ``first_send``: the caller made the publish id for this publish (recorded, not looked up);
        ``remember`` keeps it for the dedupe window after the reply (default: one the item brought)."""
        if not isinstance(item, Item):
            item = Item(item, priority, id, **fields)
        elif priority or id is not None or fields:
            raise TypeError("an insert takes an Item or the fields of one, not both")
        return self._put(item, unique, first_send, remember)

    def _put(self, item: Item, unique: UniqueKey | None, first_send: bool, remember: bool | None) -> Any:
        return inserts.put(self._scripts, item, unique, first_send, remember)

    insert_many = _verb(inserts.insert_many)

    def register_view(self, lo: int, hi: int) -> str:
        """Register the view of ranks lo..hi (inserts wake it); its wake list key."""
        if not 0 <= lo <= hi <= C.MAX_PRIORITY:
            raise ValueError(f"a view covers ranks lo..hi with 0 <= lo <= hi <= 255, got {lo}..{hi}")
        if self.client.hsetnx(self.keys.views, f"{lo}-{hi}", 1):
            self.client.incr(self.keys.views_version)
        self._scripts.refresh_views()  # (this object's inserts wake it from now on)
        return self.keys.view_wake(lo, hi)

    # -- RETRIEVE with a lease (docs/leases.md) -------------------------------------------------
    def pop(
        self, count: int = 1, *, acks: Any = (), lean=False, lease_seconds=None, consumer=None, view=None
    ) -> Popped:
        """Lease up to ``count`` entries in delivery order (a fair queue: at most 50 per call) as
        ``Lease`` objects (``Delivery`` tuples with ``lean``); ``view=(lo, hi)``: only ranks lo..hi.
        ``acks``: ``(entry id, token)`` pairs acked first in the same call, their codes ``acked``;
        or ``{queue: pairs}``, ``acked`` then by queue (and a migration is not waited out)."""
        pop = functools.partial(pop_with_acks, self, count, lean=lean, lease_seconds=lease_seconds, consumer=consumer)
        if isinstance(acks, dict):
            popped, popped.acked = pop(acks=acks, view=view)
            return popped
        popped, codes = wait_out_migration(lambda: pop(acks={self: acks}, view=view))
        popped.acked = codes.get(self, [])
        return popped

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> Flight | None:
        """A lean pop (and its ``acks``) sent without waiting: the ``Flight`` whose reply
        ``landed`` reads; None where only a waiting call can be made (``wait_replicas``)."""
        if self.settings.wait_replicas:
            return None
        call = self._scripts.pop_call(count, acks=acks, consumer=consumer, view=view)
        return call.script.send_nowait(call.keys, call.args, self.client)

    @staticmethod
    def landed(reply) -> tuple[Popped, list[int]]:
        """(the deliveries, the codes of the acks it carried) of a sent pop's reply (``due_in`` set)."""
        return Popped(calls.popped_deliveries(reply), due_in=calls.due_in(reply)), calls.ack_codes(reply)

    # -- what becomes of a lease ----------------------------------------------------------------
    @overload
    def ack(self, lease: Lease | tuple[str, str], *, strict: bool = ...) -> bool: ...
    @overload
    def ack(self, lease: list, *, strict: bool = ...) -> list[bool]: ...
    def ack(self, lease: Any, *, strict: bool = False) -> Any:
        """Done: the entry is deleted. False (LeaseLost with ``strict``) if the lease was lost.
        ``lease``: a ``Lease`` or (entry id, token) pair, or a list of them (then a bool each)."""
        return leasing.ack(self._scripts, lease, strict=strict)

    extend = _verb(leasing.extend)
    requeue = _verb(leasing.requeue)
    dead_letter = _verb(leasing.dead_letter)
    reclaim = _verb(leasing.reclaim)

    # -- by id and priority (the patent's operations) -------------------------------------------
    exists = _verb(reads.exists)
    remove = _verb(admin.remove)
    change_priority = _verb(admin.change_priority)
    remove_highest_priority = _verb(admin.remove_highest_priority)
    retrieve_by_priority = _verb(reads.retrieve_by_priority)

    # -- operators (docs/operations.md) ---------------------------------------------------------
    replay = _verb(admin.replay)
    pause = _verb(admin.pause)
    resume = _verb(admin.resume)
    purge = _verb(admin.purge)
    delete = _verb(admin.delete)
    migrate_mode = _verb(admin.migrate_mode)
    cleanup = _verb(admin.cleanup)
    set_event_log = _verb(admin.set_event_log)
    configure_tenants = _verb(fair.configure_tenants)

    # -- reads -----------------------------------------------------------------------------------
    size = _verb(reads.size)
    stats = _verb(reads.stats)
    peek = _verb(reads.peek)
    delayed = _verb(reads.delayed)
    leases = _verb(reads.leases)
    backlog = _verb(reads.backlog)
    counters = _verb(reads.counters)
    tenants = _verb(fair.tenants)
    recorded = _verb(fair.recorded)
    events = _verb(reads.events)


def pop_with_acks(queue: PriorityQueue, count: int = 1, *, acks=None, lean=False, bound=None, **pop) -> tuple:
    """One pop of ``queue`` and the acks of several queues (``{queue: [(entry id, token), ...]}``)
    in one round trip (the popping queue's in its pop script): the leases (``Delivery`` tuples with
    ``lean``) and ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value, one per pair)."""
    acks = acks or {}
    others = [(q, pairs) for q, pairs in acks.items() if q is not queue and pairs]
    own = acks.get(queue, ())
    s = queue._scripts
    many = [q._scripts.ack_call(pairs) for q, pairs in others]
    many.append(s.pop_call(count, acks=own, bound=bound, **pop))
    if own or others:
        replies = run_acks(queue.client, many, [queue, *(q for q, _ in others)])
    else:
        replies = run_calls(queue.client, many)
    reply = replies.pop()
    codes = {q: list(r) for (q, _), r in zip(others, replies)}
    if own:
        codes[queue] = calls.ack_codes(reply)
    popped: Popped = Popped(
        calls.popped_deliveries(reply) if lean else calls.popped_leases(s, reply), queue, calls.due_in(reply)
    )
    return popped, codes


def ack_all(acks: dict) -> dict:
    """The acks of several queues, ``{queue: [(entry id, token), ...]}``, in one round trip;
    ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value, one per pair, in order)."""
    batches = [(q, pairs) for q, pairs in acks.items() if pairs]
    if not batches:
        return {}
    many = [q._scripts.ack_call(pairs) for q, pairs in batches]
    replies = run_acks(batches[0][0].client, many, [q for q, _ in batches])
    return {q: list(r) for (q, _), r in zip(batches, replies)}
