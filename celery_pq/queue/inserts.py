"""INSERT: one entry (``insert``) or many, pipelined in chunks (``insert_many``), with publish
ids that make a retried call store its entries once, and the registry of priority views an
insert wakes."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from redis.exceptions import NoScriptError

from .. import constants as C
from ..checks import seconds as _seconds
from ..errors import NotReplicated, QueueFull
from ..ids import unique_bytes
from ..scripts import Layout
from ..scripts.wire import function_missing
from . import calls
from .calls import ScriptCall
from .running import translate_error
from .values import MAX_DUE_MS, as_bytes, mark_stored
from .views import QueueViews


class AnsweredIds:
    """Publish ids whose inserts have replied (none of them can be retried now): the next insert
    calls have the script forget them, so the window of publish ids holds only unanswered ones
    and at most a batch more. Beyond FORGET_PENDING the oldest are not worth a command: the
    window's rotation drops them. (A deque: adding and taking are each atomic, no lock.)"""

    def __init__(self) -> None:
        self._ids: deque[bytes] = deque(maxlen=C.FORGET_PENDING)

    def take(self, most: int = C.FORGET_MAX) -> list:
        """Up to ``most`` of them, once FORGET_BATCH are waiting (else none): one call forgets
        them in one command."""
        ids = self._ids
        if len(ids) < C.FORGET_BATCH:
            return []
        out = []
        try:
            for _ in range(most):
                out.append(ids.popleft())
        except IndexError:  # (fewer than ``most``, or another thread took them)
            pass
        return out

    def add(self, pids) -> None:
        self._ids.extend(pids)

    def add_one(self, pid: bytes) -> None:
        self._ids.append(pid)


class QueueInserts(QueueViews):
    """The inserts of a queue, and the window of publish ids it has the scripts forget."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: The publish id of this queue object's last insert (to retry it by hand after an error).
        self.last_publish_id: bytes | None = None
        self._answered = AnsweredIds()
        self._head: tuple[list, Layout] | None = None  # calls.insert_head, made when first needed

    def insert_call(self, items, forget=(), made="0", unique=None) -> ScriptCall:
        """The insert call of checked ``items`` (``_item``), forgetting the publish ids
        ``forget``; ``made`` and ``unique`` as ``calls.insert_args`` takes them."""
        if self._head is None:
            self._head = calls.insert_head(self)
        keys, head = self._head
        return self.call("insert", keys, calls.insert_args(self, head, items, forget, made, unique))

    def _item(self, payload, priority, id=None, tenant=None, due="0", publish_id=None, task=None, expires="") -> tuple:
        """One insert, checked before anything is sent: (payload, priority, id, tenant, due,
        publish id, task, expires), with a new publish id when none is given and dedupe is on."""
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
            publish_id = as_bytes(publish_id)
        if task is not None and not isinstance(task, str):
            raise ValueError(f"task must be a task name (str) or None, got {task!r}")
        return payload, priority, id, tenant, due, publish_id, task, expires

    def _check_reply(self, reply, items) -> bool:
        """``calls.check_insert``, refreshing the views when they changed (then False: retry)."""
        if calls.check_insert(self, reply, items):
            return True
        self.refresh_views()
        return False

    def insert(
        self,
        payload: bytes | str,
        priority: int = 0,
        *,
        id: str | None = None,
        tenant: str | None = None,
        delay: float | None = None,
        due_ms: int | None = None,
        publish_id: bytes | str | None = None,
        first_send: bool = False,
        remember: bool | None = None,
        task: str | None = None,
        ttl: float | None = None,
        expires_ms: int | None = None,
    ) -> str:
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

        ``ttl`` (seconds from now, Redis clock) and ``expires_ms`` (absolute Unix time, ms) give
        the entry an expiry deadline, the earlier of the two: once it has passed, a pop never
        delivers the entry (it is dead-lettered with reason ``expired``, or dropped: the
        ``expired`` setting). A delay does not move the deadline.
        """
        options = (id, tenant, delay, due_ms, publish_id, first_send, remember, task, ttl, expires_ms)
        return self._insert_one(payload, priority, options, None)[0]

    def _insert_one(self, payload, priority, options: tuple, unique: tuple | None) -> tuple[str, str | None]:
        """``insert`` of ``payload`` at ``priority``, its ``options`` (``InsertOptions``, checked
        here) a tuple in their order (``insert_options``: a publish's path costs no keyword
        packing), with ``unique``: None, or (mode letter, ms, key) of its unique key
        (queue/unique.py): (entry id, the unique outcome or None)."""
        id, tenant, delay, due_ms, publish_id, first_send, remember, task, ttl, expires_ms = options
        # (a publish gives no delay and no deadline: those fields cost no call then)
        due = "0" if delay is None and due_ms is None else _when(delay, due_ms)
        expires = "" if ttl is None and expires_ms is None else _expiry(ttl, expires_ms)
        item = self._item(payload, priority, id, tenant, due, publish_id, task, expires)
        items = [item]
        pid = self.last_publish_id = item[5]
        forget_it = pid is not None and not (publish_id is not None if remember is None else remember)
        made = calls.insert_made(publish_id is None, first_send)
        specs = None if unique is None else {0: unique}
        for _ in range(5):
            forget = self._answered.take()
            try:
                [reply], acked = self.run_replicated([self.insert_call(items, forget, made, specs)])
            except BaseException:
                self._answered.add(forget)
                raise
            if forget_it:
                self._answered.add_one(pid)
            if self._check_reply(reply, items):
                self.check_replicated(acked)
                return calls.insert_outcome(reply)
        raise RuntimeError(f"queue {self.name!r}: the priority-view registry kept changing during insert")

    def insert_many(
        self, items: Iterable[tuple], *, chunk: int = C.BULK_CHUNK, repeats: bool = False, remember: bool = True
    ) -> list[str] | tuple[list[str], list[bool]]:
        """Bulk INSERT of ``(payload, priority[, id[, tenant[, due_ms[, publish_id[, task[,
        expires_ms[, ttl]]]]]]])`` tuples (``expires_ms``, ``ttl``: the expiry deadline, as
        ``insert`` takes them; ``ttl`` counts from the insert), in chunks of ``chunk`` (one
        atomic script call each), pipelined.

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

        ``remember=False``: the caller will not send these items again once they are stored
        (a producer's publish batch), so the publish ids of the caller's are forgotten, as
        ``insert``'s are, by the next insert calls (each chunk call forgets up to a chunk's
        worth): the window then costs memory only for items still without a reply. Items of a
        failed call stay remembered for the window (they are the ones sent again).
        """
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        items_given = list(items)
        norm = [self._bulk_item(item) for item in items_given]
        ids: list = [None] * len(norm)
        repeated = [False] * len(norm)
        pending = [(i, norm[i : i + chunk]) for i in range(0, len(norm), chunk)]
        made = {i for i, item in enumerate(items_given) if len(item) < 6 or item[5] is None}
        given = [None if i in made else norm[i][5] for i in range(len(norm))]  # the caller's publish ids
        while pending:
            # each chunk call forgets a share of the answered ids: at most FORGET_MAX, or a
            # chunk's worth when the caller forgets its own (a batch answers a chunk at a time)
            most = max(C.FORGET_MAX, chunk) if not remember else C.FORGET_MAX
            forgets = [self._answered.take(most) if n == 0 or not remember else [] for n in range(len(pending))]
            try:
                replies, acked = self.run_replicated(
                    [
                        self.insert_call(
                            part,
                            forget,
                            calls.insert_many_made(all(start + j in made for j in range(len(part))), repeats),
                        )
                        for (start, part), forget in zip(pending, forgets)
                    ]
                )
            except Exception as exc:
                self._answered.add([pid for forget in forgets for pid in forget])
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
                for j, (eid, seen) in enumerate(calls.inserted(reply)):
                    ids[start + j] = eid
                    repeated[start + j] = seen
            if failed is not None:
                raise _partial(failed, ids, norm, given, "chunks refused stored nothing")
            try:
                self.check_replicated(acked)
            except NotReplicated as exc:
                mark_stored(
                    exc,
                    list(ids),
                    [
                        (p, pr, i, t, None if d == "0" else int(d), g, task, *_expiry_fields(x))
                        for (p, pr, i, t, d, _, task, x), g in zip(norm, given)
                    ],
                )
                exc.add_note(
                    "insert_many: exc.stored are the entry ids the master stored; exc.items are all the "
                    "items, to publish again (with publish ids of their own, stored once)"
                )
                raise
            pending = retry
        # every made publish id has its reply: no retry of them can come (on a failure above
        # they stay remembered for the window); a chunk of made ones sent its first only
        self._answered.add(
            [norm[start][5] for start in range(0, len(norm), chunk) if start in made and norm[start][5] is not None]
        )
        if not remember:
            self._answered.add([pid for pid in given if pid is not None])
        return (ids, repeated) if repeats else ids

    def _bulk_item(self, item) -> tuple:
        """``_item`` of one ``insert_many`` tuple."""
        if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 9:
            raise ValueError(
                "insert_many takes (payload, priority[, id[, tenant[, due_ms[, publish_id"
                f"[, task[, expires_ms[, ttl]]]]]]]) tuples, got {item!r}"
            )
        payload, priority, *rest = item
        rest += [None] * (7 - len(rest))
        try:
            when, expires = _when(None, rest[2]), _expiry(rest[6], rest[5])
            return self._item(payload, priority, rest[0], rest[1], when, rest[3], rest[4], expires)
        except ValueError as exc:
            raise ValueError(f"insert_many item {item!r}: {exc}") from None

    def batch_call(self, items: list) -> tuple[ScriptCall, list]:
        """The insert call of ``insert_many`` tuples that carry their publish ids (a batch's
        sub-chunk: looked up, the reply marking repeats), forgetting a chunk's worth of answered
        ids; with the state ``batch_reply`` takes."""
        norm = [self._batch_item(item) for item in items]
        forget = self._answered.take(max(C.FORGET_MAX, len(norm)))
        return self.insert_call(norm, forget, "R"), [norm, forget]

    def _batch_item(self, item) -> tuple:
        """``_bulk_item`` of an item; one without expiry that plainly passes its checks (a
        batch's, made by ``messages.stored_item``) without the calls."""
        if len(item) == 9 and item[7] is None and item[8] is None:
            payload, priority, id, tenant, due_ms, pid, task = item[:7]
            if (
                type(payload) is bytes
                and (id is None or (type(id) is str and id))
                and (tenant is None or type(tenant) is str)
                and type(pid) is bytes
                and pid
                and (task is None or type(task) is str)
            ):
                self.rank(priority)  # (ValueError for a priority out of range)
                when = "0" if due_ms is None else _when(None, due_ms)
                return payload, priority, id, tenant, when, pid, task, ""
        return self._bulk_item(item)

    def batch_reply(self, reply, state: list) -> calls.Inserted | None:
        """What a ``batch_call``'s reply says was stored (``calls.Inserted``); None when nothing was
        stored and the call is to be made again (the registry of priority views changed, or the
        script was missing on the server); QueueFull (the queue's or a tenant's) or the script's error raised
        when refused (nothing stored); ``reply`` a connection error: raised (maybe stored)."""
        norm, forget = state
        if isinstance(reply, Exception):
            self._answered.add(forget)  # (a call that did not run forgot nothing)
            if isinstance(reply, NoScriptError) or function_missing(reply):
                return None
            raise translate_error(reply)
        if not self._check_reply(reply, norm):
            return None
        self._answered.add([item[5] for item in norm if item[5] is not None])  # no resend of them can come
        return calls.Inserted(reply)


def _when(delay: float | None, due_ms: int | None) -> str:
    """The insert script's due field: "0" now, "+<ms>" from Redis's now, or absolute Unix ms."""
    if delay is not None and due_ms is not None:
        raise ValueError("give delay or due_ms, not both")
    if delay is not None:
        return f"+{int(float(_seconds('delay', delay, zero=True) or 0) * 1000)}"
    if due_ms is not None:
        if isinstance(due_ms, bool) or not isinstance(due_ms, int) or not 0 <= due_ms <= MAX_DUE_MS:
            raise ValueError(f"due_ms must be a Unix time in milliseconds, 0..{MAX_DUE_MS}, got {due_ms!r}")
        return str(due_ms)
    return "0"


def _expiry(ttl: float | None, expires_ms: int | None) -> str:
    """The insert script's expires field: "" none, "+<ms>" from Redis's now, absolute Unix ms,
    or "<abs>+<ms>" (the earlier of the two)."""
    out = ""
    if expires_ms is not None:
        if isinstance(expires_ms, bool) or not isinstance(expires_ms, int) or not 0 <= expires_ms <= MAX_DUE_MS:
            raise ValueError(f"expires_ms must be a Unix time in milliseconds, 0..{MAX_DUE_MS}, got {expires_ms!r}")
        out = str(expires_ms)
    if ttl is not None:
        out += f"+{max(0, int(float(_seconds('ttl', ttl, zero=True) or 0) * 1000))}"
    return out


def _expiry_fields(expires: str) -> tuple[int | None, float | None]:
    """(expires_ms, ttl) of an expires field (``_expiry``'s inverse), for items given back."""
    absolute, plus, rel = expires.partition("+")
    return (int(absolute) if absolute else None), (int(rel) / 1000 if plus else None)


def _partial(exc: Exception, ids: list, items: list, made: list, why: str) -> Exception:
    """``exc`` of a failed ``insert_many``, saying which items were stored."""
    mark_stored(
        exc,
        list(ids),
        [
            (p, pr, i, t, None if d == "0" else int(d), given, task, *_expiry_fields(x))
            for (p, pr, i, t, d, _, task, x), given, eid in zip(items, made, ids)
            if eid is None
        ],
    )
    done = sum(1 for x in ids if x is not None)
    exc.add_note(
        f"insert_many stored {done} of {len(ids)} items before this (exc.stored); {why}; "
        "exc.items are the items not known to be stored"
    )
    return exc
