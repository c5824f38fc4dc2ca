"""A kombu message as the queue stores it: the one path from a message dict to an ``Item`` (transport and
Spark writer alike). docs/storage.md, docs/leases.md ("Idempotent publish")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from hashlib import blake2b

from ..queue import Item, validate_priority
from ..storage.codec import encode
from ..storage.errors import MessageTooLarge
from ..storage.ids import unique_bytes
from .options import Options
from .tenants import cost_of, tenant_of

logger = logging.getLogger(__name__)


#: The property holding a publish call's ``PublishStamp`` (kombu hands the same properties dict
#: to every attempt of one call); never stored, never delivered.
STAMP = "x-pq-publish"
#: The property a fanout broadcast carries its publish call's id in (receivers drop a repeat).
BROADCAST_ID = "x-pq-broadcast"
#: The delivery_info key of what a delivery knows of its entry: ``(queue, the entry's header as
#: stored, Unix ms of the delivery)`` (never stored; ``celery_pq.ops.otel`` reads it).
DELIVERED_ENTRY = "x-pq-entry"
#: Properties never stored (a delivery's tag is its lease token).
NOT_STORED = frozenset(("delivery_tag", STAMP))


class PublishStamp:
    """One publish call's identity, riding in the properties dict kombu's retries prepare again: a
    publish id per queue it reaches (``ids``; the first queue's is ``publish_id``), never from the
    content. ``put``: the queues put since the last prepare (a put again without one is a new publish)."""

    __slots__ = ("ids", "publish_id", "put")

    def __init__(self) -> None:
        self.publish_id = unique_bytes()
        self.ids: dict[str, bytes] = {}
        self.put: set[str] = set()

    @classmethod
    def prepared(cls, properties: dict) -> PublishStamp:
        """The stamp of these properties' call: new for a first attempt, the same for a retry."""
        stamp = properties.get(STAMP)
        if type(stamp) is cls:
            stamp.put.clear()
        else:
            stamp = properties[STAMP] = cls()
        return stamp

    @classmethod
    def take(cls, message: dict, queue: str) -> tuple[bytes, bool] | tuple[None, bool]:
        """``(publish id, first send)`` of one put in ``queue``; ``(None, True)`` for a message not prepared for it."""
        props = message.get("properties")
        stamp = props.get(STAMP) if isinstance(props, dict) else None
        if type(stamp) is not cls or queue in stamp.put:
            return None, True
        stamp.put.add(queue)
        ids = stamp.ids
        publish_id = ids.get(queue)
        if publish_id is not None:
            return publish_id, False
        publish_id = ids[queue] = unique_bytes() if ids else stamp.publish_id
        return publish_id, True


def prepare_message(
    options: Options, body, priority=None, content_type=None, content_encoding=None, headers=None, properties=None
) -> dict:
    """kombu's hook: the message dict, priority defaulted and checked (ValueError), the call stamped."""
    # kombu and Celery pass 0 for no priority (as kombu's virtual transports take it).
    if priority is None or (type(priority) is int and priority == 0):
        priority = options.default_priority
    validate_priority(priority)
    if properties is None:  # (not ``or {}``: an empty dict of the caller's is the one kept)
        properties = {}
    properties.setdefault("delivery_info", {})
    properties["priority"] = priority
    PublishStamp.prepared(properties)
    return {
        "body": body,
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers or {},
        "properties": properties,
    }


def stored_item(
    queue: str,
    message: dict,
    options: Options,
    decode_body: Callable,
    *,
    publish_id_: bytes | None = None,
    queue_ttl_ms: int | None = None,
    task_limits: Mapping[str, float] | None = None,
) -> Item:
    """The ``Item`` of a prepared kombu message for ``queue``; ValueError or MessageTooLarge, nothing
    written, when it cannot be stored. ``publish_id_`` None: the queue makes one per call."""
    props = message["properties"]
    priority = props.get("priority")
    if priority is None:
        priority = options.default_priority  # not prepared by prepare_message
    headers = message.get("headers") or {}
    task_id = headers.get("id") or props.get("correlation_id") or None
    task = headers.get("task") if options.event_log else None
    if not NOT_STORED.isdisjoint(props):
        message = {**message, "properties": {k: v for k, v in props.items() if k not in NOT_STORED}}
    ttl_ms = min((t for t in (expiration_ms(props.get("expiration")), queue_ttl_ms) if t is not None), default=None)
    return Item(
        serialized(queue, message, options),
        priority,
        str(task_id) if task_id else None,
        tenant=tenant_of(message, options, decode_body, task_limits),
        due_ms=unix_ms(headers.get("eta"), strict=True),
        publish_id=publish_id_,
        task=task if isinstance(task, str) else None,
        ttl=None if ttl_ms is None else ttl_ms / 1000,
        expires_ms=unix_ms(headers.get("expires"), strict=False),
        cost=cost_of(message, queue),
    )


def expiration_ms(expiration) -> int | None:
    """kombu's ``expiration`` property (AMQP TTL, ms as text) as ms; None when not a number (the worker checks)."""
    try:
        return max(0, int(float(expiration)))
    except (TypeError, ValueError, OverflowError):  # (OverflowError: "inf")
        return None


def message_ttl_ms(arguments) -> int | None:
    """A queue's ``x-message-ttl`` (ms) from its declaration's arguments, or None."""
    ttl = arguments.get("x-message-ttl") if isinstance(arguments, dict) else None
    if ttl is None or isinstance(ttl, bool):
        return None
    try:
        return max(0, int(ttl))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"x-message-ttl must be a number of milliseconds, got {ttl!r}") from None


def unix_ms(when, *, strict: bool) -> int | None:
    """Celery's ``eta`` (``strict``: ValueError when unreadable) or ``expires`` header (None when
    unreadable: only the worker checks it) as Unix ms; ISO 8601, naive is UTC."""
    if not when or not (strict or isinstance(when, str)):
        return None
    try:
        at = datetime.fromisoformat(str(when))
    except ValueError:
        if not strict:
            return None
        raise ValueError(f"message eta {when!r} is not an ISO 8601 time; the message was not published") from None
    return max(0, int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000))


def serialized(queue: str, message: dict, options: Options) -> bytes:
    """The message as stored (``codec.encode``); MessageTooLarge over max_message_bytes. A property with no
    stored form is left out with a warning, as an AMQP broker keeps only those it knows (a handler re-publishing
    ``**kwargs`` passes the signal itself); a header or body value without one is a ValueError."""
    try:
        data = encode(message)
    except TypeError:
        data = encode(_storable(queue, message))
    limit = options.max_message_bytes
    if limit is not None and len(data) > limit:
        raise MessageTooLarge(queue, len(data), limit)
    return data


def _storable(queue: str, message: dict) -> dict:
    """``message`` less the properties with no stored form; ValueError for such a header."""
    props = message.get("properties")
    if isinstance(props, dict):
        bad = [k for k, v in props.items() if not _writable(v)]
        if bad:
            logger.warning(
                "queue %r: message properties %s have no stored form (values of type %s) and are left out",
                queue,
                ", ".join(map(repr, bad)),
                ", ".join(type(props[k]).__name__ for k in bad),
            )
            message = {**message, "properties": {k: v for k, v in props.items() if k not in bad}}
    headers = message.get("headers")
    if isinstance(headers, dict):
        for k, v in headers.items():
            if not _writable(v):
                raise ValueError(
                    f"message header {k!r} holds a {type(v).__name__}, which has no stored form "
                    f"(JSON); the message was not published to queue {queue!r}"
                )
    return message


def _writable(value) -> bool:
    try:
        encode({"headers": {"v": value}})
    except TypeError:
        return False
    return True


def digest(*parts) -> bytes:
    """16 bytes naming ``parts`` (length-prefixed: no two lists collide)."""
    h = blake2b(digest_size=16)
    for part in parts:
        text = bytes(part) if isinstance(part, bytes) else str(part).encode()
        h.update(b"%d:" % len(text) + text)
    return h.digest()
