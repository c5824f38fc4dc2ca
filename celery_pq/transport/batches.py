"""A producer's publish batch: kombu's ``Producer.batch()`` on this transport.

kombu 5.7 asks the channel for ``create_publish_batch(max_size)`` when a producer enters
``with producer.batch():``, hands each ``publish`` of the block to ``PublishBatch.publish``,
and calls ``flush`` when the block ends (``discard`` when it raises), then ``close``.

What a batched publish does, and what it keeps:

- Each ``publish`` goes through the channel exactly as a single publish does
  (``Channel.prepare_message``, ``basic_publish``, the exchange's routing, ``Publisher.put``):
  the same checks raise at the call (a bad priority, a message too large), with nothing
  buffered. Instead of an insert, ``Publisher.put`` hands the stored item (an ``Item``) to
  the batch, under the queue it was routed to. A message sent to a fanout exchange is
  broadcast at once, as outside a batch (pub/sub keeps nothing to batch).
- Each message keeps its own publish identity: the publish id of its publish call for its
  queue (the ``PublishStamp``: one per queue the call was routed to). A flush that is sent
  again (after a failure: ``flush()`` once more) stores each message once: the insert script
  finds the publish ids of those stored the first time.
- While the batch fills, each queue's items go to Redis in sub-chunks: every ``batch_send``
  (a transport option, C.BATCH_SEND by default) items of a queue are written as one insert
  script call on a connection the batch takes from the pool (``scripts/stream.py``), and their reply is not read yet: Redis stores a sub-chunk
  while the client prepares the next messages. ``flush`` writes the rest of each queue as one
  more call and reads every reply. Each script call is atomic: its entries are all stored or
  none. Nothing is promised before ``flush`` returns, as with kombu's own batches; but the
  messages of the sub-chunks sent may be stored (and delivered) before it, and a batch
  discarded (the block raised) drops only the messages not sent yet. ``batch_send=0`` sends
  nothing before the flush (then sent as calls of C.BATCH_SEND, all replies read at once).
- A sharded queue, a queue with ``wait_replicas``, and a Redis Cluster client keep the
  round-trip path: ``flush`` sends each such queue's items with ``insert_many``, one script
  call per 1,000 entries (``BULK_CHUNK``) pipelined in one round trip (per shard of a sharded
  queue, per master on a Redis Cluster).
- ``max_size``: a batch holding that many items flushes on its own (kombu's automatic flush).
- A message with a unique key (docs/unique.md) is not held for the flush: ``Publisher.put``
  stores it at once, on its own (one atomic insert decides its key), so its outcome
  (``celery_pq.publish_outcome``) is known when its ``publish`` returns.
- A failing flush raises what a single publish raises (``QueueFull``, ``NotReplicated``,
  redis-py's ``ConnectionError``, ...) and keeps every item not known to be stored: the queues
  not reached, a refused chunk's items, and a chunk whose reply was lost (it may be stored:
  its publish ids say so when it is sent again). A sub-chunk refused while later ones were
  sent already: the flush reads every reply first, so what it says is stored is all the
  queue got. A connection lost while sub-chunks were sent (at a send or at the flush): the
  flush sends what was not known to be stored on the round-trip path (a send lost before the
  flush) or raises the error (a read lost at the flush). Nothing is claimed stored that was not:
  ``exc.stored`` and ``exc.items`` (``insert_many``'s) say which items of the failed queue
  were and were not stored, and a note says how many messages the batch still holds. A
  ``flush()`` in the same ``with producer.batch() as batch:`` block sends them again; when the
  flush of the block's end fails, kombu closes the batch and they are dropped (the exception
  says how many).
- After a successful flush no message of it can be sent again, so its publish ids are
  forgotten by the next inserts (``insert_many(remember=False)``): the window holds only the
  ids of flushes without a reply.

``discard`` and ``close`` read the replies still outstanding (or close the connection when that
fails) before the connection goes back to the pool.

Threads: kombu keeps one batch per producer and thread; a batch is used by one thread.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, cast

from ..queue import Item, PriorityQueue
from ..queue.values import mark_stored
from ..scripts.stream import LOST, CallStream
from ..storage import constants as C
from ..storage.connections import is_cluster


class BatchingChannel(Protocol):
    """What a publish batch uses of its channel (channel.py's ``Channel``; kombu's own
    ``basic_publish`` path for a message sent at once)."""

    options: Any
    deadletter_queue: Any

    def queue(self, name: str) -> Any: ...

    def typeof(self, exchange) -> Any: ...

    def get_table(self, exchange) -> Any: ...

    def basic_publish(self, message, exchange, routing_key, **kwargs) -> Any: ...

    def _put(self, queue: str, message: dict, **kwargs) -> Any: ...

    def _inplace_augment_message(self, message: dict, exchange, routing_key) -> Any: ...


#: Exchange types whose routing of a key a batch keeps until its flush (fanout is sent at once).
_CACHED_TYPES = frozenset(("direct", "topic"))


class _Sent(NamedTuple):
    """A sub-chunk written to the stream, its reply not read yet."""

    queue: str
    items: list  # its Items (kept again unless the reply says they are stored)
    state: list  # what ``PriorityQueue.batch_reply`` takes with the reply


class PublishBatch:
    """The items of one producer batch, per queue, until ``flush``."""

    def __init__(self, channel: BatchingChannel, max_size: int):
        self.channel = channel
        self.max_size = max_size
        #: queue name -> the ``insert_many`` tuples of its items not yet sent, in publish order
        self._pending: dict[str, list[Item]] = {}
        #: sub-chunks sent whose replies wait for the flush, in the order sent
        self._sent: list[_Sent] = []
        self._stream: CallStream | None = None
        self._streams: dict[str, bool] = {}  # queue name -> sends sub-chunks (``_streamed``)
        self._round_trips = False  # a send was lost: the rest of this flush takes the round-trip path
        #: items of a queue sent as one call before the flush (the transport option; 0: none)
        self._send_at = channel.options.batch_send
        #: (exchange, routing key) -> the queues a direct or topic exchange routed it to, until
        #: the next flush (the channel's routing tables are cached for binding_cache_seconds
        #: anyway; a flush starts this cache again)
        self._routes: dict[tuple[str | None, str | None], list[str]] = {}
        #: Items waiting for a flush (not sent, or sent without a reply yet).
        self._count = 0
        self._aborted = False
        self._closed = False
        #: Messages this batch stored, and those it found stored already (sent again): counts
        #: for the curious and the tests.
        self.stored = 0
        self.repeated = 0

    def __len__(self) -> int:
        """Items not known to be stored yet (waiting, or sent without a reply yet)."""
        return self._count

    # -- kombu's hooks ------------------------------------------------------------------------
    def publish(self, message: dict, **kwargs) -> None:
        """Route one prepared message as ``basic_publish`` does; its inserts wait for ``flush``
        (fanout goes at once)."""
        self._check_usable()
        exchange, routing_key = kwargs.get("exchange"), kwargs.get("routing_key")
        queues = self._routes.get((exchange, routing_key)) if exchange else None
        if queues is None:
            self.channel.basic_publish(message, _publish_batch=self, **kwargs)
            kind = self.channel.typeof(exchange) if exchange else None
            if kind is not None and kind.type in _CACHED_TYPES:
                # the exchange's own lookup: no default queue, no warning (basic_publish gave those)
                found = kind.lookup(self.channel.get_table(exchange), exchange, routing_key, None)
                queues = [q for q in found if q and q != self.channel.deadletter_queue]
                if queues:
                    self._routes[(exchange, routing_key)] = queues
        else:  # basic_publish's work, the exchange's routing taken from this batch's cache
            self.channel._inplace_augment_message(message, exchange, routing_key)
            for queue in queues:
                self.channel._put(queue, message, _publish_batch=self)
        if self._count >= self.max_size:
            self.flush()

    def flush(self) -> None:
        """Store every waiting item: the rest of each streamed queue sent and every reply read,
        the other queues each in one ``insert_many``; on a failure, raise and keep the items not
        known to be stored (``flush`` again sends them, stored once)."""
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
                if left is not None:
                    self.stored += sum(1 for eid in getattr(exc, "stored", ()) if eid is not None)
                    self._keep(name, list(left))
                self._noted(exc)
                raise
            del self._pending[name]
            self._count -= len(items)
            n_repeated = sum(repeated)
            self.repeated += n_repeated
            self.stored += len(items) - n_repeated
        self._round_trips = False

    def discard(self) -> None:
        """Drop the items not yet flushed (kombu: the ``with`` block raised); the replies of the
        sub-chunks sent are read first (those messages are stored)."""
        self._aborted = True
        self._drain()
        self._pending.clear()
        self._count = 0

    def close(self) -> None:
        self._closed = True
        self._drain()
        self._pending.clear()
        self._count = 0

    # -- what Publisher.put calls ---------------------------------------------------------------
    def add(self, queue: str, item: Item) -> None:
        """One message routed to ``queue``, stored at the next flush (sent with the queue's
        next ``batch_send``)."""
        items = self._pending.get(queue)
        if items is None:
            items = self._pending[queue] = []
        items.append(item)
        self._count += 1
        if self._send_at and len(items) >= self._send_at and self._streamed(queue):
            self._send(queue)

    # -- sub-chunks sent now, replies read at the flush ------------------------------------------
    def _streamed(self, name: str) -> bool:
        """Does ``name`` send its items in sub-chunks? A plain queue (not sharded) without
        ``wait_replicas`` on a plain client (not a cluster's), while no send was lost."""
        if self._round_trips:
            return False
        known = self._streams.get(name)
        if known is None:
            q = self.channel.queue(name)
            known = self._streams[name] = (
                isinstance(q, PriorityQueue) and not q.settings.wait_replicas and not is_cluster(q.client)
            )
        return known

    def _plain(self, name: str) -> PriorityQueue:
        """The plain queue of a streamed name (``_streamed`` checked it)."""
        return cast(PriorityQueue, self.channel.queue(name))

    def _send(self, name: str) -> None:
        """Write ``name``'s waiting items as insert calls (``batch_send`` items each at most),
        their replies read at the flush. A lost connection breaks the stream: the items of every
        call sent on it are kept again (maybe stored: their publish ids say so when sent again)
        and the rest of this flush takes the round-trip path (it raises if the loss lasts)."""
        items = self._pending.pop(name)
        q = self._plain(name)
        if self._stream is None:  # (then no call is outstanding)
            try:
                self._stream = CallStream.open(q.client)
            except LOST:
                self._stream = None
            if self._stream is None:
                self._pending[name] = items
                self._round_trips = True
                return
        size = self._send_at or C.BATCH_SEND
        for i in range(0, len(items), size):
            part = items[i : i + size]
            try:
                call, state = q.batch_call(part)
            except ValueError:  # (an item the queue refuses: the flush's insert_many names it)
                self._pending[name] = items[i:]
                self._round_trips = True
                return
            self._sent.append(_Sent(name, part, state))
            try:
                self._stream.send(*call)
            except LOST as exc:
                self._pending[name] = items[i + len(part) :]
                self._settle_all(exc)
                self._round_trips = True
                return

    def _flush_stream(self) -> None:
        """Send the rest of each streamed queue, read every reply; raise the first failure
        (a lost connection before a refusal) with what was stored of its queue."""
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
        """Read the reply of each call sent (none when ``lost``: those replies are gone), count
        what was stored, keep the items of the calls refused or without a reply (before the
        items waiting, in publish order), and close the stream. Returns the first failure as
        (queue, exception), and per queue the replies of its calls that stored (``Inserted``)."""
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
                    except Exception as exc:  # (lost, or a reply that cannot be read: the stream is broken)
                        lost = exc
                try:
                    done = self._plain(s.queue).batch_reply(reply if lost is None else lost, s.state)
                except Exception as exc:
                    done = None
                    if error is None or (exc is lost and error[1] is not lost):
                        error = (s.queue, exc)
                settled += 1
                if done is None:
                    back.setdefault(s.queue, []).extend(s.items)
                    continue
                n_repeated = done.repeated
                self.repeated += n_repeated
                self.stored += len(done) - n_repeated
                self._count -= len(done)
                stored.setdefault(s.queue, []).append(done)
        finally:
            for s in sent[settled:]:  # (an interrupt: what was not read is kept, maybe stored)
                back.setdefault(s.queue, []).extend(s.items)
            if stream is not None:
                stream.close()
            for name, items in back.items():
                self._pending[name] = items + self._pending.pop(name, [])
        return error, stored

    def _drain(self) -> None:
        """Read the replies outstanding (counted; errors dropped: these items are dropped too)."""
        if self._stream is not None or self._sent:
            try:
                self._settle_all(None)
            except Exception:  # (the stream is closed whatever happened)
                pass

    def _noted(self, exc: Exception) -> Exception:
        exc.add_note(
            f"publish batch: {self._count} message(s) not known to be stored are still in the batch "
            f"(queues {sorted(self._pending)}); flush() again sends them, each stored once"
        )
        return exc

    def _keep(self, queue: str, items: list[Item]) -> None:
        self._count -= len(self._pending.pop(queue))
        if items:
            self._pending[queue] = items
            self._count += len(items)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this publish batch is closed")
        if self._aborted:
            raise RuntimeError("this publish batch was discarded")
