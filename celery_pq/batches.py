"""A producer's publish batch: kombu's ``Producer.batch()`` on this transport.

kombu 5.7 asks the channel for ``create_publish_batch(max_size)`` when a producer enters
``with producer.batch():``, hands each ``publish`` of the block to ``PublishBatch.publish``,
and calls ``flush`` when the block ends (``discard`` when it raises), then ``close``.

What a batched publish does, and what it keeps:

- Each ``publish`` goes through the channel exactly as a single publish does
  (``Channel.prepare_message``, ``basic_publish``, the exchange's routing, ``Publisher.put``):
  the same checks raise at the call (a bad priority, a message too large), with nothing
  buffered. Instead of an insert, ``Publisher.put`` hands the stored item (``StoredItem``) to
  the batch, under the queue it was routed to. A message sent to a fanout exchange is
  broadcast at once, as outside a batch (pub/sub keeps nothing to batch).
- Each message keeps its own publish identity: the publish id of its publish call (the
  ``PublishStamp``), or one made for it when it was routed to a second queue. A flush that is
  sent again (after a failure: ``flush()`` once more) stores each message once: the insert
  script finds the publish ids of those stored the first time.
- ``flush`` sends each queue's items with ``insert_many``: one script call per 1,000 entries
  (``BULK_CHUNK``), all the chunks of a queue pipelined in one round trip (per shard of a
  sharded queue, per master on a Redis Cluster). Each script call is atomic: its entries are
  all stored or none.
- ``max_size``: a batch holding that many items flushes on its own (kombu's automatic flush).
- A failing flush raises what a single publish raises (``QueueFull``, ``NotReplicated``,
  redis-py's ``ConnectionError``, ...) and keeps every item not known to be stored: the queues
  not reached, a refused chunk's items, and a chunk whose reply was lost (it may be stored:
  its publish ids say so when it is sent again). Nothing is claimed stored that was not:
  ``exc.stored`` and ``exc.items`` (``insert_many``'s) say which items of the failed queue
  were and were not stored, and a note says how many messages the batch still holds. A
  ``flush()`` in the same ``with producer.batch() as batch:`` block sends them again; when the
  flush of the block's end fails, kombu closes the batch and they are dropped (the exception
  says how many).
- After a successful flush no message of it can be sent again, so its publish ids are
  forgotten by the next inserts (``insert_many(remember=False)``): the window holds only the
  ids of flushes without a reply.

Threads: kombu keeps one batch per producer and thread; a batch is used by one thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .messages import StoredItem

if TYPE_CHECKING:
    from .transport import Channel


class PublishBatch:
    """The items of one producer batch, per queue, until ``flush``."""

    def __init__(self, channel: Channel, max_size: int):
        self.channel = channel
        self.max_size = max_size
        #: queue name -> the ``insert_many`` tuples of its items not yet stored, in publish order
        self._pending: dict[str, list[tuple]] = {}
        self._count = 0
        self._aborted = False
        self._closed = False
        #: Messages this batch stored, and those it found stored already (sent again): counts
        #: for the curious and the tests.
        self.stored = 0
        self.repeated = 0

    def __len__(self) -> int:
        """Items waiting for a flush."""
        return self._count

    # -- kombu's hooks ------------------------------------------------------------------------
    def publish(self, message: dict, **kwargs) -> None:
        """Route one prepared message as ``basic_publish`` does; its inserts wait for ``flush``
        (fanout goes at once)."""
        self._check_usable()
        self.channel.basic_publish(message, _publish_batch=self, **kwargs)
        if self._count >= self.max_size:
            self.flush()

    def flush(self) -> None:
        """Store every waiting item: each queue's in one ``insert_many``; on a failure, raise
        and keep the items not known to be stored (``flush`` again sends them, stored once)."""
        self._check_usable()
        while self._pending:
            name, items = next(iter(self._pending.items()))
            try:
                _, repeated = self.channel.queue(name).insert_many(items, repeats=True, remember=False)
            except Exception as exc:
                left = getattr(exc, "items", None)
                if left is not None:
                    self.stored += sum(1 for eid in getattr(exc, "stored", ()) if eid is not None)
                    self._keep(name, list(left))
                exc.add_note(
                    f"publish batch: {self._count} message(s) not known to be stored are still in the batch "
                    f"(queues {sorted(self._pending)}); flush() again sends them, each stored once"
                )
                raise
            del self._pending[name]
            self._count -= len(items)
            n_repeated = sum(repeated)
            self.repeated += n_repeated
            self.stored += len(items) - n_repeated

    def discard(self) -> None:
        """Drop the items not yet flushed (kombu: the ``with`` block raised)."""
        self._aborted = True
        self._pending.clear()
        self._count = 0

    def close(self) -> None:
        self._closed = True
        self._pending.clear()
        self._count = 0

    # -- what Publisher.put calls ---------------------------------------------------------------
    def add(self, queue: str, item: StoredItem) -> None:
        """One message routed to ``queue``, stored at the next flush."""
        self._pending.setdefault(queue, []).append(item.as_tuple())
        self._count += 1

    def _keep(self, queue: str, items: list[tuple]) -> None:
        self._count -= len(self._pending.pop(queue))
        if items:
            self._pending[queue] = items
            self._count += len(items)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this publish batch is closed")
        if self._aborted:
            raise RuntimeError("this publish batch was discarded")
