"""A channel's publishing side: a message stored in a queue under its publish call's id (kombu's
retries store it once), or broadcast to a fanout exchange. docs/leases.md ("Idempotent publish")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..queue import Producer
from ..storage import connections
from ..storage.errors import ModeMismatch
from ..storage.ids import unique_bytes
from ..storage.keys import fanout_channel
from .messages import BROADCAST_ID, STAMP, PublishStamp, serialized, stored_item
from .revokes import PIDBOX_SUFFIX, on_broadcast
from .unique import PublishOutcome, remember, unique_of

if TYPE_CHECKING:
    from .batches import PublishBatch


class PublishingChannel(Protocol):
    """What the publishing side uses of its channel (channel.py's ``Channel``)."""

    options: Any
    client: Any
    transport: Any
    routing: Any

    def decode_body(self, body, encoding=None) -> Any: ...

    def queue(self, name: str) -> Producer: ...

    def reopen(self, name: str) -> Producer: ...

    def _next_delivery_tag(self) -> str: ...


class Publisher:
    """What kombu's ``basic_publish`` calls on a channel, past ``prepare_message``."""

    def __init__(self, channel: PublishingChannel):
        self.channel = channel
        self.options = channel.options

    def put(self, queue: str, message: dict, batch: PublishBatch | None = None) -> None:
        """Store ``message`` in ``queue`` under its publish call's id (``PublishStamp``), or add it to ``batch``;
        one with a unique key is stored at once, its outcome remembered for ``publish_outcome``."""
        publish_id, first_send = PublishStamp.take(message, queue)
        unique = unique_of(message, self.options, queue, self.channel.decode_body)
        if unique is not None:
            batch = None  # one atomic insert decides its key: known when the call returns
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
                stored = q.insert(item, unique=unique, first_send=first_send, remember=False)
                break
            except ModeMismatch:  # recorded or migrated since it was opened; nothing written
                if not again:
                    raise
                q = self.channel.reopen(queue)
        if isinstance(stored, PublishOutcome):
            remember(stored)

    def put_fanout(self, exchange: str, message: dict) -> None:
        """Broadcast ``message`` to a fanout exchange's receivers (sharded pub/sub on a cluster)."""
        channel = self.channel
        if self.options.revoke_removes and exchange.endswith(PIDBOX_SUFFIX):
            on_broadcast(channel, exchange, message)  # (Celery's revoke: the waiting tasks removed first)
        client = channel.client
        publish = client.spublish if connections.is_cluster(client) else client.publish
        sent, _ = PublishStamp.take(message, f"fanout {exchange}")
        props = {k: v for k, v in message["properties"].items() if k != STAMP}  # (a broadcast keeps its tag)
        props.setdefault("delivery_tag", channel._next_delivery_tag())
        if sent is not None:  # a receiver drops one sent again (kombu's retry)
            props[BROADCAST_ID] = sent.hex()
        publish(self.fanout_channel(exchange), serialized(exchange, {**message, "properties": props}, self.options))

    def fanout_channel(self, exchange: str) -> str:
        return fanout_channel(exchange, self.channel.transport.db, self.options.key_prefix)
