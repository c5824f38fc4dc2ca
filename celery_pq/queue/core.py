"""The prioritized, lease-based queue itself: the typed Python face of the Lua scripts.

Usable without Celery or kombu::

    q = PriorityQueue(redis.Redis(), "orders")
    q.insert(b"payload", priority=200, id="task-1")
    [lease] = q.pop()
    ...
    q.ack(lease)

Each queue is two single-index tables (the patent's identifier-indexed and priority-indexed
tables), a lease index, and a few small keys, all under one hash tag (see ``keys.py``).
Every state change is one script, so every operation is atomic.

The queue is built in layers, each a question: ``base`` (settings, keys, ranks, running one
script), ``calls`` (each script's arguments and reply), ``inserts``, ``leasing`` (ack, extend,
requeue, dead_letter, reclaim), ``tenants``, ``reads``, ``admin``, and here the queue itself:
the pop with its lease, on top of them all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from .. import constants as C
from ..checks import count as _count
from ..checks import text as _text
from ..costs import explain
from ..ids import unique_bytes
from ..keys import dead_queue_name
from ..scripts import Flight
from . import calls
from .admin import QueueAdmin
from .calls import ScriptCall
from .leasing import QueueLeases
from .running import pop_with_acks, wait_out_migration
from .settings import QueueSettings
from .unique import QueueUnique
from .values import Delivery, Lease, Popped

logger = logging.getLogger("celery_pq.queue")


class PriorityQueue(QueueUnique, QueueLeases, QueueAdmin):
    """One queue: insert, pop-with-lease, ack, requeue, extend, reclaim, remove by id, ...

    Arguments:
        client: a redis-py client (bytes or str responses both work).
        name: queue name; ``"<name>.dead"`` is the dead-letter queue of ``<name>``.
        settings: a ``QueueSettings``, or its fields as keyword arguments:
        key_prefix: every key starts with ``<key_prefix>:``.
        technique: ``"T"`` or ``"S"`` (see ``constants.TECHNIQUES``).
        priority_order: ``"higher_first"`` (255 first) or ``"lower_first"`` (0 first).
        lease_seconds: default lease length of ``pop``.
        max_deliveries: deliveries without an ack before the dead-letter queue; 0 = no limit.
        max_length: waiting (and delayed) entries allowed; ``None`` = no limit.
        fair: share the queue fairly among tenants (the ``tenant`` of each insert).
        fair_scope: ``"within_priority"`` (strict priority, tenants share each level) or
            ``"tenant_first"`` (tenants share the queue, each tenant's entries by priority).
        tenant_concurrency: leased entries allowed per tenant at once (None: no cap).
        tenant_rate: deliveries per second allowed per tenant (0/None: no limit).
        max_length_per_tenant: waiting entries allowed per tenant (None: no limit).
        event_log: None/0, or the approximate most entries of the queue's event log (a capped
            stream, docs/events.md); the first call records it with the queue, so every
            process's changes are logged from then on (``set_event_log`` turns it off).
        wait_replicas: inserts and acks return only when this many replicas have them (Redis
            WAIT after the script, on the same connection); an insert that fewer replicas
            acknowledged within ``wait_timeout`` seconds raises ``NotReplicated``. 0: off.

    Settings that cannot work raise ``ConfigError`` (a ``ValueError``).
    """

    def __init__(self, client: redis.Redis, name: str, settings: QueueSettings | None = None, **given):
        super().__init__(client, name, settings, **given)
        self._pop_calls: dict[tuple, tuple] = {}  # pop arguments -> (script, keys, lease_ms, lo, hi), checked

    @classmethod
    def open(cls, client: redis.Redis, name: str, **settings) -> PriorityQueue:
        """The queue ``name`` with the mode it recorded in Redis (fairness, scope, priority
        order, technique), for tools that read or administer queues made elsewhere; other
        settings as given. A queue with no record gets the defaults (``opening.open_shard``)."""
        from .opening import open_shard

        return open_shard(client, name, QueueSettings(**settings))

    def __repr__(self):
        return f"<PriorityQueue {self.name!r}>"

    @property
    def dead(self) -> PriorityQueue:
        """The dead-letter queue ``<name>.dead``."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        return PriorityQueue(self.client, dead_queue_name(self.name), self.settings.dead())

    # -- RETRIEVE / pop with lease --------------------------------------------------------------
    def pop(
        self,
        count: int = 1,
        *,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
        acks: Sequence[tuple[str, str]] = (),
    ) -> Popped[Lease]:
        """Lease up to ``count`` entries in delivery order (empty list when none wait); a fair
        queue leases at most ``FAIR_POP_MAX`` (50) in one call.

        ``view=(lo, hi)`` takes only entries whose rank is in lo..hi (a priority view).
        ``acks``: ``(entry id, token)`` pairs acked in the same script call, before the pop (a
        consumer's finished deliveries and its next pop in one round trip); their codes (1
        acked, or an ErrorCode value) are the result's ``acked``.
        """
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

    def pop_with_acks(
        self,
        count: int = 1,
        *,
        acks: dict | None = None,
        lean: bool = False,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> tuple[Popped, dict]:
        """``running.pop_with_acks`` of this queue (a sharded queue's picks its shard): the
        leases (``Delivery`` tuples with ``lean``) and the codes of ``acks``, by queue."""
        return pop_with_acks(
            self, count, acks=acks, lean=lean, lease_seconds=lease_seconds, consumer=consumer, view=view
        )

    def send_pop(
        self,
        count: int = 1,
        *,
        acks: Sequence[tuple[str, str]] = (),
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
    ) -> Flight | None:
        """A lean pop (and ``acks``) sent without waiting for its reply: the ``scripts.Flight``
        whose reply ``parse_deliveries`` and ``ack_codes`` read; None, nothing sent, where only
        a waiting call can be made (``wait_replicas``; see ``LuaScript.send_nowait``)."""
        if self.wait_replicas:  # (the acks it carries wait for replicas: run_acks)
            return None
        call = self.pop_call(count, acks=acks, consumer=consumer, view=view)
        return call.script.send_nowait(call.keys, call.args, self.client)

    def pop_call(
        self,
        count: int = 1,
        *,
        lease_seconds: float | None = None,
        consumer: str | None = None,
        view: tuple[int, int] | None = None,
        acks: Sequence[tuple[str, str]] = (),
        bound: int | None = None,
    ) -> ScriptCall:
        """The call of a pop, to run with others (``run_calls``).

        ``acks``: ``(entry id, token)`` pairs acked in the same script call, before the pop
        (a consumer's finished deliveries and its next pop in one round trip); their codes are
        ``ack_codes(reply)``. ``bound``: the worst rank to take (a sharded queue's consumer
        takes from one shard only what beats the next shard it peeked); not for a fair queue
        under ``tenant_first``, whose order is not by rank.
        """
        # a consumer pops with the same arguments call after call: they are checked, and the
        # keys built, once per set of them
        key: tuple | None = (
            type(count),
            count,
            type(lease_seconds),
            lease_seconds,
            self.lease_seconds,
            consumer,
            view,
            self.fair,
            type(bound),
            bound,
        )
        try:
            known = self._pop_calls.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable argument: the checks below name it
            known = key = None
        if known is None:
            _count("count", count, none=False)
            lo, hi = self.check_view(view)
            take_hi = hi if bound is None else bound
            if isinstance(take_hi, bool) or not isinstance(take_hi, int) or not 0 <= take_hi <= C.MAX_PRIORITY:
                raise ValueError(f"bound must be a rank 0..255 or None, got {bound!r}")
            wake = {} if view is None else {"wk": self.keys.view_wake(lo, hi)}
            lease_ms = self._lease_ms(lease_seconds)
            if consumer is not None:
                _text("consumer", consumer, forbidden=",")
            name = "pop_fair" if self.fair else "pop"
            known = (
                name,
                self.keys_of(name, **wake),
                calls.pop_layout(self, count, lease_ms, consumer, (lo, hi, take_hi)),
            )
            if key is not None:
                if len(self._pop_calls) >= 64:
                    self._pop_calls.clear()
                self._pop_calls[key] = known
        name, keys, layout = known
        return self.call(name, keys, calls.pop_args(layout, unique_bytes().hex(), acks))

    def parse_deliveries(self, reply) -> list[Delivery]:
        """The ``Delivery`` tuples of a pop's reply (a lean pop)."""
        return calls.popped_deliveries(reply)

    def parse_pop(self, reply) -> list[Lease]:
        """The leases of a pop's reply."""
        return calls.popped_leases(self, reply)

    ack_codes = staticmethod(calls.ack_codes)

    # -- the patent's cost explanation (see costs.py) ------------------------------------------
    explain = staticmethod(explain)
