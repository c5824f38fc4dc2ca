"""INSERT: one ``Item`` (``put``), many in pipelined chunks (``insert_many``), a publish batch's
call (``batch_call``); publish ids store a retried call once (docs/leases.md, "Publishing exactly once")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import NoScriptError

from ..scripts import FIRST_SEND
from ..scripts.wire import function_missing
from ..storage import constants as C
from ..storage.errors import ErrorCode, NotReplicated, QueueFull, raise_for
from ..storage.ids import unique_bytes
from . import calls
from .calls import ScriptCall
from .item import Item
from .running import run_waiting, translate_error
from .scripts import Scripts
from .unique import PublishOutcome, UniqueKey
from .values import mark_stored


def _sent(s: Scripts, item: Item) -> tuple[Item, bytes | None]:
    """(item, the publish id it is sent under: its own, or a new one when dedupe is on)."""
    if not isinstance(item, Item):
        raise TypeError(f"an insert takes Item objects, got {item!r}")
    pid = item.publish_id
    return item, pid if pid is not None or s.settings.dedupe_seconds <= 0 else unique_bytes()


def _check_reply(s: Scripts, reply, sent) -> bool:
    """Raise for a full queue; False when the view registry changed (refreshed: retry)."""
    if len(reply) >= 2 and isinstance(reply[0], int):
        if reply[0] == ErrorCode.QUEUE_FULL:
            raise_for(reply[0], s.name, size=int(reply[1]), limit=s.settings.max_length)
        if reply[0] == ErrorCode.TENANT_FULL:
            raise_for(
                reply[0],
                s.name,
                size=int(reply[1]),
                limit=s.settings.max_length_per_tenant,
                tenant=sent[int(reply[2])][0].tenant,
            )
        if reply[0] == ErrorCode.STALE_VIEWS:
            s.refresh_views()
            return False
    return True


def put(s: Scripts, item: Item, unique: UniqueKey | None, first_send: bool, remember: bool | None):
    if unique is not None and not isinstance(unique, UniqueKey):
        raise TypeError(f"unique must be a UniqueKey, got {type(unique).__name__}")
    sent = [_sent(s, item)]
    pid = s.last_publish_id = sent[0][1]
    forget_it = pid is not None and not (item.publish_id is not None if remember is None else remember)
    # a publish id made here, or by the caller for this send: nothing can be stored under it yet
    made = FIRST_SEND if item.publish_id is None or first_send else "0"
    specs = None if unique is None else {0: unique.spec}
    for _ in range(5):
        forget = s.answered.take()
        try:
            [reply], acked = run_waiting(s.client, [s.insert_call(sent, forget, made, specs)], [s])
        except BaseException:
            s.answered.add(forget)
            raise
        if forget_it:
            s.answered.add([pid])
        if _check_reply(s, reply, sent):
            s.check_replicated(acked)
            eid, kind = calls.insert_outcome(reply)
            if unique is None:
                return eid
            if kind is None:  # a repeat of a publish id seen before: what it stored then
                kind = "stored" if item.id is None or eid == item.id else "merged"
            requested = item.id if item.id is not None else eid if kind == "stored" else None
            return PublishOutcome(kind, eid, requested, unique.key)
    raise RuntimeError(f"queue {s.name!r}: the priority-view registry kept changing during insert")


def insert_many(
    s: Scripts, items: Iterable[Item], *, chunk: int = C.BULK_CHUNK, repeats: bool = False, remember: bool = True
) -> list[str] | tuple[list[str], list[bool]]:
    """Bulk INSERT in pipelined atomic calls of ``chunk`` items. On a failure ``exc.stored`` (an
    entry id or None per item) and ``exc.items`` (those not known to be stored) say what was
    stored. ``repeats=True``: ``(ids, repeated)``, the items whose publish id the queue had seen.
    ``remember=False``: their publish ids are forgotten once answered."""
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    items = list(items)
    sent = [_sent(s, item) for item in items]
    ids: list = [None] * len(sent)
    repeated = [False] * len(sent)
    pending = [(i, sent[i : i + chunk]) for i in range(0, len(sent), chunk)]
    made = {i for i, item in enumerate(items) if item.publish_id is None}
    while pending:
        # each chunk call forgets a share of the answered ids: at most FORGET_MAX, or a chunk's
        # worth when the caller forgets its own (a batch answers a chunk at a time)
        most = max(C.FORGET_MAX, chunk) if not remember else C.FORGET_MAX
        forgets = [s.answered.take(most) if n == 0 or not remember else [] for n in range(len(pending))]
        # a chunk whose publish ids were all made here: the first stands for it ("1"; the
        # pipeline may be sent again); else "R" (the reply marks repeats) or "0"
        kinds = [
            "1" if all(start + j in made for j in range(len(part))) else "R" if repeats else "0"
            for start, part in pending
        ]
        try:
            replies, acked = run_waiting(
                s.client,
                [s.insert_call(part, forget, kind) for (_, part), forget, kind in zip(pending, forgets, kinds)],
                [s],
            )
        except Exception as exc:
            s.answered.add([pid for forget in forgets for pid in forget])
            raise _partial(exc, ids, items, "chunks without a reply may or may not be stored") from None
        retry, failed = [], None
        for (start, part), reply in zip(pending, replies):
            try:
                if not _check_reply(s, reply, part):
                    retry.append((start, part))
                    continue
            except QueueFull as exc:
                failed = failed or exc
                continue
            for j, (eid, seen) in enumerate(calls.inserted(reply)):
                ids[start + j] = eid
                repeated[start + j] = seen
        if failed is not None:
            raise _partial(failed, ids, items, "chunks refused stored nothing")
        try:
            s.check_replicated(acked)
        except NotReplicated as exc:
            mark_stored(exc, list(ids), items)
            exc.add_note(
                "insert_many: exc.stored are the entry ids the master stored; exc.items are all the "
                "items, to publish again (with publish ids of their own, stored once)"
            )
            raise
        pending = retry
    # every made publish id has its reply: no retry of them can come (on a failure above they
    # stay remembered for the window); a chunk of made ones sent its first only
    s.answered.add(
        [sent[start][1] for start in range(0, len(sent), chunk) if start in made and sent[start][1] is not None]
    )
    if not remember:
        s.answered.add([item.publish_id for item in items if item.publish_id is not None])
    return (ids, repeated) if repeats else ids


def batch_call(queue, items: list[Item]) -> tuple[ScriptCall, Callable[[Any], calls.Inserted | None]]:
    """The insert call of a publish batch's items (each with its publish id) to ``queue``, and what
    reads its reply (or the exception in its place): what was stored, None to send it again."""
    s: Scripts = queue._scripts
    sent = [(item, item.publish_id) for item in items]
    forget = s.answered.take(max(C.FORGET_MAX, len(sent)))

    def read(reply) -> calls.Inserted | None:
        if isinstance(reply, Exception):
            s.answered.add(forget)  # (a call that did not run forgot nothing)
            if isinstance(reply, NoScriptError) or function_missing(reply):
                return None
            raise translate_error(reply)
        if not _check_reply(s, reply, sent):
            return None
        s.answered.add([pid for _, pid in sent if pid is not None])  # no resend of them can come
        return calls.Inserted(reply)

    return s.insert_call(sent, forget, "R"), read


def _partial(exc: Exception, ids: list, items: list[Item], why: str) -> Exception:
    mark_stored(exc, list(ids), [item for item, eid in zip(items, ids) if eid is None])
    exc.add_note(
        f"insert_many stored {sum(x is not None for x in ids)} of {len(ids)} items before this (exc.stored); {why}; "
        "exc.items are the items not known to be stored"
    )
    return exc
