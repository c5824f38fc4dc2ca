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

import os
import socket
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import redis

from . import constants as C
from .errors import EntryNotFound, ErrorCode, LeaseLost, NotWaiting, QueueFull
from .keys import dead_queue_name, queue_keys, split_dead
from .scripts import get_scripts


def validate_priority(priority) -> int:
    """An integer 0..255, or ValueError naming the value."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer 0..255, got {priority!r} ({type(priority).__name__})")
    if not C.MIN_PRIORITY <= priority <= C.MAX_PRIORITY:
        raise ValueError(f"priority {priority} is out of range {C.MIN_PRIORITY}..{C.MAX_PRIORITY}")
    return priority


def escape_tenant(tenant: str) -> str:
    return tenant.replace("%", "%25").replace(",", "%2C").replace("|", "%7C")


def unescape_tenant(text: str) -> str:
    return text.replace("%7C", "|").replace("%2C", ",").replace("%25", "%")


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


@dataclass
class Lease(Entry):
    """A delivered entry, leased to one consumer until acked, requeued or expired."""

    token: str = ""


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
        max_length: waiting entries allowed; ``None`` = no limit.
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
    ):
        if technique not in C.TECHNIQUES:
            raise ValueError(f"technique must be one of {C.TECHNIQUES}, got {technique!r}")
        if priority_order not in C.PRIORITY_ORDERS:
            raise ValueError(f"priority_order must be one of {C.PRIORITY_ORDERS}, got {priority_order!r}")
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"max_length must be a positive integer or None, got {max_length!r}")
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

    @property
    def scripts(self):
        return get_scripts(self.client)

    # -- priorities ---------------------------------------------------------------------------
    def rank(self, priority: int) -> int:
        """Rank 0 is served first."""
        p = validate_priority(priority)
        return C.MAX_PRIORITY - p if self.priority_order == C.HIGHER_FIRST else p

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
        )

    # -- decoding -----------------------------------------------------------------------------
    def _entry(self, eid, score, value, cls=Entry, **extra) -> Entry:
        value = _b(value)
        header, _, payload = value.partition(b"|")
        d, _s_, t, _x, r, ts = header.split(b",")
        dead_reason = dead_ms = None
        if r:
            reason, ms, _deliveries = _s(r).split("@")
            dead_reason, dead_ms = reason, int(ms)
        return cls(
            queue=self.name,
            id=_s(eid),
            priority=self.priority_of_score(score),
            payload=payload,
            deliveries=int(d or 0),
            tenant=unescape_tenant(_s(t)) if t else None,
            enqueued_ms=int(ts or 0),
            dead_reason=dead_reason,
            dead_ms=dead_ms,
            **extra,
        )

    # -- INSERT -------------------------------------------------------------------------------
    def _insert_args(self, items) -> list:
        args: list = [self.technique, self.max_length or 0]
        for payload, priority, id, tenant in items:
            if id is not None and (not isinstance(id, str) or not id):
                raise ValueError(f"entry id must be a non-empty string or None, got {id!r}")
            if tenant is not None and not isinstance(tenant, str):
                raise ValueError(f"tenant must be a string or None, got {tenant!r}")
            args += [id or "", self.rank(priority), escape_tenant(tenant or ""), _b(payload)]
        return args

    def _check_full(self, reply):
        if len(reply) == 2 and isinstance(reply[0], int) and reply[0] == ErrorCode.QUEUE_FULL:
            raise QueueFull(self.name, int(reply[1]), self.max_length)

    def insert(self, payload: bytes | str, priority: int = 0, *, id: str | None = None,
               tenant: str | None = None) -> str:
        """INSERT: returns the entry id (``id`` itself, or ``"<id>~<seq>"`` when taken)."""
        args = self._insert_args([(payload, priority, id, tenant)])
        k = self.keys
        reply = self.scripts.insert(keys=[k.ii, k.pi, k.lt, k.wk, k.sq, k.dp], args=args, client=self.client)
        self._check_full(reply)
        return _s(reply[0])

    def insert_many(self, items: Iterable[tuple], *, chunk: int = C.BULK_CHUNK) -> list[str]:
        """Bulk INSERT of ``(payload, priority[, id[, tenant]])`` tuples, in pipelined chunks.

        Each chunk is one atomic script call; ``max_length`` is checked per chunk.
        """
        norm = []
        for item in items:
            payload, priority, *rest = item
            rest += [None] * (2 - len(rest))
            norm.append((payload, priority, rest[0], rest[1]))
        k = self.keys
        keys = [k.ii, k.pi, k.lt, k.wk, k.sq, k.dp]
        out: list[str] = []
        with self.client.pipeline(transaction=False) as pipe:
            for i in range(0, len(norm), chunk):
                self.scripts.insert(keys=keys, args=self._insert_args(norm[i : i + chunk]), client=pipe)
            for reply in pipe.execute():
                self._check_full(reply)
                out.extend(_s(e) for e in reply)
        return out

    # -- RETRIEVE / pop with lease --------------------------------------------------------------
    def pop(self, count: int = 1, *, lease_seconds: float | None = None, consumer: str | None = None) -> list[Lease]:
        """Lease up to ``count`` entries in delivery order (empty list when none wait)."""
        k = self.keys
        lease_ms = int(1000 * (lease_seconds or self.lease_seconds))
        reply = self.scripts.pop(
            keys=[k.ii, k.pi, k.lz, k.lt, k.wk],
            args=[lease_ms, consumer or "", uuid.uuid4().hex[:16], int(count), C.POP_STALE_BUDGET],
            client=self.client,
        )
        return self.parse_pop(reply)

    def pop_args(self, count: int, lease_ms: int, consumer: str) -> tuple[list, list]:
        k = self.keys
        return [k.ii, k.pi, k.lz, k.lt, k.wk], [lease_ms, consumer, uuid.uuid4().hex[:16], count, C.POP_STALE_BUDGET]

    def parse_pop(self, reply) -> list[Lease]:
        leases = []
        for i in range(1, len(reply), 5):
            eid, token, d, score, value = reply[i : i + 5]
            lease = self._entry(eid, score, value, Lease, token=_s(token))
            lease.deliveries = int(d)
            leases.append(lease)
        return leases

    def ack(self, lease: Lease | tuple[str, str], *, strict: bool = False) -> bool:
        """Done: delete the entry. False (or LeaseLost with strict) if the lease was lost."""
        return self.ack_many([lease], strict=strict)[0]

    def ack_many(self, leases: Sequence, *, strict: bool = False) -> list[bool]:
        pairs = [_pair(x) for x in leases]
        if not pairs:
            return []
        k = self.keys
        args = [v for p in pairs for v in p]
        codes = self.scripts.ack(keys=[k.ii, k.lz, k.lt, k.dp], args=args, client=self.client)
        return self._codes(pairs, codes, strict)

    def _codes(self, pairs, codes, strict) -> list[bool]:
        out = []
        for (eid, _), code in zip(pairs, codes):
            if code == 1:
                out.append(True)
            elif strict:
                raise LeaseLost(self.name, eid, ErrorCode(code))
            else:
                out.append(False)
        return out

    def extend(self, leases: Sequence, lease_seconds: float | None = None, *, strict: bool = False) -> list[bool]:
        """Renew leases for ``lease_seconds`` from now (Redis clock)."""
        pairs = [_pair(x) for x in leases]
        if not pairs:
            return []
        k = self.keys
        lease_ms = int(1000 * (lease_seconds or self.lease_seconds))
        codes = self.scripts.extend(keys=[k.lz, k.lt], args=[lease_ms] + [v for p in pairs for v in p],
                                    client=self.client)
        return self._codes(pairs, codes, strict)

    def _requeue_keys(self) -> list[str]:
        k, d = self.keys, self._dead_keys
        if d is None:  # a dead-letter queue has no dead-letter queue: its own keys stand in
            d = k
        return [k.ii, k.pi, k.lz, k.lt, k.wk, k.dp, d.ii, d.pi, d.wk, d.sq]

    def requeue(self, lease: Lease | tuple[str, str], *, count_delivery: bool = True, strict: bool = False) -> str | None:
        """Back to Waiting at its original place; ``"dead"`` when max_deliveries is used up.

        ``count_delivery=False`` undoes the delivery (a consumer giving back work it never
        started). Returns ``"waiting"``, ``"dead"``, or None when the lease was lost.
        """
        return self._requeue(lease, count_delivery, "", strict)

    def dead_letter(self, lease: Lease | tuple[str, str], reason: str = "rejected", *, strict: bool = False) -> str | None:
        """Move a leased entry to ``<queue>.dead`` now, with a reason (no "," "@" "|")."""
        if not reason or any(c in reason for c in ",@|"):
            raise ValueError(f"dead-letter reason must be non-empty without ',', '@' or '|': {reason!r}")
        return self._requeue(lease, True, reason, strict)

    def _requeue(self, lease, count_delivery, reason, strict):
        eid, token = _pair(lease)
        code = self.scripts.requeue(
            keys=self._requeue_keys(),
            args=[eid, token, 1 if count_delivery else 0, self.max_deliveries, self.technique, reason],
            client=self.client,
        )
        if code == 1:
            return "waiting"
        if code == 2:
            return "dead"
        if strict:
            raise LeaseLost(self.name, eid, ErrorCode(code))
        return None

    def reclaim(self, *, limit: int = C.SWEEP_BATCH, guard_seconds: float = 0.0, consumer: str = "") -> dict:
        """Return expired leases (or all leases of ``consumer``) to Waiting or dead-letter them.

        With ``guard_seconds`` > 0, runs only if no other caller swept in that interval.
        """
        k, d = self.keys, self._dead_keys or self.keys
        returned, dead, skipped, more = self.scripts.reclaim(
            keys=[k.ii, k.pi, k.lz, k.lt, k.wk, k.dp, k.gd, d.ii, d.pi, d.wk, d.sq],
            args=[limit, self.max_deliveries, int(guard_seconds * 1000), self.technique, consumer],
            client=self.client,
        )
        return {"returned": returned, "dead": dead, "skipped": bool(skipped), "more": bool(more)}

    # -- REMOVE BY ID, priorities, peeks --------------------------------------------------------
    def remove(self, id: str) -> int:
        """REMOVE BY ID of waiting entries with this id or duplicates of it; returns how many."""
        k = self.keys
        removed, _leased = self.scripts.remove(keys=[k.ii, k.pi, k.lt, k.dp], args=[id, self.technique],
                                               client=self.client)
        return int(removed)

    def change_priority(self, id: str, priority: int) -> None:
        """Move a waiting entry to ``priority``, behind the entries already waiting there."""
        k = self.keys
        code = self.scripts.change_priority(keys=[k.ii, k.pi, k.lt, k.sq], args=[id, self.rank(priority), self.technique],
                                            client=self.client)
        if code == ErrorCode.NOT_FOUND:
            raise EntryNotFound(self.name, id)
        if code == ErrorCode.NOT_WAITING:
            raise NotWaiting(self.name, id)

    def peek(self, count: int = 1) -> list[Entry]:
        """The next ``count`` entries in delivery order, not leased."""
        k = self.keys
        reply = self.scripts.peek(keys=[k.ii, k.pi], args=[count, C.POP_STALE_BUDGET], client=self.client)
        return [self._entry(*reply[i : i + 3]) for i in range(0, len(reply), 3)]

    def retrieve_highest_priority(self) -> str | None:
        """RETRIEVE HIGHEST PRIORITY: the id of the next entry, or None."""
        head = self.peek(1)
        return head[0].id if head else None

    def retrieve_by_priority(self, priority: int) -> str | None:
        """RETRIEVE BY PRIORITY: the id of the first waiting entry of that priority, or None."""
        k = self.keys
        reply = self.scripts.retrieve_by_priority(keys=[k.ii, k.pi], args=[self.rank(priority), C.POP_STALE_BUDGET],
                                                  client=self.client)
        return _s(reply[0]) if reply else None

    def remove_highest_priority(self) -> Entry | None:
        """REMOVE HIGHEST PRIORITY: take the next entry and delete it, with no lease."""
        k = self.keys
        reply = self.scripts.remove_highest(keys=[k.ii, k.pi, k.wk, k.dp], args=[C.POP_STALE_BUDGET],
                                            client=self.client)
        return self._entry(*reply) if reply else None

    def cleanup(self, count: int = 1000, start: int = 0) -> int:
        """Technique S clean-up sweep over ``count`` members from the top; returns removed."""
        k = self.keys
        removed, _ = self.scripts.cleanup(keys=[k.ii, k.pi], args=[start, count], client=self.client)
        return int(removed)

    def purge(self) -> int:
        """Delete every waiting entry (leased ones stay leased); returns how many."""
        k = self.keys
        total = 0
        while True:
            deleted, taken = self.scripts.purge(keys=[k.ii, k.pi, k.wk, k.dp], args=[C.BULK_CHUNK], client=self.client)
            total += int(deleted)
            if not taken:
                return total

    def delete(self) -> None:
        """Drop every key of this queue (waiting and leased entries alike)."""
        self.client.delete(*self.keys.all())

    # -- counts -------------------------------------------------------------------------------
    def size(self) -> int:
        """Waiting entries."""
        with self.client.pipeline(transaction=False) as p:
            p.hlen(self.keys.ii)
            p.hlen(self.keys.lt)
            entries, leased = p.execute()
        return entries - leased

    def stats(self) -> dict:
        """waiting, leased, dead, per-priority counts, oldest waiting entry's age (seconds)."""
        k = self.keys
        with self.client.pipeline(transaction=False) as p:
            p.hlen(k.ii)
            p.hlen(k.lt)
            p.zcard(k.pi)
            if self._dead_keys:
                p.hlen(self._dead_keys.ii)
            p.time()
            res = p.execute()
        entries, leased, indexed = res[0], res[1], res[2]
        dead = res[3] if self._dead_keys else 0
        now_s, now_us = res[-1]
        per_priority: Counter = Counter()
        oldest_ms = None
        start = 0
        while True:  # one pass over the priority index in pages, counting per priority
            page = self.client.zrange(k.pi, start, start + 4999, withscores=True)
            for _, score in page:
                per_priority[self.priority_of_score(score)] += 1
            if len(page) < 5000:
                break
            start += 5000
        head = self.peek(1)
        if head:
            oldest_ms = head[0].enqueued_ms
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        return {
            "queue": self.name,
            "waiting": entries - leased,
            "leased": leased,
            "dead": dead,
            "index_members": indexed,
            "per_priority": dict(sorted(per_priority.items(), reverse=self.priority_order == C.HIGHER_FIRST)),
            "head_age_seconds": (now_ms - oldest_ms) / 1000 if oldest_ms else None,
        }

    # -- the patent's cost explanation ----------------------------------------------------------
    @staticmethod
    def explain(stale: int = 0) -> dict:
        """Redis reads and writes per operation and technique, on the steady path.

        The steady path: one entry, a new id, a wake token already waiting, no dead-lettering,
        and (technique S) ``stale`` priority-index members whose entry was removed by id lying
        in front of the one retrieved. A test checks these counts against INFO commandstats.
        """
        return {op: {t: _cost(cmds) for t, cmds in by_t.items()} for op, by_t in _commands(stale).items()}


READ_COMMANDS = frozenset({"hget", "hexists", "hlen", "llen", "zcard", "zrange", "zrangebyscore", "zscore", "get"})
WRITE_COMMANDS = frozenset({"hset", "hdel", "zadd", "zrem", "zpopmin", "incr", "rpush", "del", "set"})


def _cost(cmds: list[str]) -> dict:
    c = Counter(cmds)
    return {
        "reads": sum(n for cmd, n in c.items() if cmd in READ_COMMANDS),
        "writes": sum(n for cmd, n in c.items() if cmd in WRITE_COMMANDS),
        "commands": dict(sorted(c.items())),
    }


def _commands(stale: int) -> dict:
    """The Redis commands each script runs on the steady path (see ``explain``)."""
    k = stale
    both = lambda cmds: {"T": cmds, "S": cmds}  # noqa: E731
    return {
        "insert": both(["time", "incr", "hexists", "hset", "zadd", "llen"]),
        "pop": {
            "T": ["zpopmin", "hget", "time", "hset", "zadd", "zcard", "llen"],
            "S": ["zpopmin", "hget"] * k + ["zpopmin", "hget", "time", "hset", "zadd", "zcard", "llen"],
        },
        "ack": both(["hget", "hdel", "hdel", "zrem"]),
        "extend": both(["time", "hget", "zadd"]),
        "requeue": both(["hget", "hdel", "zrem", "hget", "hset", "zadd", "llen"]),
        "remove_by_id": {
            "T": ["hget", "hexists", "hdel", "zrem"],
            "S": ["hget", "hexists", "hdel"],
        },
        "change_priority": {
            "T": ["hexists", "incr", "hget", "hset", "zadd"],
            "S": ["hexists", "incr", "hexists", "zadd"],
        },
        "retrieve_highest_priority": {
            "T": ["zrange", "hget"],
            "S": ["zrange", "hget"] * k + ["zrange", "hget"],
        },
        "retrieve_by_priority": {
            "T": ["zrangebyscore", "hget"],
            "S": ["zrangebyscore", "hget", "zrem"] * k + ["zrangebyscore", "hget"],
        },
        "remove_highest_priority": {
            "T": ["zpopmin", "hget", "hdel"],
            "S": ["zpopmin", "hget"] * k + ["zpopmin", "hget", "hdel"],
        },
    }


def _pair(x) -> tuple[str, str]:
    if isinstance(x, Lease):
        return x.id, x.token
    eid, token = x
    return eid, token
