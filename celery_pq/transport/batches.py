"""kombu's ``Producer.batch()``: each publish is checked as a single one; every ``batch_send`` items of a
plain queue go as one insert call read at ``flush``, other queues by ``insert_many`` there. docs/publishing.md."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any, NamedTuple, Protocol, cast

from ..queue import Item, PriorityQueue, Producer, batch_call
from ..queue.values import mark_stored
from ..scripts.wire import LOST, CallStream
from ..storage import constants as C
from ..storage.connections import is_cluster


class BatchingChannel(Protocol):
    """What a publish batch uses of its channel (channel.py's ``Channel``)."""

    options: Any
    deadletter_queue: Any

    def queue(self, name: str) -> Producer: ...

    def typeof(self, exchange) -> Any: ...

    def get_table(self, exchange) -> Any: ...

    def basic_publish(self, message, exchange, routing_key, **kwargs) -> Any: ...

    def _put(self, queue: str, message: dict, **kwargs) -> Any: ...

    def _inplace_augment_message(self, message: dict, exchange, routing_key) -> Any: ...


class _Sent(NamedTuple):
    """A sub-chunk written to the stream, its reply not read yet."""

    queue: str
    items: list  # kept again unless the reply says they are stored
    read: Callable  # reads its reply (``queue.batch_call``)


class PublishBatch:
    """The items of one producer batch, per queue, until ``flush``."""

    def __init__(self, channel: BatchingChannel, max_size: int):
        self.channel = channel
        self.max_size = max_size
        self._pending: dict[str, list[Item]] = {}  # queue -> items not yet sent, in publish order
        self._sent: list[_Sent] = []  # in the order sent
        self._stream: CallStream | None = None
        self._streams: dict[str, bool] = {}  # queue -> ``_streamed``
        self._round_trips = False  # a send was lost: the rest of this flush takes the round-trip path
        self._send_at = channel.options.batch_send
        #: (exchange, routing key) -> its queues, until the next flush
        self._routes: dict[tuple[str | None, str | None], list[str]] = {}
        self._count = 0  # items not known to be stored
        self._aborted = False
        self._closed = False
        #: Messages stored, and those found stored already (sent again).
        self.stored = 0
        self.repeated = 0

    def __len__(self) -> int:
        """Items not known to be stored yet (waiting, or sent without a reply yet)."""
        return self._count

    # -- kombu's hooks ------------------------------------------------------------------------
    def publish(self, message: dict, **kwargs) -> None:
        """Route one prepared message as ``basic_publish`` does; fanout is sent at once."""
        self._check_usable()
        exchange, routing_key = kwargs.get("exchange"), kwargs.get("routing_key")
        queues = self._routes.get((exchange, routing_key)) if exchange else None
        if queues is None:
            self.channel.basic_publish(message, _publish_batch=self, **kwargs)
            kind = self.channel.typeof(exchange) if exchange else None
            if kind is not None and kind.type in ("direct", "topic"):  # (a fanout one went at once)
                # the exchange's own lookup: no default queue, no warning (basic_publish gave those)
                found = kind.lookup(self.channel.get_table(exchange), exchange, routing_key, None)
                queues = [q for q in found if q and q != self.channel.deadletter_queue]
                if queues:
                    self._routes[(exchange, routing_key)] = queues
        else:  # basic_publish's work, the routing from this batch's cache
            self.channel._inplace_augment_message(message, exchange, routing_key)
            for queue in queues:
                self.channel._put(queue, message, _publish_batch=self)
        if self._count >= self.max_size:
            self.flush()

    def flush(self) -> None:
        """Store every waiting item; a failure raises, keeping those not known to be stored (flush again)."""
        self._check_usable()
        self._routes.clear()
        if self._stream is not None or self._sent or any(self._streamed(n) for n in self._pending):
            self._flush_stream()
        while self._pending:
            name, items = next(iter(self._pending.items()))
            try:
                _, repeated = self.channel.queue(name).insert_many(items, repeats=True, remember=False)
            except Exception as exc:
                left = getattr(exc, "items", None)
                if left is not None:  # the rest of this queue's items stay
                    self.stored += sum(1 for eid in getattr(exc, "stored", ()) if eid is not None)
                    del self._pending[name]
                    self._count -= len(items) - len(left)
                    if left:
                        self._pending[name] = list(left)
                self._noted(exc)
                raise
            del self._pending[name]
            self._done(len(items), sum(repeated))
        self._round_trips = False

    def discard(self) -> None:
        """Drop the items not sent (the ``with`` block raised), after reading the replies due."""
        self._aborted = True
        self._drop()

    def close(self) -> None:
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        """Read the replies due (counted; errors dropped with the items), then drop what waits."""
        if self._stream is not None or self._sent:
            with suppress(Exception):  # (the stream is closed either way)
                self._settle_all(None)
        self._pending.clear()
        self._count = 0

    # -- what Publisher.put calls ---------------------------------------------------------------
    def add(self, queue: str, item: Item) -> None:
        """One message routed to ``queue``, stored by the next send or flush."""
        items = self._pending.setdefault(queue, [])
        items.append(item)
        self._count += 1
        if self._send_at and len(items) >= self._send_at and self._streamed(queue):
            self._send(queue)

    # -- sub-chunks sent now, replies read at the flush ------------------------------------------
    def _streamed(self, name: str) -> bool:
        """Does ``name`` send sub-chunks? A plain queue, no ``wait_replicas``, no cluster, no send lost."""
        if self._round_trips:
            return False
        known = self._streams.get(name)
        if known is None:
            q = self.channel.queue(name)
            known = self._streams[name] = (
                isinstance(q, PriorityQueue) and not q.settings.wait_replicas and not is_cluster(q.client)
            )
        return known

    def _send(self, name: str) -> None:
        """Write ``name``'s waiting items as insert calls, replies read at the flush. A lost connection
        keeps every sent call's items (publish ids tell the stored) and the flush goes on by round trips."""
        items = self._pending.pop(name)
        q = cast(PriorityQueue, self.channel.queue(name))  # (streamed: a plain queue)
        if self._stream is None:
            with suppress(*LOST):
                self._stream = CallStream.open(q.client)
            if self._stream is None:
                self._pending[name] = items
                self._round_trips = True
                return
        size = self._send_at or C.BATCH_SEND
        for i in range(0, len(items), size):
            part = items[i : i + size]
            try:
                call, read = batch_call(q, part)
            except ValueError:  # the flush's insert_many names the item refused
                self._pending[name] = items[i:]
                self._round_trips = True
                return
            self._sent.append(_Sent(name, part, read))
            try:
                self._stream.send(*call)
            except LOST as exc:
                self._pending[name] = items[i + len(part) :]
                self._settle_all(exc)
                self._round_trips = True
                return

    def _flush_stream(self) -> None:
        """Send the rest, read each reply; raise the first failure (a lost link first) with what its queue stored."""
        for name in [n for n in self._pending if self._streamed(n)]:
            if self._round_trips:
                break
            self._send(name)
        error, stored = self._settle_all(None)
        if error is None:
            return
        name, exc = error
        kept = list(self._pending.get(name, ()))
        ids: list = [eid for done in stored.get(name, ()) for eid in done.ids()]
        mark_stored(exc, ids + [None] * len(kept), kept)
        exc.add_note(
            f"publish batch: queue {name!r}: {len(ids)} message(s) of this flush stored "
            "(exc.stored), the items not stored are exc.items"
        )
        raise self._noted(exc)  # (not in an except clause)

    def _settle_all(self, lost: BaseException | None) -> tuple[tuple[str, Exception] | None, dict]:
        """Read the replies due (none when ``lost``), count the stored, keep the items not stored (ahead of
        those waiting), close the stream; (the first failure (queue, exc) or None, {queue: ``Inserted``s})."""
        sent, self._sent = self._sent, []
        stream, self._stream = self._stream, None
        back: dict[str, list] = {}
        stored: dict[str, list] = {}
        error: tuple[str, Exception] | None = None
        settled = 0
        try:
            for s in sent:
                if lost is None:
                    try:
                        reply = stream.read()  # type: ignore[union-attr]  # (sent: a stream is open)
                    except Exception as exc:  # the stream is broken
                        lost = exc
                try:
                    done = s.read(reply if lost is None else lost)
                except Exception as exc:
                    done = None
                    if error is None or (exc is lost and error[1] is not lost):
                        error = (s.queue, exc)
                settled += 1
                if done is None:
                    back.setdefault(s.queue, []).extend(s.items)
                    continue
                self._done(len(done), done.repeated)
                stored.setdefault(s.queue, []).append(done)
        finally:
            for s in sent[settled:]:  # (an interrupt: kept, maybe stored)
                back.setdefault(s.queue, []).extend(s.items)
            if stream is not None:
                stream.close()
            for name, items in back.items():
                self._pending[name] = items + self._pending.pop(name, [])
        return error, stored

    def _noted(self, exc: Exception) -> Exception:
        exc.add_note(
            f"publish batch: {self._count} message(s) not known to be stored are still in the batch "
            f"(queues {sorted(self._pending)}); flush() again sends them, each stored once"
        )
        return exc

    def _done(self, n: int, repeated: int) -> None:
        """``n`` items known to be stored now, ``repeated`` of them found stored already."""
        self._count -= n
        self.repeated += repeated
        self.stored += n - repeated

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this publish batch is closed")
        if self._aborted:
            raise RuntimeError("this publish batch was discarded")
