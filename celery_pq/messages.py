"""A kombu message as the queue stores it: the one path from a message dict to an insert.

The transport's publish (``Channel.prepare_message`` and ``Channel._put``) and the Spark writer
(``celery_pq.spark``) both go through here, so a task enqueued from a DataFrame is stored exactly
as the same task published by Celery: the same payload bytes, priority default and check, tenant
(``tenants.tenant_of``), delay (the ``eta`` header) and publish id.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from hashlib import blake2b
from typing import Callable

from kombu.utils.json import dumps

from .errors import MessageTooLarge
from .options import Options
from .queue import validate_priority
from .tenants import tenant_of


@dataclass(frozen=True)
class StoredItem:
    """One insert of a message: ``PriorityQueue.insert(payload, priority, id=..., tenant=...,
    due_ms=..., publish_id=...)``, or the tuple ``insert_many`` takes (``as_tuple``)."""

    payload: bytes
    priority: int
    id: str | None
    tenant: str | None
    due_ms: int | None
    publish_id: bytes | None

    def as_tuple(self) -> tuple:
        return self.payload, self.priority, self.id, self.tenant, self.due_ms, self.publish_id


def prepare_message(options: Options, body, priority=None, content_type=None, content_encoding=None,
                    headers=None, properties=None) -> dict:
    """kombu's ``prepare_message`` hook: the message dict, its priority checked (ValueError
    naming the value, before anything is written) and defaulted."""
    # kombu's Producer.publish and Celery pass 0 when no priority was given (the kombu
    # convention, as in kombu's virtual transports): 0 and None take default_priority.
    if priority is None or (type(priority) is int and priority == 0):
        priority = options.default_priority
    validate_priority(priority)
    properties = properties or {}
    properties.setdefault("delivery_info", {})
    properties["priority"] = priority
    return {
        "body": body,
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers or {},
        "properties": properties,
    }


def stored_item(queue: str, message: dict, options: Options, decode_body: Callable, *,
                publish_id_: bytes | None = None) -> StoredItem:
    """How ``message`` (a prepared kombu message dict) is stored in ``queue``.

    ``decode_body`` is kombu's ``Channel.decode_body`` (a ``fair_key`` function sees the decoded
    body). ``publish_id_`` replaces the message's own publish id (``publish_id``) for a caller
    that identifies its publishes otherwise (the Spark writer: by task id alone). ValueError or
    MessageTooLarge, with nothing written, for a message that cannot be stored.
    """
    props = message["properties"]
    priority = props.get("priority")
    if priority is None:
        priority = options.default_priority  # a message that did not come through prepare_message
    headers = message.get("headers") or {}
    task_id = headers.get("id") or props.get("correlation_id") or None
    return StoredItem(
        payload=serialized(queue, message, options),
        priority=priority,
        id=str(task_id) if task_id else None,
        tenant=tenant_of(message, options, decode_body),
        due_ms=eta_ms(headers.get("eta")),
        publish_id=publish_id(message) if publish_id_ is None else publish_id_,
    )


def serialized(queue: str, message: dict, options: Options) -> bytes:
    """The message as stored; MessageTooLarge (nothing written) when over max_message_bytes."""
    data = dumps(message).encode()
    limit = options.max_message_bytes
    if limit is not None and len(data) > limit:
        raise MessageTooLarge(queue, len(data), limit)
    return data


def publish_id(message: dict) -> bytes | None:
    """The publish id of a message: the queue stores nothing for an id it has seen within
    ``dedupe_seconds``, so a publish retried after a lost reply is stored once.

    A Celery task message (its headers name ``id`` and ``task``) gets an id made from its task
    id, retries count, eta and body: kombu's and Celery's own publish retries prepare and put
    the message again, and carry the same id, while Celery's retry of a task (one more in
    ``retries``) is a publish of its own. Any other message: None, and the queue makes a random
    one for the insert call, which covers a retry within that call.
    """
    headers = message.get("headers") or {}
    if not (headers.get("id") and headers.get("task")):
        return None
    return digest(headers["id"], headers.get("retries"), headers.get("eta"), message.get("body"))


def digest(*parts) -> bytes:
    """16 bytes naming ``parts`` (each length-prefixed, so no two lists of parts collide)."""
    h = blake2b(digest_size=16)
    for part in parts:
        text = str(part).encode()
        h.update(b"%d:" % len(text) + text)
    return h.digest()


def eta_ms(eta) -> int | None:
    """Celery's ``eta`` header (ISO 8601) as Unix ms; naive times are UTC."""
    if not eta:
        return None
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        raise ValueError(f"message eta {eta!r} is not an ISO 8601 time; the message was not published") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0, int(when.timestamp() * 1000))
