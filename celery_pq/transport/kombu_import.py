"""``pq import-kombu``: move what kombu's Redis transport holds for some queues into celery-pq,
each message exactly once (claimed into a staging list, inserted under a publish id, released),
so a rerun after a crash finishes the job. docs/migrating.md."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from hashlib import blake2b
from itertools import count

import redis

from ..queue import Item
from ..queue.values import as_text
from ..storage import checks
from ..storage import constants as C
from ..storage.errors import PQError
from .messages import stored_item

#: kombu's Redis transport defaults (kombu/transport/redis.py).
KOMBU_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
KOMBU_MAX_PRIORITY = 9  # kombu clamps a message's priority into 0..9
KOMBU_VISIBILITY_TIMEOUT = 3600.0  # seconds, when broker_transport_options does not say (never assumed)
#: The suffix (after kombu's separator) of a queue's staging list on the source Redis.
STAGING_SUFFIX = "pq-import"
#: Messages claimed, inserted and released per round trip (a crash leaves at most this many staged).
BATCH = 100
#: Messages read per LRANGE of a dry run.
READ_CHUNK = 1000
#: Seconds of a claim's age held back from the dedupe window, for the clocks of two servers.
CLOCK_MARGIN = 5.0


class StagedUnknown(PQError, ValueError):
    """Messages an interrupted import left staged longer ago than the queue's dedupe window,
    not in the queue now: never inserted, or inserted and delivered. ``queue``, ``task_ids``."""

    def __init__(self, queue: str, task_ids: list[str]):
        self.queue, self.task_ids = queue, task_ids
        shown = ", ".join(task_ids[:10]) + (", ..." if len(task_ids) > 10 else "")
        super().__init__(
            f"queue {queue!r}: {len(task_ids)} message(s) left staged by an interrupted import longer ago than "
            f"the queue's dedupe window, not in the queue now: inserted and run already, or never inserted "
            f"(task ids {shown}); check them (the result backend, the workers' logs) and rerun with "
            "--staged insert (to run them) or --staged drop (they ran)"
        )


@dataclass(frozen=True)
class KombuLayout:
    """Where kombu's Redis transport keeps a queue (its transport options of those names)."""

    global_keyprefix: str = ""
    sep: str = KOMBU_SEP
    priority_steps: tuple[int, ...] = KOMBU_PRIORITY_STEPS

    def list_key(self, queue: str, step: int) -> str:
        """The list of ``queue``'s priority step (kombu's ``_q_for_pri``)."""
        return self.global_keyprefix + (f"{queue}{self.sep}{step}" if step else queue)

    def staging_key(self, queue: str) -> str:
        return f"{self.global_keyprefix}{queue}{self.sep}{STAGING_SUFFIX}"

    def claimed_at_key(self, queue: str) -> str:
        """A string: Unix ms (the source Redis's clock) of the queue's latest claim."""
        return f"{self.global_keyprefix}{queue}{self.sep}{STAGING_SUFFIX}-at"

    @property
    def unacked(self) -> str:
        return self.global_keyprefix + "unacked"

    @property
    def unacked_index(self) -> str:
        return self.global_keyprefix + "unacked_index"

    def binding_key(self, exchange: str) -> str:
        return f"{self.global_keyprefix}_kombu.binding.{exchange}"


def kombu_priority(message: dict) -> int:
    """A kombu message's priority (0 served first) clamped into 0..9, 0 if none (kombu's ``_get_message_priority``)."""
    try:
        return max(0, min(int(message["properties"]["priority"]), KOMBU_MAX_PRIORITY))
    except (TypeError, ValueError, KeyError):
        return 0


def priority_map(priority_order: str, given: dict[int, int] | None = None) -> dict[int, int]:
    """kombu priority (0..9, 0 served first) -> celery-pq priority in kombu's order under ``priority_order``
    (``higher_first``: kombu's 0 becomes 9); ``given`` overrides single values."""
    flip = priority_order == C.HIGHER_FIRST
    out = {k: (KOMBU_MAX_PRIORITY - k if flip else k) for k in range(KOMBU_MAX_PRIORITY + 1)}
    for k, p in (given or {}).items():
        if not 0 <= k <= KOMBU_MAX_PRIORITY or not 0 <= p <= C.MAX_PRIORITY:
            raise ValueError(f"a priority map takes kombu 0..9 to 0..255, got {k}={p}")
        out[k] = p
    return out


def parse_priority_map(text: str | None) -> dict[int, int]:
    """``"0=255,3=200"`` -> ``{0: 255, 3: 200}``."""
    out: dict[int, int] = {}
    for part in filter(str.strip, (text or "").split(",")):
        k, _, p = part.partition("=")
        try:
            out[int(k)] = int(p)  # (no "=": p is "")
        except ValueError:
            raise ValueError(f"priority map entries are KOMBU=PQ integers, got {part!r}") from None
    return out


def publish_id(raw: bytes, message: dict) -> str:
    """A kombu message's publish id: its delivery tag (kept by kombu's restores), else a digest."""
    tag = (message.get("properties") or {}).get("delivery_tag")
    if isinstance(tag, str) and tag:
        return f"kombu-import:{tag}"
    return "kombu-import:" + blake2b(raw, digest_size=16).hexdigest()


@dataclass
class QueueReport:
    """What an import found (dry run) or moved for one queue; counters by (kombu, pq) priority."""

    queue: str
    waiting: Counter = field(default_factory=Counter)  # kombu's lists (and staged by a crashed run)
    unacked: Counter = field(default_factory=Counter)  # unacked, moved (or to move)
    held: int = 0  # unacked left alone: a worker may still hold them
    staged: int = 0  # found staged by an earlier run
    repeats: int = 0  # stored by an earlier, interrupted run (a repeated insert, or found in the queue)
    dropped: int = 0  # left staged by an earlier run, released without an insert (``staged="drop"``)
    eta: int = 0  # messages with an ETA (delayed entries in celery-pq)

    def as_dict(self) -> dict:
        rows = [
            {"source": src, "kombu_priority": k, "priority": p, "messages": n}
            for src, counter in (("waiting", self.waiting), ("unacked", self.unacked))
            for (k, p), n in sorted(counter.items())
        ]
        return {
            "queue": self.queue,
            "rows": rows,
            "moved": sum(self.waiting.values()) + sum(self.unacked.values()),
            "unacked_held": self.held,
            "staged": self.staged,
            "repeats": self.repeats,
            "dropped": self.dropped,
            "eta": self.eta,
        }


class KombuImport:
    """The import of ``queues`` from kombu's Redis transport (``source``, a redis-py client) into a celery-pq
    ``channel``. ``unacked``: ``"stale"`` moves the unacked messages older than ``visibility_timeout`` (the old workers'
    own, required: too short a guess runs live messages twice); ``"all"`` every one (only when no kombu worker runs);
    ``"none"``. ``staged``: what an interrupted run left staged past the queue's ``dedupe_seconds`` and not in the
    queue: ``"refuse"`` (StagedUnknown), ``"insert"`` or ``"drop"``. ValueError for a bad argument."""

    def __init__(
        self,
        source: redis.Redis,
        channel,
        queues: Iterable[str],
        *,
        layout: KombuLayout | None = None,
        priorities: dict[int, int] | None = None,
        unacked: str = "stale",
        visibility_timeout: float | None = None,
        batch: int = BATCH,
        staged: str = "refuse",
    ):
        if unacked not in ("stale", "all", "none"):
            raise ValueError(f"unacked must be 'stale', 'all' or 'none', got {unacked!r}")
        if unacked == "stale" and visibility_timeout is None:
            raise ValueError(
                "unacked='stale' moves the unacked messages delivered longer ago than the old workers' "
                "visibility_timeout: give it (visibility_timeout, seconds)"
            )
        visibility_timeout = checks.seconds("visibility_timeout", visibility_timeout, none=True)
        if staged not in ("refuse", "insert", "drop"):
            raise ValueError(f"staged must be 'refuse', 'insert' or 'drop', got {staged!r}")
        self.staged_policy = staged
        self.source = source
        self.channel = channel
        self.queues = list(dict.fromkeys(queues))
        if not self.queues:
            raise ValueError("name the queues to import")
        self.layout = layout or KombuLayout()
        self.given_priorities = dict(priorities or {})
        self.unacked_mode = unacked
        self.visibility_timeout = visibility_timeout if unacked == "stale" else None
        self.batch = batch
        self.reports = {q: QueueReport(q) for q in self.queues}

    # -- what a message becomes ---------------------------------------------------------------
    def _map(self, queue: str) -> dict[int, int]:
        return priority_map(self.channel.queue(queue).settings.priority_order, self.given_priorities)

    def item(self, queue: str, raw: bytes, mapping: dict[int, int]) -> tuple[Item, int, int]:
        """(the ``Item`` of ``raw``, kombu priority, celery-pq priority)."""
        message = json.loads(raw)
        k = kombu_priority(message)
        message = {**message, "properties": {**(message.get("properties") or {}), "priority": mapping[k]}}
        channel = self.channel
        item = stored_item(
            queue,
            message,
            channel.options,
            channel.decode_body,
            publish_id_=publish_id(raw, message).encode(),
            task_limits=channel.queue(queue).task_limits,
        )
        return item, k, mapping[k]

    # -- the run ------------------------------------------------------------------------------
    def run(self, dry_run: bool = False) -> list[QueueReport]:
        sec, usec = self.source.time()
        self._clock = (int(sec) + int(usec) / 1e6, time.monotonic())
        now = self._now()
        for queue in self.queues:
            if dry_run:
                self._count(queue, now)
            else:
                self.channel.queue_declare(queue=queue)
                self._move(queue, now)
        return [self.reports[q] for q in self.queues]

    def _now(self) -> float:
        """The source Redis's time (Unix seconds), from its TIME at the start of the run on."""
        start, mono = self._clock
        return start + (time.monotonic() - mono)

    def _move(self, queue: str, now: float) -> None:
        report, layout, src = self.reports[queue], self.layout, self.source
        mapping = self._map(queue)
        staging = layout.staging_key(queue)
        self._finish_staged(queue, staging, now, mapping)
        claimed_at = layout.claimed_at_key(queue)
        for step in layout.priority_steps:
            key = layout.list_key(queue, step)
            while True:
                with src.pipeline(transaction=False) as p:
                    p.set(claimed_at, int(self._now() * 1000))
                    for _ in range(self.batch):
                        p.lmove(key, staging, "RIGHT", "LEFT")
                    raws = [r for r in p.execute()[1:] if r is not None]
                if not raws:
                    break
                self._store(queue, staging, raws, mapping, report.waiting)
        claimed = []
        for tag, raw, message in self._unacked_of(queue, now, report):
            if self._claim_unacked(tag, raw, message, staging, claimed_at):
                claimed.append(message)
            if len(claimed) >= self.batch:
                self._store(queue, staging, claimed, mapping, report.unacked)
                claimed = []
        if claimed:
            self._store(queue, staging, claimed, mapping, report.unacked)

    def _finish_staged(self, queue: str, staging: str, now: float, mapping: dict) -> None:
        """Insert and release what an earlier run claimed (a repeat stores nothing within the dedupe
        window of the latest claim; later, one found in the queue is released, the rest follow ``staged``)."""
        report, src = self.reports[queue], self.source
        left = list(reversed(src.lrange(staging, 0, -1)))  # oldest first
        report.staged = len(left)
        if not left:
            return
        q = self.channel.queue(queue)
        at = src.get(self.layout.claimed_at_key(queue))
        if at is None or now - int(at) / 1000 + CLOCK_MARGIN >= q.settings.dedupe_seconds:
            found: list[bytes] = []
            unknown: list[bytes] = []
            for raw in left:
                tid = (json.loads(raw).get("headers") or {}).get("id")
                (found if tid and q.exists(str(tid)) else unknown).append(raw)
            self._release(staging, found)
            report.repeats += len(found)
            if unknown and self.staged_policy == "refuse":
                raise StagedUnknown(queue, [str((json.loads(r).get("headers") or {}).get("id")) for r in unknown])
            if self.staged_policy == "drop":
                self._release(staging, unknown)
                report.dropped += len(unknown)
                return
            left = unknown
        for i in range(0, len(left), self.batch):
            self._store(queue, staging, left[i : i + self.batch], mapping, report.waiting)

    def _release(self, staging: str, raws: list) -> None:
        with self.source.pipeline(transaction=False) as pipe:
            for raw in raws:
                pipe.lrem(staging, 1, raw)
            pipe.execute()

    def _store(self, queue: str, staging: str, raws: list, mapping: dict, counter: Counter) -> None:
        """Insert ``raws`` (oldest first), then release them from the staging list."""
        report = self.reports[queue]
        items = []
        for raw in raws:
            item, k, pq_priority = self.item(queue, raw, mapping)
            items.append(item)
            counter[(k, pq_priority)] += 1
            report.eta += item.due_ms is not None
        _, repeated = self.channel.queue(queue).insert_many(items, repeats=True)
        report.repeats += sum(repeated)
        self._release(staging, raws)

    # -- the unacked hash ---------------------------------------------------------------------
    def _routes(self, exchange: str, routing_key: str) -> list[str]:
        """The queues kombu's restore would push a message of (exchange, routing key) to."""
        rows = [as_text(m).split(self.layout.sep, 2) for m in self.source.smembers(self.layout.binding_key(exchange))]
        out = {q for rk, _, q in rows if rk == routing_key or not rk}
        if not out and not exchange:  # (kombu's default exchange: the queue the key names)
            out.add(routing_key)
        return sorted(out)

    def _unacked_of(self, queue: str, now: float, report: QueueReport):
        """(tag, raw value, message JSON) of ``queue``'s unacked messages to move; the rest held."""
        layout, src = self.layout, self.source
        routes: dict[tuple[str, str], list[str]] = {}
        for tag, value in src.hscan_iter(layout.unacked):
            try:
                message, exchange, routing_key = json.loads(value)
            except (ValueError, TypeError):
                continue
            key = (exchange or "", routing_key or "")
            if key not in routes:
                routes[key] = self._routes(*key)
            if queue not in routes[key]:
                continue
            if self.unacked_mode == "none" or len(routes[key]) > 1:  # (several: kombu's restore copies it)
                report.held += 1
                continue
            if self.visibility_timeout is not None:  # "stale": only those older than it
                since = src.zscore(layout.unacked_index, tag)
                if since is not None and since > now - self.visibility_timeout:
                    report.held += 1
                    continue
            yield tag, value, json.dumps(message).encode()

    def _claim_unacked(self, tag, value, message: bytes, staging: str, claimed_at: str) -> bool:
        """Move one unacked message into the staging list, if it is still there unchanged."""
        layout = self.layout

        def claim(pipe) -> bool:  # (run again after a WatchError: its last answer counts)
            if pipe.hget(layout.unacked, tag) != value:
                return False
            pipe.multi()
            pipe.hdel(layout.unacked, tag)
            pipe.zrem(layout.unacked_index, tag)
            pipe.lpush(staging, message)
            pipe.set(claimed_at, int(self._now() * 1000))
            return True

        return bool(self.source.transaction(claim, layout.unacked, value_from_callable=True))

    # -- a dry run ----------------------------------------------------------------------------
    def _count(self, queue: str, now: float) -> None:
        report, layout, src = self.reports[queue], self.layout, self.source
        mapping = self._map(queue)
        staging = layout.staging_key(queue)
        report.staged = src.llen(staging)
        for key in [staging] + [layout.list_key(queue, s) for s in layout.priority_steps]:
            for start in count(0, READ_CHUNK):
                raws = src.lrange(key, start, start + READ_CHUNK - 1)
                for raw in raws:
                    self._tally(raw, mapping, report, report.waiting)
                if len(raws) < READ_CHUNK:
                    break
        for _, _, message in self._unacked_of(queue, now, report):
            self._tally(message, mapping, report, report.unacked)

    def _tally(self, raw: bytes, mapping: dict, report: QueueReport, counter: Counter) -> None:
        message = json.loads(raw)
        k = kombu_priority(message)
        counter[(k, mapping[k])] += 1
        report.eta += bool((message.get("headers") or {}).get("eta"))
