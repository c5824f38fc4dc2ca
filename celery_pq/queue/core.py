"""The prioritized, lease-based queue: ``PriorityQueue``, the verbs over one queue's Lua scripts
(docs/architecture.md). It has its script calls (``scripts.Scripts``) as a private member; each
verb is a script call or a few, its arguments and reply in ``calls`` and the longer ones in
``inserts``, ``leasing``, ``reads``, ``tenants`` and ``admin``. Usable without Celery::

    q = open_queue(redis.Redis(), "orders")
    q.insert(b"payload", priority=200, id="task-1")
    [lease] = q.pop()
    q.ack(lease)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, overload

import redis

from ..scripts import Flight
from ..storage import constants as C
from ..storage.costs import explain
from ..storage.keys import dead_queue_name
from . import admin, calls, inserts, leasing, reads, tenants
from .item import Item
from .running import run_acks, run_calls, wait_out_migration
from .scripts import Scripts
from .settings import QueueSettings
from .unique import PublishOutcome, UniqueKey
from .values import Delivery, Entry, Lease, Popped


class PriorityQueue:
    """One queue (or one shard of a sharded queue) with ``settings`` (``QueueSettings``,
    docs/settings.md). Open it with ``open_queue``, which gives it the mode it recorded in
    Redis. Settings that cannot work raise ``ConfigError`` (a ``ValueError``)."""

    explain = staticmethod(explain)  # the patent's cost explanation (costs.py)

    def __init__(self, client: redis.Redis, name: str, settings: QueueSettings | None = None, **given):
        if settings is not None and given:
            raise TypeError("give settings or keyword settings, not both")
        self._scripts = s = Scripts(client, name, (settings or QueueSettings(**given)).one_shard())
        self.client, self.name, self.settings, self.keys = client, name, s.settings, s.keys
        #: {tenant ``task:<name>``: rate}: the ``task_rate`` limits a publish follows (``open_queue``)
        self.task_limits: dict[str, float] = {}

    def __repr__(self):
        return f"<PriorityQueue {self.name!r}>"

    @property
    def mode(self) -> dict:
        """This object's mode: the settings a queue records in Redis on first use."""
        return self._scripts.readable_mode

    @property
    def shards(self) -> list[PriorityQueue]:
        """A plain queue is its own single shard."""
        return [self]

    @property
    def is_dead(self) -> bool:
        return self._scripts.is_dead

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

    def rank(self, priority: int) -> int:
        """The rank of a priority: rank 0 is served first."""
        return self._scripts.rank(priority)

    def priority_of_rank(self, rank: int) -> int:
        return self._scripts.priority_of_rank(rank)

    # -- INSERT (docs/publishing.md) ------------------------------------------------------------
    def insert(self, payload: bytes | str, priority: int = 0, id: str | None = None, *, remember=None, **fields) -> str:
        """``put(Item(payload, priority, id, **fields))``: the entry id."""
        return self.put(Item(payload, priority, id, **fields), remember=remember)

    def insert_unique(
        self,
        payload: bytes | str,
        priority: int = 0,
        id: str | None = None,
        *,
        unique: UniqueKey,
        remember=None,
        **fields,
    ) -> PublishOutcome:
        """``put(Item(payload, priority, id, **fields), unique=unique)`` (docs/unique.md)."""
        return self.put(Item(payload, priority, id, **fields), unique=unique, remember=remember)

    @overload
    def put(self, item: Item, *, unique: None = None, first_send: bool = ..., remember: bool | None = ...) -> str: ...
    @overload
    def put(
        self, item: Item, *, unique: UniqueKey, first_send: bool = ..., remember: bool | None = ...
    ) -> PublishOutcome: ...
    def put(self, item: Item, *, unique: UniqueKey | None = None, first_send: bool = False, remember=None) -> Any:
        """INSERT one item: its entry id (``item.id``, or ``"<id>~<seq>"`` when taken); with a
        ``unique`` key, the ``PublishOutcome``. The item's publish id (or one made for it) makes
        the insert idempotent for ``dedupe_seconds``; ``first_send``: the caller made it for this
        publish and never sent it before (recorded, not looked up); ``remember`` keeps it for the
        whole window after the reply (default: only a publish id the item brought)."""
        return inserts.put(self._scripts, item, unique, first_send, remember)

    def insert_many(
        self, items: Iterable[Item], *, chunk: int = C.BULK_CHUNK, repeats: bool = False, remember: bool = True
    ) -> list[str] | tuple[list[str], list[bool]]:
        """Bulk INSERT in atomic calls of ``chunk`` items, pipelined. On a failure ``exc.stored``
        (an entry id or None per item) and ``exc.items`` (those not known to be stored) say what
        was stored. ``repeats=True``: ``(ids, repeated)``, the items whose publish id the queue
        had seen. ``remember=False``: their publish ids are forgotten once answered."""
        return inserts.insert_many(self._scripts, items, chunk, repeats, remember)

    def batch_call(self, items: list[Item]):
        """The insert call of a publish batch's items (each with its publish id), to send on a
        stream; with the state ``batch_reply`` takes."""
        return inserts.batch_call(self._scripts, items)

    def batch_reply(self, reply, state: list) -> calls.Inserted | None:
        """What a ``batch_call``'s reply says was stored; None: send it again."""
        return inserts.batch_reply(self._scripts, reply, state)

    def register_view(self, lo: int, hi: int) -> str:
        """Register the view of ranks lo..hi (inserts wake it); its wake list key."""
        if not 0 <= lo <= hi <= C.MAX_PRIORITY:
            raise ValueError(f"a view covers ranks lo..hi with 0 <= lo <= hi <= 255, got {lo}..{hi}")
        if self.client.hsetnx(self.keys.views, f"{lo}-{hi}", 1):
            self.client.incr(self.keys.views_version)
        self._scripts.refresh_views()  # (this object's inserts wake it from now on)
        return self.keys.view_wake(lo, hi)

    # -- RETRIEVE with a lease (docs/leases.md) -------------------------------------------------
    def pop(self, count: int = 1, *, lease_seconds=None, consumer=None, view=None, acks=()) -> Popped[Lease]:
        """Lease up to ``count`` entries in delivery order (a fair queue: at most 50 per call).
        ``view=(lo, hi)``: only ranks lo..hi. ``acks``: ``(entry id, token)`` pairs acked first,
        in the same call; their codes are the result's ``acked``."""
        popped, codes = wait_out_migration(
            lambda: pop_with_acks(
                self,
                count,
                lease_seconds=lease_seconds,
                consumer=consumer,
                view=view,
                acks={self: acks} if acks else {},
            )
        )
        popped.acked = codes.get(self, [])
        return popped

    def pop_with_acks(self, count: int = 1, *, acks=None, lean=False, lease_seconds=None, consumer=None, view=None):
        """One pop and the acks of several queues (``{queue: pairs}``) in one round trip: the
        leases (``Delivery`` tuples with ``lean``) and the ack codes by queue."""
        return pop_with_acks(
            self, count, acks=acks, lean=lean, lease_seconds=lease_seconds, consumer=consumer, view=view
        )

    def send_pop(self, count: int = 1, *, acks=(), consumer=None, view=None) -> Flight | None:
        """A lean pop (and its ``acks``) sent without waiting: the ``Flight`` whose reply
        ``landed`` reads; None where only a waiting call can be made (``wait_replicas``)."""
        if self.settings.wait_replicas:
            return None
        call = self._scripts.pop_call(count, acks=acks, consumer=consumer, view=view)
        return call.script.send_nowait(call.keys, call.args, self.client)

    @staticmethod
    def landed(reply) -> tuple[list[Delivery], list[int]]:
        """(the deliveries, the codes of the acks it carried) of a sent pop's reply."""
        return calls.popped_deliveries(reply), calls.ack_codes(reply)

    # -- what becomes of a lease ----------------------------------------------------------------
    def ack(self, lease: Lease | tuple[str, str], *, strict: bool = False) -> bool:
        """Done: the entry is deleted. False (LeaseLost with ``strict``) if the lease was lost."""
        return leasing.ack_many(self._scripts, [lease], strict)[0]

    def ack_many(self, leases: Sequence, *, strict: bool = False) -> list[bool]:
        """``ack`` of several leases in one call."""
        return leasing.ack_many(self._scripts, leases, strict)

    def extend(self, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]:
        """Renew leases for ``lease_seconds`` (default: the queue's) from now, Redis clock."""
        return leasing.extend(self._scripts, leases, lease_seconds, strict)

    def requeue(self, lease, *, count_delivery: bool = True, strict: bool = False) -> str | None:
        """Back to waiting at its place: ``"waiting"``, ``"dead"`` (max_deliveries used up) or
        None (the lease was lost). ``count_delivery=False`` undoes the delivery."""
        return leasing.requeue(self._scripts, lease, count_delivery, "", strict)

    def dead_letter(self, lease, reason: str = "rejected", *, strict: bool = False) -> str | None:
        """To ``<name>.dead`` now, with ``reason`` (no "," "@" "|")."""
        return leasing.dead_letter(self._scripts, lease, reason, strict)

    def reclaim(
        self, *, limit=C.SWEEP_BATCH, guard_seconds=0.0, consumer="", gap_seconds=0.0, restore_seconds=0.0
    ) -> dict:
        """The sweep: expired leases (or all of ``consumer``'s) back to waiting or dead, due
        delayed entries in. ``guard_seconds``: only if nobody swept that recently;
        ``gap_seconds``: after a longer gap, leases that expired meanwhile get at least
        ``restore_seconds`` again (docs/leases.md, "Recovery")."""
        return leasing.reclaim(self._scripts, limit, guard_seconds, consumer, gap_seconds, restore_seconds)

    # -- by id and priority (the patent's operations) -------------------------------------------
    def exists(self, id: str) -> bool:
        return reads.exists(self._scripts, id)

    def remove(self, id: str) -> int:
        """REMOVE BY ID of the waiting entries of this id and its duplicates: how many."""
        return admin.remove(self._scripts, id)

    def change_priority(self, id: str, priority: int) -> None:
        """A waiting entry to ``priority``, behind those waiting there."""
        admin.change_priority(self._scripts, id, priority)

    def remove_highest_priority(self) -> Entry | None:
        return admin.remove_highest_priority(self._scripts)

    def retrieve_highest_priority(self) -> str | None:
        return reads.retrieve_highest_priority(self._scripts)

    def retrieve_by_priority(self, priority: int) -> str | None:
        return reads.retrieve_by_priority(self._scripts, priority)

    # -- operators (docs/operations.md) ---------------------------------------------------------
    def replay(self, ids: Sequence[str]) -> dict:
        return admin.replay(self._scripts, ids)

    def pause(self, tenant: str | None = None) -> bool:
        return admin.pause(self._scripts, tenant)

    def resume(self, tenant: str | None = None) -> bool:
        return admin.resume(self._scripts, tenant)

    def purge(self) -> int:
        return admin.purge(self._scripts)

    def delete(self) -> None:
        admin.delete(self._scripts)

    def migrate_mode(self, *, step: int = C.MIGRATE_STEP) -> dict:
        return admin.migrate_mode(self._scripts, step=step)

    def cleanup(self, count: int = 1000) -> int:
        return admin.cleanup(self._scripts, count)

    def set_event_log(self, cap: int | None) -> int:
        return admin.set_event_log(self._scripts, cap)

    def configure_tenants(self, *, weights=None, concurrency=None, rate=None, keep_task_rates=None) -> None:
        """Per-tenant weight, concurrency cap and rate; ``keep_task_rates``: the ``task_rate``
        limits to keep, the others lifted (None: none lifted)."""
        tenants.configure_tenants(self._scripts, weights=weights, concurrency=concurrency, rate=rate)
        if keep_task_rates is not None:
            tenants.drop_task_rates(self._scripts, keep_task_rates)

    # -- reads -----------------------------------------------------------------------------------
    def size(self) -> int:
        return reads.size(self._scripts)

    def stats(self) -> dict:
        return reads.stats(self._scripts)

    def peek(self, count: int = 1) -> list[Entry]:
        return reads.peek(self._scripts, count)

    def delayed(self, count: int = 10) -> list[tuple[Entry, int]]:
        return reads.delayed(self._scripts, count)

    def peek_tenant(self, tenant: str, count: int = 10) -> list[Entry]:
        return tenants.peek_tenant(self._scripts, tenant, count)

    def leases(self, limit: int = 1000) -> list[dict]:
        return reads.leases(self._scripts, limit)

    def lease_of(self, id: str) -> dict | None:
        return reads.lease_of(self._scripts, id)

    def backlog(self, view: tuple[int, int] | None = None) -> int:
        return reads.backlog(self._scripts, view)

    def counters(self) -> dict[str, int]:
        return reads.counters(self._scripts)

    def tenant_stats(self, *, ages: bool = False) -> dict:
        return tenants.tenant_stats(self._scripts, ages=ages)

    def tenant_deliveries(self) -> dict[str, int]:
        return tenants.tenant_deliveries(self._scripts)

    def held_tenants(self, held: dict | None = None) -> dict[str, str]:
        return tenants.held_tenants(self._scripts, held)

    def paused(self) -> dict:
        return tenants.paused(self._scripts)

    def events(self, start: str = "-", end: str = "+", count: int | None = None) -> list[dict]:
        return reads.events(self._scripts, start, end, count)

    def event_log_cap(self) -> int:
        return reads.event_log_cap(self._scripts)

    def stored_mode(self) -> dict | None:
        return reads.stored_mode(self._scripts)


def pop_with_acks(queue: PriorityQueue, count: int = 1, *, acks=None, lean=False, bound=None, **pop) -> tuple:
    """One pop of ``queue`` and the acks of several queues (``{queue: [(entry id, token),
    ...]}``) in one round trip: the popping queue's own acks ride in its pop script, the others'
    in ack scripts pipelined before it. Returns the leases (``Delivery`` tuples with ``lean``)
    and ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value, one per pair). ``bound``: the
    worst rank to take (``Scripts.pop_call``)."""
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
    popped: Popped = Popped(calls.popped_deliveries(reply) if lean else calls.popped_leases(s, reply), queue)
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
