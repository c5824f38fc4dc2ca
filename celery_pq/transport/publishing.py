"""A channel's publishing side: a message stored in a queue, or sent to a fanout exchange.

kombu prepares the message (``messages.prepare_message``: priority checked and defaulted, the
publish call stamped with its identity), then augments it in place and puts it. A message put
in a queue is stored as ``messages.stored_item`` makes it: one insert, with the publish call's
id for that queue (its own retries carry the same one, so the queue stores it once, whichever
of the queues it was routed to lost a reply). A message sent to a
fanout exchange goes to Redis pub/sub (sharded pub/sub on a Redis Cluster), each receiver
given a delivery tag of its own. Inside a producer's batch (``batches.py``) a stored message
waits in the batch for its flush; a fanout message is sent at once.

A message with a unique key (``unique.unique_of``: the header ``pq_unique`` by default) is
stored by ``insert_unique``, and its outcome remembered (``unique.publish_outcome``); in a
producer's batch it is stored at once, on its own (each key's outcome is decided by one atomic
insert), not at the flush.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..storage import connections
from ..storage.codec import Base64Body
from ..storage.errors import ModeMismatch
from ..storage.ids import unique_bytes
from ..storage.keys import fanout_channel
from .messages import BROADCAST_ID, NOT_SENT, PublishStamp, serialized, stored_item, without_properties
from .unique import OUTCOMES, PublishOutcome, unique_of

if TYPE_CHECKING:
    from .batches import PublishBatch


class PublishingChannel(Protocol):
    """What the publishing side uses of its channel (channel.py's ``Channel``)."""

    body_encoding: str
    options: Any
    client: Any
    transport: Any  # (its ``db``)
    routing: Any  # (``message_ttl``)

    def decode_body(self, body, encoding=None) -> Any: ...

    def encode_body(self, body, encoding=None) -> Any: ...

    def queue(self, name: str) -> Any: ...

    def reopen(self, name: str) -> Any: ...

    def _next_delivery_tag(self) -> str: ...


class Publisher:
    """What kombu's ``basic_publish`` calls on a channel, past ``prepare_message``."""

    def __init__(self, channel: PublishingChannel):
        self.channel = channel
        self.options = channel.options

    def augment(self, message: dict, exchange: str, routing_key: str) -> None:
        """kombu's ``_inplace_augment_message``, less two steps the stored form makes needless:
        a body to be base64 text stays its bytes (a ``Base64Body``: the codec stores it so
        anyway) and no delivery tag is made (a delivery carries its lease token as tag; a fanout
        message gets one in ``put_fanout``)."""
        channel = self.channel
        body = message["body"]
        if channel.body_encoding == "base64" and isinstance(body, (bytes, str)):
            message["body"] = Base64Body(body.encode() if isinstance(body, str) else body)
            encoding = "base64"
        else:
            message["body"], encoding = channel.encode_body(body, channel.body_encoding)
        props = message["properties"]
        props["body_encoding"] = encoding
        props["delivery_info"].update(exchange=exchange, routing_key=routing_key)

    def put(self, queue: str, message: dict, batch: PublishBatch | None = None) -> None:
        """Store ``message`` in ``queue``: one publish call, one publish id per queue (its own
        retries, kombu's ``ensure``, carry the same ones: ``PublishStamp``). In a producer's
        ``batch`` (batches.py), the stored item waits there for the batch's flush, under the
        same publish id (a flush sent again stores it once)."""
        publish_id, first_send = PublishStamp.take(message, queue)
        unique = unique_of(message, self.options, queue, self.channel.decode_body)
        if unique is not None:
            batch = None  # stored at once, on its own: its outcome is known when the call returns
        if batch is not None:
            publish_id = publish_id or unique_bytes()
        q = self.channel.queue(queue)
        for again in (True, False):
            item = stored_item(
                queue,
                message,
                self.options,
                self.channel.decode_body,
                publish_id_=publish_id,
                queue_ttl_ms=self.channel.routing.message_ttl(queue),
                task_limits=q.task_limits,  # (the reopened queue's on the second turn)
            )
            if batch is not None:
                batch.add(queue, item)
                return
            try:
                stored = q.put(item, unique=unique, first_send=first_send, remember=False)
                break
            except ModeMismatch:  # recorded (a consumer declared it) or migrated since it was opened
                if not again:
                    raise
                q = self.channel.reopen(queue)  # its mode as recorded now (nothing was written)
        if isinstance(stored, PublishOutcome):  # a unique key's: remembered for publish_outcome
            OUTCOMES.add(stored)

    def put_fanout(self, exchange: str, message: dict) -> None:
        """Send ``message`` to the receivers of a fanout exchange; on a cluster by sharded
        pub/sub, to the master of the channel's slot only."""
        channel = self.channel
        client = channel.client
        publish = client.spublish if connections.is_cluster(client) else client.publish
        sent, _ = PublishStamp.take(message, f"fanout {exchange}")  # the call's, for its retries
        props = dict(without_properties(message, NOT_SENT)["properties"])
        props.setdefault("delivery_tag", channel._next_delivery_tag())  # each receiver's own
        if sent is not None:  # a receiver drops the same broadcast sent again (kombu's retry)
            props[BROADCAST_ID] = sent.hex()
        publish(self.fanout_channel(exchange), serialized(exchange, {**message, "properties": props}, self.options))

    def fanout_channel(self, exchange: str) -> str:
        """The pub/sub channel of a fanout exchange."""
        return fanout_channel(exchange, self.channel.transport.db, self.options.key_prefix)
