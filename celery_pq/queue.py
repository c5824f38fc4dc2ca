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
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import redis

from . import constants as C
from . import scripts as _scripts
from .checks import count as _count
from .checks import number as _number
from .checks import seconds as _seconds
from .checks import text as _text
from .connections import NodePipeline, is_cluster
from .costs import explain
from .errors import ConfigError, ErrorCode, NotReplicated, QueueFull, QueueMigrating, error_for, raise_for
from .ids import decode_id, encode_id, unique_bytes
from .keys import dead_queue_name, queue_keys, script_keys, split_dead
from .records import (FAIR_SCOPES, entry_payload, join_mode, mode_dict, split_dead_note, split_entry, split_lease,
                      split_switches, split_tenant_member)
from .scripts import FIRST_SEND, get_scripts, signature

logger = logging.getLogger("celery_pq.queue")

#: The counters the scripts keep in a queue's hash ct (``PriorityQueue.counters``): entries
#: stored, deliveries, deliveries of an entry delivered before, acks, leases given back by a
#: consumer (or returned from a recovered consumer), leases that ran out, entries moved to the
#: dead-letter queue, entries removed (by id, purge, remove_highest), entries of insert calls
#: refused by max_length or max_length_per_tenant.
COUNTERS = ("enqueued", "delivered", "redelivered", "acked", "requeued", "lease_expired", "dead_lettered",
            "removed", "refused_full")

#: The fields of an event-log entry, in order (docs/events.md), and those read as integers.
EVENT_FIELDS = ("e", "q", "id", "p", "k", "t", "c", "task", "n", "r", "ms")
_EVENT_INTS = frozenset(("p", "k", "n", "ms"))

#: The error reply of a script whose caller's mode is not the queue's (see common.lua).
_MODE_MISMATCH = re.compile(r"MODE_MISMATCH (?P<key>\S+) (?P<stored>\S+) (?P<wanted>\S+)")
#: The error reply of a script called while the queue's mode is being migrated (migrate.lua).
_MIGRATING = re.compile(r"MIGRATING (?P<key>\S+) (?P<mode>\S+)")


def _queue_of_key(key: str) -> str:
    """The queue name in a key ``<prefix>:{<tag>}:[dead:]<suffix>``."""
    from urllib.parse import unquote

    tag = key[key.index("{") + 1 : key.index("}:")]
    dead = key[key.index("}:") + 2 :].startswith("dead:")
    return unquote(tag) + (".dead" if dead else "")


def translate_error(exc: Exception) -> Exception:
    """A script's error reply as the project's exception (ModeMismatch, QueueMigrating), else
    ``exc``."""
    if not isinstance(exc, redis.ResponseError):
        return exc
    m = _MIGRATING.search(str(exc))
    if m is not None:
        return QueueMigrating(_queue_of_key(m.group("key")), readable_mode(m.group("mode")))
    m = _MODE_MISMATCH.search(str(exc))
    if m is None:
        return exc
    return error_for(ErrorCode.MODE_MISMATCH, _queue_of_key(m.group("key")),
                     stored=readable_mode(m.group("stored")), wanted=readable_mode(m.group("wanted")))


def readable_mode(mode: str) -> dict:
    """A mode record as settings; a plain queue's has no fair_scope."""
    d = mode_dict(mode)
    if not d["fair"]:
        d.pop("fair_scope")
    return d


def wait_out_migration(call):
    """``call()``, again while it raises QueueMigrating (the queue's mode is being migrated and
    the script did nothing), for up to ``C.MIGRATION_WAIT`` seconds. Only for a call that is one
    script call of one queue: of several, those of other queues would have run."""
    deadline, pause = None, 0.005
    while True:
        try:
            return call()
        except QueueMigrating:
            deadline = deadline or time.monotonic() + C.MIGRATION_WAIT
            if time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def run_calls(client: redis.Redis, calls: list[tuple]) -> list:
    """``scripts.run_calls`` with script error replies turned into the project's exceptions."""
    try:
        return _scripts.run_calls(client, calls)
    except redis.ResponseError as exc:
        raise translate_error(exc) from None


def run_replicated(client: redis.Redis, calls: list[tuple], replicas: int, timeout: float) -> tuple[list, int]:
    """``run_calls`` ending with WAIT for ``replicas`` (at most ``timeout`` seconds): (replies,
    replicas that acknowledged them)."""
    try:
        return _scripts.run_replicated(client, calls, replicas, int(timeout * 1000))
    except redis.ResponseError as exc:
        raise translate_error(exc) from None


def run_acks(client: redis.Redis, calls: list[tuple], queues: Sequence["PriorityQueue"]) -> list:
    """``run_calls`` of calls that carry acks: with ``wait_replicas`` set (on any of
    ``queues``), the round trip ends with WAIT, and acks that fewer replicas acknowledged are
    logged (a failover now may deliver those tasks again: at least once still holds)."""
    wanted = max((q.wait_replicas for q in queues), default=0)
    if not wanted:
        return run_calls(client, calls)
    timeout = max(q.wait_timeout for q in queues)
    replies, acked = run_replicated(client, calls, wanted, timeout)
    if acked < wanted:
        logger.warning("celery-pq: acks in %s: only %d of %d replicas acknowledged them within %gs; a failover "
                       "now may deliver those tasks again", ", ".join(repr(q.name) for q in queues), acked, wanted,
                       timeout)
    return replies


def validate_priority(priority) -> int:
    """An integer 0..255, or ValueError naming the value."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer 0..255, got {priority!r} ({type(priority).__name__})")
    if not C.MIN_PRIORITY <= priority <= C.MAX_PRIORITY:
        raise ValueError(f"priority {priority} is out of range {C.MIN_PRIORITY}..{C.MAX_PRIORITY}")
    return priority


_TENANT_UNSAFE = frozenset("%,|") | {chr(i) for i in range(32)}


def escape_tenant(tenant: str) -> str:
    """No ",", "|" or control characters (the entry header and the fairness index use them)."""
    return "".join(f"%{ord(c):02X}" if c in _TENANT_UNSAFE else c for c in tenant)


def unescape_tenant(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


#: The latest due time an insert takes: the end of year 9999 (Unix ms, below 2**53).
MAX_DUE_MS = 253_402_300_799_999


def default_consumer_id() -> str:
    host = socket.gethostname().replace(",", "_")
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _b(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@dataclass
class Entry:
    """A waiting (or dead-lettered) entry, as peek and retrieve return it."""

    queue: str
    id: str
    priority: int
    payload: bytes
    deliveries: int
    tenant: str | None
    enqueued_ms: int
    dead_reason: str | None = None
    dead_ms: int | None = None
    #: Deliveries before it was dead-lettered (entries of a dead-letter queue only).
    dead_deliveries: int | None = None


@dataclass
class Lease(Entry):
    """A delivered entry, leased to one consumer until acked, requeued or expired."""

    token: str = ""


class Delivery(NamedTuple):
    """A leased entry as a consumer that hands it on needs it (the transport: ``pop`` with
    ``lean``): a ``Lease`` without the fields read from the entry's header (priority, tenant,
    times), which are not parsed for it."""

    id: str
    token: str
    deliveries: int
    payload: bytes


class PriorityQueue:
    """One queue: insert, pop-with-lease, ack, requeue, extend, reclaim, remove by id, ...

    Arguments:
        client: a redis-py client (bytes or str responses both work).
        name: queue name; ``"<name>.dead"`` is the dead-letter queue of ``<name>``.
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
    """

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        *,
        key_prefix: str = C.KEY_PREFIX,
        technique: str = C.TECHNIQUE_T,
        priority_order: str = C.HIGHER_FIRST,
        lease_seconds: float = C.LEASE_SECONDS,
        max_deliveries: int = C.MAX_DELIVERIES,
        max_length: int | None = None,
        fair: bool = False,
        fair_scope: str = "within_priority",
        tenant_concurrency: int | None = None,
        tenant_rate: float | None = None,
        max_length_per_tenant: int | None = None,
        dedupe_seconds: float = C.DEDUPE_SECONDS,
        max_dead_length: int | None = None,
        event_log: int | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = C.WAIT_TIMEOUT,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"queue name must be a non-empty string, got {name!r}")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ValueError(f"key_prefix must be a non-empty string, got {key_prefix!r}")
        _seconds("lease_seconds", lease_seconds)
        _seconds("dedupe_seconds", dedupe_seconds, zero=True)
        if not isinstance(fair, bool):
            raise ValueError(f"fair must be True or False, got {fair!r}")
        _count("max_dead_length", max_dead_length)
        _count("event_log", event_log, low=0)
        _count("wait_replicas", wait_replicas, low=0, none=False)
        _seconds("wait_timeout", wait_timeout)
        _count("max_deliveries", max_deliveries, low=0, none=False)
        if technique not in C.TECHNIQUES:
            raise ValueError(f"technique must be one of {C.TECHNIQUES}, got {technique!r}")
        if priority_order not in C.PRIORITY_ORDERS:
            raise ValueError(f"priority_order must be one of {C.PRIORITY_ORDERS}, got {priority_order!r}")
        _count("max_length", max_length)
        if fair_scope not in FAIR_SCOPES:
            raise ValueError(f"fair_scope must be one of {tuple(FAIR_SCOPES)}, got {fair_scope!r}")
        _count("tenant_concurrency", tenant_concurrency)  # None: no cap (as the transport option)
        _count("max_length_per_tenant", max_length_per_tenant)
        if tenant_rate:  # 0 or None: no limit
            _number("tenant_rate", tenant_rate, low=MIN_RATE, allow_low=True, high=MAX_RATE)
        else:
            _number("tenant_rate", tenant_rate, allow_low=True, none=True)
        if (tenant_concurrency or tenant_rate or max_length_per_tenant) and not fair:
            raise ValueError("tenant caps need fairness on (a tenant for each entry)")
        self.fair = bool(fair)
        self.scope = FAIR_SCOPES[fair_scope]
        self.fair_scope = fair_scope
        self.tenant_concurrency = tenant_concurrency or 0
        self.tenant_rate = float(tenant_rate or 0)
        self.max_length_per_tenant = max_length_per_tenant or 0
        if self.fair:
            technique = C.TECHNIQUE_T  # reported as T; a fair queue's remove is lazy either way
        self.client = client
        self.name = name
        self.key_prefix = key_prefix
        self.technique = technique
        self.priority_order = priority_order
        self.lease_seconds = float(lease_seconds)
        self.max_deliveries = int(max_deliveries or 0)
        self.max_length = max_length
        self.keys = queue_keys(name, key_prefix)
        self.is_dead = split_dead(name)[1]
        self._dead_keys = None if self.is_dead else queue_keys(dead_queue_name(name), key_prefix)
        self._script_keys: dict[str, tuple[tuple[str, ...], list[str]]] = {}
        self._views: list[tuple[int, int]] = []
        self._views_version = ""
        self._head: tuple[list, list] | None = None  # _insert_head, made when first needed
        self.dedupe_seconds = float(dedupe_seconds)
        self.max_dead_length = max_dead_length
        self.event_log = int(event_log or 0)
        #: Inserts and acks return once this many replicas have them (Redis WAIT); 0: off.
        self.wait_replicas = wait_replicas
        self.wait_timeout = float(wait_timeout)
        #: The publish id of this queue object's last insert (to retry it by hand after an error).
        self.last_publish_id: bytes | None = None
        self._forget: list[bytes] = []
        self._forget_lock = threading.Lock()
        self._ranks: dict[int, int] = {}  # priority -> rank, once checked
        self._pop_calls: dict[tuple, tuple] = {}  # pop arguments -> (script, keys, lease_ms, lo, hi), checked
        self._mode = join_mode(self.fair, fair_scope, priority_order, technique)
        max_dead = max_dead_length or max_length or 0
        #: The queue context every script but extend takes first (see lua/includes/common.lua);
        #: on a Redis Cluster it starts with "~", the slot guard: a call made while the queue's
        #: slot migrates stops before it writes anything, and is made again (scripts.py).
        self._ctx = ("~" if is_cluster(client) else "") + (
            f"{self._mode}|{max_dead}|{int(self.dedupe_seconds * 1000)}|{self.tenant_rate:g}|{self.event_log}")

    @classmethod
    def open(cls, client: redis.Redis, name: str, *, key_prefix: str = C.KEY_PREFIX, **settings) -> "PriorityQueue":
        """The queue ``name`` with the mode it recorded in Redis (fairness, scope, priority
        order, technique), for tools that read or administer queues made elsewhere; other
        settings as given. A queue with no record gets the defaults."""
        raw = client.get(queue_keys(name, key_prefix).md)
        if raw is not None:
            mode = mode_dict(_s(raw))
            settings.update({k: v for k, v in mode.items() if v is not None})
        return cls(client, name, key_prefix=key_prefix, **settings)

    @property
    def mode(self) -> dict:
        """This object's mode: the settings a queue records in Redis on first use."""
        return readable_mode(self._mode)

    def stored_mode(self) -> dict | None:
        """The mode the queue recorded in Redis (None before its first insert)."""
        raw = self.client.get(self.keys.md)
        return None if raw is None else readable_mode(_s(raw))

    def migrate_mode(self, *, step: int = C.MIGRATE_STEP) -> dict:
        """Change the queue's mode to this object's, on purpose: the priority index and the
        fairness state are rebuilt from the stored entries (leases are kept). An admin operation,
        in script calls of ``step`` entries each (a few ms of Redis's time each, whatever the
        queue's size). Meanwhile the queue does nothing else: other calls answer
        ``QueueMigrating`` (the queue API waits them out, up to ``C.MIGRATION_WAIT`` s); lease
        renewals go on. A migration that stopped half way is finished by calling this again with
        the same mode. Returns {"waiting": n, "leased": n, "malformed": n}."""
        _count("step", step, low=1, none=False)
        total = [0, 0, 0]
        while True:
            waiting, leased, bad, done = self._run("migrate", self._keys("migrate"), [step])
            for i, n in enumerate((waiting, leased, bad)):
                total[i] += int(n)
            if int(done):
                return {"waiting": total[0], "leased": total[1], "malformed": total[2]}

    # -- running scripts ----------------------------------------------------------------------
    def _keys(self, script: str, **given: str) -> list[str]:
        """The KEYS of ``script`` for this queue, by the names in its header (built once per
        script); ``given`` puts other keys in by name (a priority view's wake list)."""
        known = self._script_keys.get(script)
        if known is None:
            sig = signature(script)
            names = sig.keys if self.fair else sig.keys[: len(sig.keys) - len(sig.fair_only)]
            known = self._script_keys[script] = (names, script_keys(names, self.keys, self._dead_keys or self.keys))
        if given:
            return [given.get(n, key) for n, key in zip(*known)]
        return known[1]

    def _call(self, name: str, keys: list, args: list) -> tuple:
        """``(script, keys, args)`` of one script call, the queue context last (the scripts take
        it off ARGV first), to run now (``_run``) or with others (``run_calls``)."""
        return getattr(self.scripts, name), keys, [*args, self._ctx]

    def _run(self, name: str, keys: list, args: list, *, wait: bool = True):
        """Run one script now (while the queue's mode is being migrated: ``wait_out_migration``,
        or with ``wait=False`` QueueMigrating at once)."""
        script, keys, args = self._call(name, keys, args)

        def once():
            try:
                return script(keys=keys, args=args, client=self.client)
            except redis.ResponseError as exc:
                raise translate_error(exc) from None

        return wait_out_migration(once) if wait else once()

    def _run_replicated(self, calls: list[tuple]) -> tuple[list, int | None]:
        """``run_calls``, followed by WAIT when ``wait_replicas`` is set: (replies, replicas
        that acknowledged them, None when off)."""
        if not self.wait_replicas:
            return run_calls(self.client, calls), None
        return run_replicated(self.client, calls, self.wait_replicas, self.wait_timeout)

    def _check_replicated(self, acked: int | None) -> None:
        if acked is not None and acked < self.wait_replicas:
            raise NotReplicated(self.name, acked, self.wait_replicas, self.wait_timeout)

    def _pipeline(self, transaction: bool = False):
        """A pipeline of this queue's reads (TIME among them, or in MULTI) on the server that
        holds its keys: on a cluster, the master serving its hash tag."""
        return NodePipeline(self.client, self.keys.ii, transaction)

    def exists(self, id: str) -> bool:
        """Whether an entry with this id is stored (waiting, delayed or leased)."""
        return bool(self.client.hexists(self.keys.ii, encode_id(id)))

    @property
    def scripts(self):
        return get_scripts(self.client)

    # -- priorities ---------------------------------------------------------------------------
    def rank(self, priority: int) -> int:
        """Rank 0 is served first."""
        r = self._ranks.get(priority) if type(priority) is int else None
        if r is None:
            p = validate_priority(priority)
            r = self._ranks[p] = C.MAX_PRIORITY - p if self.priority_order == C.HIGHER_FIRST else p
        return r

    def priority_of_rank(self, rank: int) -> int:
        return C.MAX_PRIORITY - rank if self.priority_order == C.HIGHER_FIRST else rank

    def priority_of_score(self, score) -> int:
        return self.priority_of_rank(int(float(score)) >> C.SEQ_BITS)

    @property
    def dead(self) -> "PriorityQueue":
        """The dead-letter queue ``<name>.dead``."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue")
        return PriorityQueue(
            self.client,
            dead_queue_name(self.name),
            key_prefix=self.key_prefix,
            technique=C.TECHNIQUE_T,
            priority_order=self.priority_order,
            lease_seconds=self.lease_seconds,
            max_deliveries=0,
            max_dead_length=self.max_dead_length or self.max_length,
            dedupe_seconds=self.dedupe_seconds,
            event_log=self.event_log,
        )

    # -- decoding -----------------------------------------------------------------------------
    def _entry(self, eid, score, value, cls=Entry, **extra) -> Entry:
        h, payload = split_entry(value)  # the scripts return only entries they parsed
        dead_reason, dead_ms, dead_deliveries = split_dead_note(h.dead_note) or (None, None, None)
        return cls(
            queue=self.name,
            id=decode_id(eid),
            priority=self.priority_of_score(score),
            payload=payload,
            deliveries=h.deliveries,
            tenant=unescape_tenant(_s(h.tenant)) if h.tenant else None,
            enqueued_ms=h.enqueued_ms,
            dead_reason=dead_reason,
            dead_ms=dead_ms,
            dead_deliveries=dead_deliveries,
            **extra,
        )

    # -- INSERT -------------------------------------------------------------------------------
    def _insert_head(self) -> tuple[list, list]:
        """(KEYS, the ARGV before the publish ids to forget) of an insert: the same for every
        insert until the registry of priority views changes (``refresh_views``)."""
        head = self._head
        if head is None:
            keys = [*self._keys("insert"), *(self.keys.view_wake(*v) for v in self._views)]
            args = [self.max_length or 0, self.max_length_per_tenant, self._views_version, len(self._views), *(f"{lo},{hi}" for lo, hi in self._views)]
            head = self._head = (keys, args)
        return head

    def _insert_keys(self) -> list[str]:
        return self._insert_head()[0]

    def _insert_args(self, items, forget=(), made="0") -> list:
        """``made``, as insert.lua takes it: "0" (the items carry publish ids of their own, or
        none; "R" the same, the reply marking repeats), "1" (the first item's publish id was made here and stands for the call), or
        ``FIRST_SEND`` (the same, on the call's first send)."""
        args: list = [*self._insert_head()[1], len(forget), *forget, made]
        for n, (payload, priority, id, tenant, due, pid, task) in enumerate(items):
            if made not in ("0", "R") and n:
                pid = None  # a made publish id stands for the whole call: the first group's
            args += [encode_id(id) if id else "", self.rank(priority), escape_tenant(tenant or ""), _b(payload), due,
                     pid or "", task or ""]
        return args

    def _take_forgets(self) -> list:
        """Publish ids whose inserts have replied (none of them can be retried now), once
        FORGET_BATCH of them are waiting: the next insert call has the script forget them in
        one command, so the window holds only unanswered ones and at most a batch more."""
        if len(self._forget) < C.FORGET_BATCH:  # (a look without the lock: the take below is under it)
            return []
        with self._forget_lock:
            if len(self._forget) < C.FORGET_BATCH:
                return []
            out, self._forget = self._forget[:C.FORGET_MAX], self._forget[C.FORGET_MAX:]
        return out

    def _answered(self, pids) -> None:
        with self._forget_lock:
            # beyond FORGET_PENDING the oldest are not worth a command: the window's rotation
            # drops them (a bulk insert leaves them to it)
            self._forget.extend(pids)
            if len(self._forget) > C.FORGET_PENDING:
                del self._forget[: len(self._forget) - C.FORGET_PENDING]

    def _item(self, payload, priority, id=None, tenant=None, due="0", publish_id=None, task=None) -> tuple:
        """One insert, checked before anything is sent: (payload, priority, id, tenant, due,
        publish id, task), with a new publish id when none is given and dedupe is on."""
        if not isinstance(payload, (bytes, str)):
            raise ValueError(f"payload must be bytes or str, got {type(payload).__name__}")
        self.rank(priority)
        if id is not None and (not isinstance(id, str) or not id):
            raise ValueError(f"entry id must be a non-empty string or None, got {id!r}")
        if tenant is not None and not isinstance(tenant, str):
            raise ValueError(f"tenant must be a string or None, got {tenant!r}")
        if publish_id is None and self.dedupe_seconds > 0:
            publish_id = unique_bytes()
        elif publish_id is not None:
            if not isinstance(publish_id, (bytes, str)) or not publish_id:
                raise ValueError(f"publish_id must be non-empty bytes or str, got {publish_id!r}")
            publish_id = _b(publish_id)
        if task is not None and not isinstance(task, str):
            raise ValueError(f"task must be a task name (str) or None, got {task!r}")
        return payload, priority, id, tenant, due, publish_id, task

    def _check_reply(self, reply, items) -> bool:
        """Raise for a full queue; False when the view registry changed (refresh and retry)."""
        if len(reply) >= 2 and isinstance(reply[0], int):
            if reply[0] == ErrorCode.QUEUE_FULL:
                raise_for(reply[0], self.name, size=int(reply[1]), limit=self.max_length)
            if reply[0] == ErrorCode.TENANT_FULL:
                raise_for(reply[0], self.name, size=int(reply[1]), limit=self.max_length_per_tenant,
                          tenant=items[int(reply[2])][3])
            if reply[0] == ErrorCode.STALE_VIEWS:
                self.refresh_views()
                return False
        return True

    def insert(self, payload: bytes | str, priority: int = 0, *, id: str | None = None,
               tenant: str | None = None, delay: float | None = None, due_ms: int | None = None,
               publish_id: bytes | str | None = None, first_send: bool = False, remember: bool | None = None,
               task: str | None = None) -> str:
        """INSERT: returns the entry id (``id`` itself, or ``"<id>~<seq>"`` when taken).

        ``delay`` (seconds from now, Redis clock) or ``due_ms`` (absolute Unix time, ms) keep
        the entry delayed until then; it then joins the queue at its priority.

        ``publish_id`` makes the insert idempotent: the queue stores nothing for a publish id it
        has seen in the last ``dedupe_seconds`` and returns the entry id it stored then. When
        none is given a random one is made (``last_publish_id``), so the client's own retry of
        a call whose reply was lost stores the entry once. ``first_send``: the caller made
        ``publish_id`` for this publish and never sent it before (the transport's first attempt
        of a publish call), so nothing can have been stored under it: it is recorded, not looked
        up (a resend of this call, by the runner or by the caller, looks it up). ``remember`` (default: True for a
        given publish id, False for a made one) keeps the publish id for the whole window even
        after the reply came; otherwise the next insert call has the queue forget it, since no
        retry of it can come any more (the window then costs memory only for unanswered calls).

        ``task`` names the task for the event log's ``enqueue`` event (nothing else keeps it).
        """
        items = [self._item(payload, priority, id, tenant, _when(delay, due_ms), publish_id, task)]
        pid = self.last_publish_id = items[0][5]
        forget_it = pid is not None and not (publish_id is not None if remember is None else remember)
        for _ in range(5):
            forget = self._take_forgets()
            try:
                [reply], acked = self._run_replicated(
                    [self._call("insert", self._insert_keys(),
                                self._insert_args(items, forget,
                                                  FIRST_SEND if publish_id is None or first_send else "0"))])
            except BaseException:
                self._answered(forget)
                raise
            if forget_it:
                self._answered([pid])
            if self._check_reply(reply, items):
                self._check_replicated(acked)
                return decode_id(reply[0])
        raise RuntimeError(f"queue {self.name!r}: the priority-view registry kept changing during insert")

    def insert_many(self, items: Iterable[tuple], *, chunk: int = C.BULK_CHUNK,
                    repeats: bool = False) -> list[str] | tuple[list[str], list[bool]]:
        """Bulk INSERT of ``(payload, priority[, id[, tenant[, due_ms[, publish_id[, task]]]]])``
        tuples, in chunks of ``chunk`` (one atomic script call each), pipelined.

        ``max_length`` is checked per chunk. When a chunk fails, the exception says which items
        were stored: ``exc.stored`` has one element per item, its entry id or None (not stored,
        or not known when the connection failed); ``exc.items`` are the items not known to be
        stored, with the publish ids the caller gave. Items of a refused chunk were not stored:
        ``insert_many(exc.items)`` stores them. Items of a chunk without a reply may have been
        stored; only those with a publish id of the caller's are then stored once for sure.

        A chunk whose items carry no publish id of the caller's gets one publish id for the
        whole chunk (the client's own retry of the pipeline stores the chunk once).

        ``repeats=True`` returns ``(ids, repeated)``: ``repeated[i]`` is True when item ``i``
        stored nothing because the queue had seen its publish id (one of the caller's) within
        the window, or an earlier item of the same call carried it; its id is the entry stored
        then. (A pipeline that redis-py itself sent again after a lost reply finds its own
        items so.) Items without a publish id of the caller's are never repeats.
        """
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        norm = []
        items_given = list(items)
        for item in items_given:
            if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 7:
                raise ValueError("insert_many takes (payload, priority[, id[, tenant[, due_ms[, publish_id"
                                 f"[, task]]]]]) tuples, got {item!r}")
            payload, priority, *rest = item
            rest += [None] * (5 - len(rest))
            try:
                norm.append(self._item(payload, priority, rest[0], rest[1], _when(None, rest[2]), rest[3], rest[4]))
            except ValueError as exc:
                raise ValueError(f"insert_many item {item!r}: {exc}") from None
        ids: list = [None] * len(norm)
        repeated = [False] * len(norm)
        pending = [(i, norm[i : i + chunk]) for i in range(0, len(norm), chunk)]
        made = {i for i, item in enumerate(items_given) if len(item) < 6 or item[5] is None}
        given = [None if i in made else norm[i][5] for i in range(len(norm))]  # the caller's publish ids
        while pending:
            forget = self._take_forgets()
            try:
                replies, acked = self._run_replicated([
                    self._call("insert", self._insert_keys(),
                               self._insert_args(part, forget if n == 0 else (),
                                                 "1" if all(start + j in made for j in range(len(part)))
                                                 else "R" if repeats else "0"))
                    for n, (start, part) in enumerate(pending)])
            except Exception as exc:
                self._answered(forget)
                raise _partial(exc, ids, norm, given, "chunks without a reply may or may not be stored") from None
            retry, failed = [], None
            for (start, part), reply in zip(pending, replies):
                try:
                    if not self._check_reply(reply, part):
                        retry.append((start, part))
                        continue
                except QueueFull as exc:
                    failed = failed or exc
                    continue
                for j, e in enumerate(reply):  # a repeat comes as [entry id] ("R")
                    seen = isinstance(e, list)
                    ids[start + j] = decode_id(e[0] if seen else e)
                    repeated[start + j] = seen
            if failed is not None:
                raise _partial(failed, ids, norm, given, "chunks refused stored nothing")
            try:
                self._check_replicated(acked)
            except NotReplicated as exc:
                exc.stored = list(ids)
                exc.items = [(p, pr, i, t, None if d == "0" else int(d), g, task)
                             for (p, pr, i, t, d, _, task), g in zip(norm, given)]
                exc.add_note("insert_many: exc.stored are the entry ids the master stored; exc.items are all the "
                             "items, to publish again (with publish ids of their own, stored once)")
                raise
            pending = retry
        # every made publish id has its reply: no retry of them can come (on a failure above
        # they stay remembered for the window); a chunk of made ones sent its first only
        self._answered([norm[start][5] for start in range(0, len(norm), chunk)
                        if start in made and norm[start][5] is not None])
        return (ids, repeated) if repeats else ids

    # -- priority views (the collated keyed queue) ----------------------------------------------
    def refresh_views(self) -> None:
        """Re-read the registry of priority views (inserts wake the views an entry satisfies)."""
        with self._pipeline(transaction=False) as p:
            p.hkeys(self.keys.vw)
            p.get(self.keys.vr)
            names, version = p.execute()
        self._views = sorted(tuple(int(x) for x in _s(n).split("-")) for n in names)
        self._views_version = _s(version) if version is not None else ""
        self._head = None

    def register_view(self, lo: int, hi: int) -> str:
        """Register the view of ranks lo..hi; returns its wake list key."""
        if not 0 <= lo <= hi <= C.MAX_PRIORITY:
            raise ValueError(f"a view covers ranks lo..hi with 0 <= lo <= hi <= 255, got {lo}..{hi}")
        if self.client.hsetnx(self.keys.vw, f"{lo}-{hi}", 1):
            self.client.incr(self.keys.vr)
        return self.keys.view_wake(lo, hi)

    # -- tenants --------------------------------------------------------------------------------
    def configure_tenants(self, *, weights: dict | None = None, concurrency: dict | None = None,
                          rate: dict | None = None) -> None:
        """Per-tenant weight, concurrency cap and rate (a tenant not named gets the default)."""
        fields = {}
        for label, table in (("weights", weights), ("concurrency", concurrency), ("rate", rate)):
            if table is not None and not isinstance(table, dict):
                raise ValueError(f"{label} must be a dict {{tenant: value}}, got {table!r}")
            for tenant, value in (table or {}).items():
                if not isinstance(tenant, str):
                    raise ValueError(f"{label}: tenant names are strings, got {tenant!r}")
                fields[f"{label[0]}:{escape_tenant(tenant)}"] = _tenant_setting(label, tenant, value)
        if fields:
            self.client.hset(self.keys.fc, mapping=fields)

    def tenant_stats(self, *, ages: bool = False) -> dict:
        """{tenant: {"waiting": n, "leased": n}} for tenants with waiting or leased entries.

        Counts are one HGETALL. With ``ages``, also "next_age_seconds": the age of the entry
        the tenant gives next (two pipelined round trips for all tenants).
        """
        out: dict = {}
        raw: dict = {}
        for field, value in self.client.hgetall(self.keys.fn).items():
            kind, _, tenant = _s(field).partition(":")
            row = out.setdefault(unescape_tenant(tenant), {"waiting": 0, "leased": 0})
            raw[unescape_tenant(tenant)] = tenant
            row["waiting" if kind == "n" else "leased"] = int(value)
        if ages and out:
            names = list(out)
            with self._pipeline(transaction=False) as p:
                for name in names:
                    t = raw[name]
                    p.zrangebylex(self.keys.te, f"[{t}\0", f"({t}\1", start=0, num=1)
                p.time()
                *heads, (now_s, now_us) = p.execute()
            now_ms = int(now_s) * 1000 + int(now_us) // 1000
            members = [(name, split_tenant_member(h[0]) if h else None) for name, h in zip(names, heads)]
            eids = [(name, m[3]) for name, m in members if m]
            values = self.client.hmget(self.keys.ii, [e for _, e in eids]) if eids else []
            for name in names:
                out[name]["next_age_seconds"] = None
            for (name, _), value in zip(eids, values):
                entry = split_entry(value) if value else None
                if entry:
                    out[name]["next_age_seconds"] = (now_ms - entry[0].enqueued_ms) / 1000
        return out

    # -- RETRIEVE / pop with lease --------------------------------------------------------------
    def pop(self, count: int = 1, *, lease_seconds: float | None = None, consumer: str | None = None,
            view: tuple[int, int] | None = None, acks: Sequence[tuple[str, str]] = ()) -> "Popped":
        """Lease up to ``count`` entries in delivery order (empty list when none wait); a fair
        queue leases at most ``FAIR_POP_MAX`` (50) in one call.

        ``view=(lo, hi)`` takes only entries whose rank is in lo..hi (a priority view).
        ``acks``: ``(entry id, token)`` pairs acked in the same script call, before the pop (a
        consumer's finished deliveries and its next pop in one round trip); their codes (1
        acked, or an ErrorCode value) are the result's ``acked``.
        """
        popped, codes = wait_out_migration(lambda: pop_with_acks(
            self, count, lease_seconds=lease_seconds, consumer=consumer, view=view, acks={self: acks} if acks else {}))
        popped.acked = codes.get(self, [])
        return popped

    def pop_call(self, count: int = 1, *, lease_seconds: float | None = None, consumer: str | None = None,
                 view: tuple[int, int] | None = None, acks: Sequence[tuple[str, str]] = (),
                 bound: int | None = None) -> tuple:
        """``(script, keys, args)`` of a pop, to run with others (``run_calls``).

        ``acks``: ``(entry id, token)`` pairs acked in the same script call, before the pop
        (a consumer's finished deliveries and its next pop in one round trip); their codes are
        ``ack_codes(reply)``. ``bound``: the worst rank to take (a sharded queue's consumer
        takes from one shard only what beats the next shard it peeked); not for a fair queue
        under ``tenant_first``, whose order is not by rank.
        """
        # a consumer pops with the same arguments call after call: they are checked, and the
        # keys built, once per set of them
        key = (type(count), count, type(lease_seconds), lease_seconds, self.lease_seconds, consumer, view, self.fair,
               type(bound), bound)
        try:
            known = self._pop_calls.get(key)
        except TypeError:  # an unhashable argument: the checks below name it
            known = key = None
        if known is None:
            _count("count", count, none=False)
            lo, hi = self._check_view(view)
            take_hi = hi if bound is None else bound
            if isinstance(take_hi, bool) or not isinstance(take_hi, int) or not 0 <= take_hi <= C.MAX_PRIORITY:
                raise ValueError(f"bound must be a rank 0..255 or None, got {bound!r}")
            wake = {} if view is None else {"wk": self.keys.view_wake(lo, hi)}
            lease_ms = self._lease_ms(lease_seconds)
            if consumer is not None:
                _text("consumer", consumer, forbidden=",")
            name = "pop_fair" if self.fair else "pop"
            known = (name, self._keys(name, **wake), lease_ms, lo, hi, take_hi)
            if key is not None:
                if len(self._pop_calls) >= 64:
                    self._pop_calls.clear()
                self._pop_calls[key] = known
        name, keys, lease_ms, lo, hi, take_hi = known
        # (a fair pop leases at most FAIR_POP_MAX in one call: bounded work per call)
        args = [lease_ms, consumer or "", unique_bytes().hex(), min(count, C.FAIR_POP_MAX) if self.fair else count,
                C.POP_STALE_BUDGET]
        if self.fair:
            args += (self.tenant_concurrency, self.tenant_rate)
        args += (lo, hi, take_hi, len(acks))
        for eid, token in acks:
            args += (encode_id(eid), token)
        return self._call(name, keys, args)

    def _check_view(self, view) -> tuple[int, int]:
        """The rank range of a priority view (None: the whole queue), checked."""
        if view is None:
            return 0, C.MAX_PRIORITY
        if not isinstance(view, (tuple, list)) or len(view) != 2 or \
                any(isinstance(x, bool) or not isinstance(x, int) for x in view) or \
                not 0 <= view[0] <= view[1] <= C.MAX_PRIORITY:
            raise ValueError(f"view must be a rank range (lo, hi) with 0 <= lo <= hi <= 255, got {view!r}")
        if self.fair and self.scope != "P" and tuple(view) != (0, C.MAX_PRIORITY):
            raise ValueError(f"view {tuple(view)!r}: priority views need fair_scope='within_priority' on a fair "
                             f"queue, and {self.name!r} is fair_scope={self.fair_scope!r}")
        return view[0], view[1]

    def _lease_ms(self, lease_seconds) -> int:
        if lease_seconds is None:
            return int(1000 * self.lease_seconds)
        return int(1000 * _seconds("lease_seconds", lease_seconds))

    def parse_deliveries(self, reply) -> list[Delivery]:
        """``parse_pop``, lean: ``Delivery`` tuples (the payload is what follows the entry's
        header; the scripts return only entries they parsed)."""
        out = []
        for i in range(2 + int(reply[1]), len(reply), 5):
            eid, token, d, _, value = reply[i : i + 5]
            out.append(Delivery(decode_id(eid), _s(token), int(d), entry_payload(value)))
        return out

    def parse_pop(self, reply) -> list[Lease]:
        leases = []
        for i in range(2 + int(reply[1]), len(reply), 5):
            eid, token, d, score, value = reply[i : i + 5]
            lease = self._entry(eid, score, value, Lease, token=_s(token))
            lease.deliveries = int(d)
            leases.append(lease)
        return leases

    @staticmethod
    def ack_codes(reply) -> list[int]:
        """The codes of the acks a pop call carried (1 acked, or an ErrorCode value)."""
        return [int(c) for c in reply[2 : 2 + int(reply[1])]]

    def ack(self, lease: Lease | tuple[str, str], *, strict: bool = False) -> bool:
        """Done: delete the entry. False (or LeaseLost with strict) if the lease was lost."""
        return self.ack_many([lease], strict=strict)[0]

    def ack_many(self, leases: Sequence, *, strict: bool = False) -> list[bool]:
        """Ack several leases in one script call."""
        pairs = [_pair(x) for x in leases]
        if not pairs:
            return []
        (codes,) = wait_out_migration(lambda: run_acks(self.client, [self.ack_call(pairs)], [self]))
        return self._codes(pairs, codes, strict)

    def ack_call(self, pairs: Sequence[tuple[str, str]]) -> tuple:
        """``(script, keys, args)`` acking ``(entry id, token)`` pairs, to run with others."""
        return self._call("ack", self._keys("ack"),
                          [v for eid, token in pairs for v in (encode_id(eid), token)])

    def _codes(self, pairs, codes, strict) -> list[bool]:
        out = []
        for (eid, _), code in zip(pairs, codes):
            if code == 1:
                out.append(True)
            elif strict:
                raise_for(code, self.name, entry_id=eid)
            else:
                out.append(False)
        return out

    def extend(self, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]:
        """Renew leases for ``lease_seconds`` from now (Redis clock)."""
        pairs = [_pair(x) for x in leases]
        self._lease_ms(lease_seconds)
        if not pairs:
            return []
        lease_ms = self._lease_ms(lease_seconds)
        codes = self.scripts.extend(keys=self._keys("extend"), args=[lease_ms] + [v for eid, token in pairs
                                                                          for v in (encode_id(eid), token)],
                                    client=self.client)
        return self._codes(pairs, codes, strict)

    def requeue(self, lease: Lease | tuple[str, str], *, count_delivery: bool = True, strict: bool = False) -> str | None:
        """Back to Waiting at its original place; ``"dead"`` when max_deliveries is used up.

        ``count_delivery=False`` undoes the delivery (a consumer giving back work it never
        started). Returns ``"waiting"``, ``"dead"``, or None when the lease was lost.
        """
        return self._requeue(lease, count_delivery, "", strict)

    def dead_letter(self, lease: Lease | tuple[str, str], reason: str = "rejected", *, strict: bool = False) -> str | None:
        """Move a leased entry to ``<queue>.dead`` now, with a reason (no "," "@" "|")."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue: it has no dead-letter queue of its own "
                             "(requeue the entry, or ack it to drop it)")
        if not isinstance(reason, str) or not reason or any(c in reason for c in ",@|"):
            raise ValueError(f"dead-letter reason must be non-empty without ',', '@' or '|': {reason!r}")
        return self._requeue(lease, True, reason, strict)

    def _requeue(self, lease, count_delivery, reason, strict):
        eid, token = _pair(lease)
        code = self._run("requeue", self._keys("requeue"),
                         [encode_id(eid), token, 1 if count_delivery else 0, self.max_deliveries, reason])
        if code == 1:
            return "waiting"
        if code in (2, 3):
            if code == 3:
                self._warn_dropped(1)
            return "dead"
        if strict:
            raise_for(code, self.name, entry_id=eid)
        return None

    def reclaim(self, *, limit: int = C.SWEEP_BATCH, guard_seconds: float = 0.0, consumer: str = "",
                gap_seconds: float = 0.0, restore_seconds: float = 0.0) -> dict:
        """The sweep: expired leases (or all leases of ``consumer``) back to Waiting or to the
        dead-letter queue; delayed entries that are due into the queue.

        With ``guard_seconds`` > 0, runs only if no other caller swept in that interval. With
        ``gap_seconds`` > 0, a sweep that comes more than that long after the last one (Redis
        was paused or down) first gives each lease that ran out in between the time it had left
        (``restored``), so that its holder can renew it; at least ``restore_seconds`` from now
        (pass the lease length: the deadline then counts from now, when the holder can reach
        Redis again).

        A consumer's leases are looked for ``limit`` at a time, one script call each (the work of
        one call is bounded, however many leases other consumers hold); this returns when all
        were looked at. While the queue's mode is being migrated a sweep is skipped (it does not
        wait: the thread that sweeps also renews leases); a consumer's recovery waits.
        """
        total = Counter()
        start = 0
        while True:
            try:
                returned, dead, skipped, more, promoted, dropped, restored, kept = self._run(
                    "reclaim", self._keys("reclaim"),
                    [limit, self.max_deliveries, int(guard_seconds * 1000), consumer, int(gap_seconds * 1000), int(restore_seconds * 1000),
                     start],
                    wait=bool(consumer),
                )
            except QueueMigrating:
                return {"returned": 0, "dead": 0, "skipped": True, "more": False, "promoted": 0, "dead_dropped": 0,
                        "restored": 0}
            total.update(returned=returned, dead=dead, promoted=promoted, dropped=dropped, restored=restored)
            if not consumer or not more:
                break
            start += int(kept)
        if total["dropped"]:
            self._warn_dropped(total["dropped"])
        return {"returned": total["returned"], "dead": total["dead"], "skipped": bool(skipped),
                "more": bool(more) and not consumer, "promoted": total["promoted"],
                "dead_dropped": total["dropped"], "restored": total["restored"]}

    def _warn_dropped(self, n: int) -> None:
        logger.warning("celery-pq: dead-letter queue %s.dead is full (max_dead_length=%s): its %d oldest "
                       "entr%s dropped to make room", self.name, self.max_dead_length or self.max_length, n,
                       "y was" if n == 1 else "ies were")

    # -- REMOVE BY ID, priorities, peeks --------------------------------------------------------
    def remove(self, id: str) -> int:
        """REMOVE BY ID of waiting entries with this id or duplicates of it; returns how many.
        An id sent many times is done in script calls of ``C.STEP_CHUNK`` duplicates each."""
        _text("id", id)
        total, cursor = 0, ""
        while True:
            removed, _leased, cursor = self._run("remove", self._keys("remove"),
                                                 [encode_id(id), cursor, C.STEP_CHUNK])
            total += int(removed)
            if not cursor:
                return total

    def change_priority(self, id: str, priority: int) -> None:
        """Move a waiting entry to ``priority``, behind the entries already waiting there."""
        _text("id", id)
        code = self._run("change_priority", self._keys("change_priority"),
                         [encode_id(id), self.rank(priority)])
        raise_for(code, self.name, entry_id=id)

    def peek(self, count: int = 1) -> list[Entry]:
        """The next ``count`` entries in delivery order, not leased."""
        reply = self._run("peek", self._keys("peek"), [count, C.POP_STALE_BUDGET])
        return [self._entry(*reply[i : i + 3]) for i in range(0, len(reply), 3)]

    def head_call(self, view: tuple[int, int] | None = None) -> tuple:
        """``(script, keys, args)`` reading the rank and enqueue time (ms) of the entry a pop
        (of ``view``) would take first, to run with others (``run_calls``); ``parse_head``
        reads its reply."""
        lo, hi = self._check_view(view)
        return self._call("peek_head", self._keys("peek_head"), [lo, hi, C.POP_STALE_BUDGET])

    @staticmethod
    def parse_head(reply) -> tuple[int, int] | None:
        """(rank, enqueued_ms) of a ``head_call`` reply, None when a pop would find nothing."""
        return (int(reply[0]), int(reply[1])) if reply else None

    def retrieve_highest_priority(self) -> str | None:
        """RETRIEVE HIGHEST PRIORITY: the id of the next entry, or None."""
        head = self.peek(1)
        return head[0].id if head else None

    def retrieve_by_priority(self, priority: int) -> str | None:
        """RETRIEVE BY PRIORITY: the id of the first waiting entry of that priority, or None."""
        reply = self._run("retrieve_by_priority", self._keys("retrieve_by_priority"),
                          [self.rank(priority), C.POP_STALE_BUDGET])
        return decode_id(reply[0]) if reply else None

    def remove_highest_priority(self) -> Entry | None:
        """REMOVE HIGHEST PRIORITY: take the next entry and delete it, with no lease."""
        if self.fair:
            raise ValueError("remove_highest_priority takes no tenant turn; use pop and ack on a fair queue")
        reply = self._run("remove_highest", self._keys("remove_highest"), [C.POP_STALE_BUDGET])
        return self._entry(*reply) if reply else None

    def cleanup(self, count: int = 1000) -> int:
        """Lazy deletion's clean-up sweep: look at up to ``count`` pointers of each priority,
        from where the last sweep of it stopped, and drop the stale ones (in steps of
        ``C.COMPACT_STEP`` pointers, one script call each); returns how many were dropped."""
        k = self.keys
        removed = 0
        for rank in self.client.zrange(k.pi, 0, -1):
            seen = 0
            while seen < count:
                n = min(C.COMPACT_STEP, count - seen)
                gone, looked, more = self._run("cleanup", self._keys("cleanup"), [int(rank), n])
                removed += int(gone)
                seen += int(looked)
                if not more or not looked:
                    break
        return removed

    def purge(self) -> int:
        """Delete every waiting entry (leased ones stay leased); returns how many."""
        total = 0
        while True:
            deleted, taken = self._run("purge", self._keys("purge"),
                                       [C.STEP_CHUNK])
            total += int(deleted)
            if not taken:
                return total

    def delete(self) -> None:
        """Drop every key of this queue (waiting and leased entries alike)."""
        self.client.delete(*self.keys.all())

    # -- what operators look at and replay (the command line, metrics, the autoscaler) ---------
    def replay(self, ids: Sequence[str]) -> dict:
        """Dead letters of ``<queue>.dead`` back to this queue, each atomically, keeping priority,
        tenant and payload, with the delivery count reset (``replay.lua``). ``ids`` are the ids
        the dead-letter queue shows. Returns ``{"replayed": {dead id: live id}, "missing": [...],
        "leased": [...], "refused": [...]}``; refused ones stay dead (``max_length`` reached)."""
        if self.is_dead:
            raise ValueError(f"{self.name!r} is a dead-letter queue: replay its live queue")
        ids = list(ids)
        for i in ids:
            _text("id", i)
        out: dict = {"replayed": {}, "missing": [], "leased": [], "refused": []}
        for start in range(0, len(ids), C.STEP_CHUNK):
            part = ids[start : start + C.STEP_CHUNK]
            reply = self._run("replay", self._keys("replay"),
                              [self.max_length or 0, *(encode_id(i) for i in part)])
            for i, r in zip(part, reply):
                if not isinstance(r, int):
                    out["replayed"][i] = decode_id(r)
                else:
                    out[{ErrorCode.NOT_FOUND: "missing", ErrorCode.NOT_WAITING: "leased"}.get(r, "refused")].append(i)
        return out

    def leases(self, limit: int = 1000) -> list[dict]:
        """The leases held now, earliest deadline first (at most ``limit``): ``id``, ``consumer``,
        ``deliveries``, ``priority``, ``tenant``, ``deadline_ms``, ``seconds_left`` and
        ``age_seconds`` (since the entry was enqueued: a lease records no delivery time), on
        Redis's clock. Never the tokens: a token is what acks."""
        _count("limit", limit, none=False)
        with self._pipeline(transaction=False) as p:
            p.zrange(self.keys.lz, 0, limit - 1, withscores=True)
            p.time()
            held, (sec, usec) = p.execute()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        if not held:
            return []
        eids = [eid for eid, _ in held]
        with self._pipeline(transaction=False) as p:
            p.hmget(self.keys.lt, eids)
            p.hmget(self.keys.ii, eids)
            records, values = p.execute()
        out = []
        for (eid, deadline), info, value in zip(held, records, values):
            lease = None if info is None else split_lease(info)
            if lease is None:
                continue
            entry = split_entry(value) if value else None
            out.append({"id": decode_id(eid), "consumer": lease.consumer, "deliveries": lease.deliveries,
                        "priority": self.priority_of_score(lease.score),
                        "tenant": unescape_tenant(_s(lease.tenant)) if lease.tenant else None,
                        "deadline_ms": int(deadline), "seconds_left": (deadline - now_ms) / 1000,
                        "age_seconds": (now_ms - entry[0].enqueued_ms) / 1000 if entry and entry[0].enqueued_ms else None})
        return out

    def peek_tenant(self, tenant: str, count: int = 10) -> list[Entry]:
        """The next ``count`` waiting entries of one tenant, in the order the tenant gives them
        (a fair queue's tenant order)."""
        if not self.fair:
            raise ValueError(f"queue {self.name!r} is not fair: its entries carry no tenant")
        _count("count", count, none=False)
        t = escape_tenant(tenant)
        members = self.client.zrangebylex(self.keys.te, f"[{t}\0", f"({t}\1", start=0, num=count)
        parsed = [m for m in (split_tenant_member(x) for x in members) if m]
        values = self.client.hmget(self.keys.ii, [m[3] for m in parsed]) if parsed else []
        out = []
        for (_, _, _, eid), value in zip(parsed, values):
            entry = split_entry(value) if value else None
            if entry:
                out.append(self._entry(eid, entry[0].score, value))
        return out

    def held_tenants(self, paused: dict | None = None) -> dict[str, str]:
        """{tenant: why} of the tenants of a fair queue that cannot be served now: ``"cap"``
        (at its concurrency cap), ``"rate"`` (waiting for its rate limit's next token) or
        ``"paused"``. ``paused`` is ``self.paused()`` when the caller has it."""
        if not self.fair:
            return {}
        why = {"C": "cap", "R": "rate", "P": "paused"}
        out = {unescape_tenant(_s(t)): why[_s(state)[:1]] for t, state in self.client.hgetall(self.keys.tb).items()
               if _s(state)[:1] in why}
        for t in (paused or self.paused())["tenants"]:
            out[t] = "paused"
        return out

    def backlog(self, view: tuple[int, int] | None = None) -> int:
        """Due waiting entries a consumer of this queue (or of the priority view ``view``, a
        rank range) could take now: 0 while the queue is paused; delayed entries are not
        counted, nor the entries of tenants held back by their concurrency cap, rate limit or
        a pause.

        Whole queue: exact. A view of a plain queue counts the pointers of its ranks (technique
        S leaves a removed entry's pointer behind until a pop passes it), capped at the waiting
        total; a view of a fair queue counts each schedulable tenant's entries in its ranks."""
        lo, hi = self._check_view(view)
        whole = (lo, hi) == (0, C.MAX_PRIORITY)
        k = self.keys
        paused = self.paused()
        if paused["queue"]:
            return 0
        with self._pipeline(transaction=False) as p:
            p.hlen(k.ii)
            p.hlen(k.lt)
            p.zcard(k.dz)
            if not whole and not self.fair:
                p.zrangebyscore(k.pi, lo, f"({hi + 1}")  # (a rank's score is rank + 0.5 during a compaction pass)
            res = p.execute()
        waiting = max(0, res[0] - res[1] - res[2])
        if not self.fair:
            if whole:
                return waiting
            ranks = [int(r) for r in res[3]]
            with self._pipeline(transaction=False) as p:
                for rank in ranks:
                    p.llen(k.level(rank))
                    p.llen(k.front(rank))
                return min(waiting, sum(p.execute()))
        counts = {}
        for field, value in self.client.hgetall(k.fn).items():
            kind, _, t = _s(field).partition(":")
            if kind == "n":
                counts[t] = int(value)
        held = {escape_tenant(t) for t in self.held_tenants(paused)}
        takeable = [t for t in counts if t not in held]
        if whole:
            return min(waiting, sum(counts[t] for t in takeable))
        with self._pipeline(transaction=False) as p:
            for t in takeable:
                p.zlexcount(k.te, f"[{t}\0{lo:03d}", f"({t}\0{hi + 1:03d}")
            return sum(p.execute())

    # -- counts -------------------------------------------------------------------------------
    def lease_of(self, id: str) -> dict | None:
        """Who holds ``id``'s lease and for how long, or None when it is not leased: ``consumer``,
        ``deliveries``, ``deadline_ms`` and ``seconds_left`` (both on Redis's clock). Read in one
        MULTI; the lease token is not shown (it is what acks)."""
        eid = encode_id(id)
        with self._pipeline(transaction=True) as p:
            p.hget(self.keys.lt, eid)
            p.zscore(self.keys.lz, eid)
            p.time()
            info, deadline, (sec, usec) = p.execute()
        lease = None if info is None else split_lease(info)
        if lease is None or deadline is None:
            return None
        now_ms = sec * 1000 + usec // 1000
        return {"consumer": lease.consumer, "deliveries": lease.deliveries, "deadline_ms": int(deadline),
                "seconds_left": (deadline - now_ms) / 1000}

    def size(self) -> int:
        """Waiting entries (delayed ones not counted)."""
        with self._pipeline(transaction=False) as p:
            p.hlen(self.keys.ii)
            p.hlen(self.keys.lt)
            p.zcard(self.keys.dz)
            entries, leased, delayed = p.execute()
        return entries - leased - delayed

    def stats(self) -> dict:
        """waiting, leased, dead, per-priority counts, oldest waiting entry's age (seconds)."""
        k = self.keys
        with self._pipeline(transaction=False) as p:
            p.hlen(k.ii)
            p.hlen(k.lt)
            p.zcard(k.dz)
            if self._dead_keys:
                p.hlen(self._dead_keys.ii)
            p.time()
            res = p.execute()
        entries, leased, delayed = res[0], res[1], res[2]
        paused = self.paused()
        dead = res[3] if self._dead_keys else 0
        now_s, now_us = res[-1]
        per_priority: Counter = Counter()
        oldest_ms = None
        ranks = [int(r) for r in self.client.zrange(k.pi, 0, -1)]
        with self._pipeline(transaction=False) as p:  # pointers per priority (stale ones too)
            for rank in ranks:
                p.llen(k.level(rank))
                p.llen(k.front(rank))
            lengths = p.execute()
            for rank, n, f in zip(ranks, lengths[::2], lengths[1::2]):
                per_priority[self.priority_of_rank(rank)] += n + f
        indexed = sum(per_priority.values())
        head = self.peek(1)
        if head:
            oldest_ms = head[0].enqueued_ms
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        return {
            "queue": self.name,
            "waiting": entries - leased - delayed,
            "delayed": delayed,
            "leased": leased,
            "dead": dead,
            "index_members": indexed,
            "per_priority": dict(sorted(per_priority.items(), reverse=self.priority_order == C.HIGHER_FIRST)),
            "head_age_seconds": (now_ms - oldest_ms) / 1000 if oldest_ms else None,
            "per_tenant": self.tenant_stats(ages=True) if self.fair else {},
            "paused": paused["queue"],
            "paused_tenants": paused["tenants"],
        }

    # -- counters, pause, the event log ----------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """The counters the scripts keep (hash ct): every name of ``COUNTERS`` (0 until it
        happens) and any other field there (``malformed``, ``dead_dropped``)."""
        out = dict.fromkeys(COUNTERS, 0)
        out.update({_s(k): int(v) for k, v in self.client.hgetall(self.keys.ct).items()})
        return out

    def tenant_deliveries(self) -> dict[str, int]:
        """{tenant: deliveries so far} of a fair queue (hash td, kept by its pops)."""
        return {unescape_tenant(_s(k)): int(v) for k, v in self.client.hgetall(self.keys.td).items()}

    def pause(self, tenant: str | None = None) -> bool:
        """Stop delivering the queue (or, on a fair queue, one tenant's entries) to every
        consumer; inserts go on. True when it was not paused yet."""
        return self._set_paused(True, tenant)

    def resume(self, tenant: str | None = None) -> bool:
        """Deliver again what ``pause`` held back; idle consumers are woken at once. True when
        it was paused."""
        return self._set_paused(False, tenant)

    def _set_paused(self, paused: bool, tenant: str | None) -> bool:
        if tenant is not None:
            _text("tenant", tenant)
            if not self.fair:
                raise ConfigError(f"queue {self.name!r} is not fair: only a fair queue pauses one tenant "
                                  f"(pause the whole queue with tenant=None)")
        return bool(self._run("pause", self._keys("pause"), ["1" if paused else "0", escape_tenant(tenant or "")]))

    def paused(self) -> dict:
        """{"queue": whether the queue is paused, "tenants": the paused tenants, sorted}."""
        with self._pipeline(transaction=False) as p:
            p.get(self.keys.md)
            p.hkeys(self.keys.fc)
            record, fields = p.execute()
        tenants = sorted(unescape_tenant(_s(f)[2:]) for f in fields if _s(f).startswith("p:"))
        return {"queue": split_switches(_s(record))[0] if record is not None else False, "tenants": tenants}

    @property
    def events_key(self) -> str:
        """The Redis stream of this queue's event log (docs/events.md)."""
        return self.keys.ev

    def event_log_cap(self) -> int:
        """The event-log cap the queue recorded (0: the log is off)."""
        record = self.client.get(self.keys.md)
        return 0 if record is None else split_switches(_s(record))[1]

    def set_event_log(self, cap: int | None) -> int:
        """Switch the queue's event log on with this cap, or off with None/0, for every process
        (the stream is kept); returns the cap in force before. A process whose own
        ``event_log`` is set switches it on again at its next call."""
        _count("event_log", cap, low=0)
        return int(self._run("event_log", self._keys("event_log"), [int(cap or 0)]))

    def events(self, start: str = "-", end: str = "+", count: int | None = None) -> list[dict]:
        """Entries of the event log from stream id ``start`` to ``end`` (inclusive; ``"("``
        before an id excludes it), at most ``count``: dicts of the fields of docs/events.md,
        strings but ``p``, ``k``, ``n`` and ``ms`` (int, None when empty), with ``sid``, the
        stream id."""
        _count("count", count)
        out = []
        for sid, fields in self.client.xrange(self.keys.ev, start, end, count):
            row = {"sid": _s(sid)}
            for k, v in fields.items():
                k, v = _s(k), v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                row[k] = (int(v) if v else None) if k in _EVENT_INTS else v
            out.append(row)
        return out

    # -- the patent's cost explanation (see costs.py) ------------------------------------------
    explain = staticmethod(explain)


def _when(delay: float | None, due_ms: int | None) -> str:
    """The insert script's due field: "0" now, "+<ms>" from Redis's now, or absolute Unix ms."""
    if delay is not None and due_ms is not None:
        raise ValueError("give delay or due_ms, not both")
    if delay is not None:
        return f"+{int(_seconds('delay', delay, zero=True) * 1000)}"
    if due_ms is not None:
        if isinstance(due_ms, bool) or not isinstance(due_ms, int) or not 0 <= due_ms <= MAX_DUE_MS:
            raise ValueError(f"due_ms must be a Unix time in milliseconds, 0..{MAX_DUE_MS}, got {due_ms!r}")
        return str(due_ms)
    return "0"


#: Units of virtual time a delivery costs a tenant of weight 1 (fair.lua's VT_UNIT); a tenant of
#: weight w moves on by round(VT_PER_DELIVERY / w) units per delivery.
VT_PER_DELIVERY = 1_000_000
#: Fair weights the start tags can carry: a delivery costs 1,000,000 / weight units of virtual
#: time, kept in 17 digits; a weight above 10,000 would round the cost toward nothing (to 0
#: above 2,000,000: such a tenant would be served without end), one below 0.01 would run the
#: tags out of digits after 1e9 deliveries.
MIN_WEIGHT, MAX_WEIGHT = 0.01, 10_000
#: The rates a tenant may be given, deliveries per second: one per 1,000 s at the least; beyond a
#: million a rate limits nothing.
MIN_RATE, MAX_RATE = 0.001, 1_000_000


def _tenant_setting(label: str, tenant: str, value):
    """A tenant's weight, concurrency cap or rate, checked."""
    if label == "weights":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_WEIGHT <= value <= MAX_WEIGHT:
            raise ValueError(f"weights[{tenant!r}] must be a number from {MIN_WEIGHT} to {MAX_WEIGHT}, "
                             f"got {value!r}")
        return value
    if label == "concurrency":
        return _count(f"concurrency[{tenant!r}]", value, none=False)
    return _number(f"rate[{tenant!r}]", value, low=MIN_RATE, allow_low=True, high=MAX_RATE)


class Popped(list):
    """The leases one pop took, in delivery order (a list), and ``acked``: the codes of the
    acks that call carried (see ``PriorityQueue.pop``), and ``queue``: the queue they came from
    (a shard, for a sharded queue: see ``shards.py``)."""

    acked: list[int] = []
    queue: "PriorityQueue | None" = None


def pop_with_acks(queue: PriorityQueue, count: int = 1, *, acks: dict | None = None, lean: bool = False,
                  **pop_args) -> tuple[Popped, dict]:
    """One pop of ``queue`` and the acks of several queues, in one round trip.

    ``acks`` maps queues to ``(entry id, token)`` pairs; ``pop_args`` are ``PriorityQueue.pop``'s.
    The popping queue's own acks ride in its pop script, the others' in ack scripts pipelined
    before it. Returns the leases and ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value,
    one per pair, in order). ``lean``: ``Delivery`` tuples instead of leases.
    """
    acks = acks or {}
    others = [(q, pairs) for q, pairs in acks.items() if q is not queue and pairs]
    own = acks.get(queue, ())
    calls = [q.ack_call(pairs) for q, pairs in others]
    calls.append(queue.pop_call(count, acks=own, **pop_args))
    if own or others:
        replies = run_acks(queue.client, calls, [queue, *(q for q, _ in others)])
    else:
        replies = run_calls(queue.client, calls)
    reply = replies.pop()
    codes = {q: list(r) for (q, _), r in zip(others, replies)}
    if own:
        codes[queue] = queue.ack_codes(reply)
    popped = Popped(queue.parse_deliveries(reply) if lean else queue.parse_pop(reply))
    popped.queue = queue
    return popped, codes


def ack_all(acks: dict) -> dict:
    """The acks of several queues, ``{queue: [(entry id, token), ...]}``, in one round trip;
    ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value, one per pair, in order)."""
    batches = [(q, pairs) for q, pairs in acks.items() if pairs]
    if not batches:
        return {}
    replies = run_acks(batches[0][0].client, [q.ack_call(pairs) for q, pairs in batches], [q for q, _ in batches])
    return {q: list(r) for (q, _), r in zip(batches, replies)}


def _partial(exc: Exception, ids: list, items: list, made: list, why: str) -> Exception:
    """``exc`` of a failed ``insert_many``, saying which items were stored."""
    exc.stored = list(ids)
    exc.items = [(p, pr, i, t, None if d == "0" else int(d), given, task)
                 for (p, pr, i, t, d, _, task), given, eid in zip(items, made, ids) if eid is None]
    done = sum(1 for x in ids if x is not None)
    exc.add_note(f"insert_many stored {done} of {len(ids)} items before this (exc.stored); {why}; "
                 "exc.items are the items not known to be stored")
    return exc


def _pair(x) -> tuple[str, str]:
    """(entry id, token) of a Lease or of such a pair, checked."""
    if isinstance(x, Lease):
        return x.id, x.token
    if not isinstance(x, (tuple, list)) or len(x) != 2 or \
            not all(isinstance(v, str) and v for v in x):
        raise ValueError(f"a lease is a Lease or an (entry id, token) pair of non-empty strings, got {x!r}")
    return x[0], x[1]
