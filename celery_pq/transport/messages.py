"""A kombu message as the queue stores it, both ways.

Writing: the one path from a message dict to an insert. The transport's publish
(``Channel.prepare_message`` and ``Channel._put``) and the Spark writer (``celery_pq.spark``)
both go through here, so a task enqueued from a DataFrame is stored exactly as the same task
published by Celery: the same payload bytes, priority default and check, tenant
(``tenants.tenant_of``), delay (the ``eta`` header), and task name for the event log. A publish
id names one publish call in one queue (``PublishStamp``), never the content.

The stored payload is ``codec.encode`` of the message (docs/storage.md), without its
``delivery_tag``: a delivery carries its lease token as tag instead.

Reading, for operators (``describe``): a stored message's task name and a short preview of its
args. The payload is read with ``codec.decode`` (which also reads the JSON of entries written
before the compact form): the body is base64 in ``body`` (``properties.body_encoding``), Celery's
protocol 2 headers in ``headers`` (``task``, ``argsrepr``, ``kwargsrepr``). A payload that is not
such a message (a queue used without kombu, a malformed entry set aside) is shown as its own
text; one in the stored form that cannot be read (corrupt, or over the codec's bounds: a
decompression bomb) as ``unreadable: <why>``, with no task name. Nothing there raises on stored
data.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from hashlib import blake2b
from types import MappingProxyType

from ..queue import Item, validate_priority
from ..storage.codec import VERSION, CodecError, decode, encode
from ..storage.errors import MessageTooLarge
from ..storage.ids import unique_bytes
from .options import Options
from .tenants import tenant_of

logger = logging.getLogger(__name__)


#: The property under which ``prepare_message`` keeps a publish call's ``PublishStamp`` (in the
#: properties dict kombu's ``Producer.publish`` hands to every attempt of one call). Private:
#: never stored, never delivered.
STAMP = "x-pq-publish"
#: The property a fanout broadcast carries its publish call's id in (receivers drop a repeat).
BROADCAST_ID = "x-pq-broadcast"
#: No task limits (``stored_item``'s default).
EMPTY_LIMITS: Mapping[str, float] = MappingProxyType({})


class PublishStamp:
    """The identity of one publish call: a publish id per queue the call reaches, made when the
    call first puts the message there, and kept for that call's own retries alone.

    kombu's ``Producer.publish(retry=True)`` (Celery's ``task_publish_retry``) retries a failed
    attempt by calling ``Producer._publish`` again with the same ``properties`` dict, and each
    attempt prepares the message anew (``Channel.prepare_message``). The stamp rides in that
    dict, so every attempt of one call carries one publish id per queue, and each queue stores
    the call once even when an attempt's reply was lost after the insert ran. Two publish calls
    are two stamps, two sets of publish ids, two messages, whatever their task id, body or
    timing: nothing here is derived from the content.

    A call routed to several queues (an exchange binding its key to each) puts the message in
    each, one after the other (kombu's ``_put`` per queue); any of them may be the one whose
    reply was lost, and a retry puts it in every queue again. The first queue takes
    ``publish_id``, each other one an id of its own (``ids``, by queue name), so every queue
    finds the attempts before it.

    ``put``: the queues put since the message was last prepared. A message dict put again in
    one of them without being prepared again (a caller's own second ``basic_publish`` of one
    prepared message) is a second publish, and gets a publish id of its own.
    """

    __slots__ = ("ids", "publish_id", "put")

    def __init__(self) -> None:
        self.publish_id = unique_bytes()
        self.ids: dict[str, bytes] = {}
        self.put: set[str] = set()

    @classmethod
    def prepared(cls, properties: dict) -> PublishStamp:
        """The stamp of the call these properties belong to: a new one for a first attempt,
        the same one, ready to be put again, for a retry of it."""
        stamp = properties.get(STAMP)
        if type(stamp) is cls:
            stamp.put.clear()
        else:
            stamp = properties[STAMP] = cls()
        return stamp

    @classmethod
    def take(cls, message: dict, queue: str) -> tuple[bytes, bool] | tuple[None, bool]:
        """``(publish id, first send)`` for one ``_put`` of ``message`` in ``queue``: the
        prepared call's id for that queue, and whether it is sent there for the first time
        (never stored then, so only recorded, not looked up); or ``(None, True)`` (the queue
        makes one) for a message that was not prepared for this put."""
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
    """kombu's ``prepare_message`` hook: the message dict, its priority checked (ValueError
    naming the value, before anything is written) and defaulted, and the publish call stamped
    with its identity (``PublishStamp``) in ``properties``."""
    # kombu's Producer.publish and Celery pass 0 when no priority was given (the kombu
    # convention, as in kombu's virtual transports): 0 and None take default_priority.
    if priority is None or (type(priority) is int and priority == 0):
        priority = options.default_priority
    validate_priority(priority)
    if properties is None:  # (not ``or {}``: an empty dict of the caller's is the one kept)
        properties = {}
    properties.setdefault("delivery_info", {})
    properties["priority"] = priority
    PublishStamp.prepared(properties)  # the same dict comes back on kombu's retry of this call
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
    task_limits: Mapping[str, float] = EMPTY_LIMITS,
) -> Item:
    """How ``message`` (a prepared kombu message dict) is stored in ``queue``.

    ``decode_body`` is kombu's ``Channel.decode_body`` (a ``fair_key`` function sees the decoded
    body). ``publish_id_``: the publish id of this publish (the transport's ``PublishStamp``, the
    Spark writer's row identity), or None for one the queue makes per insert call. Nothing of
    the message's content makes a publish id. ValueError or MessageTooLarge, with nothing
    written, for a message that cannot be stored. ``queue_ttl_ms``: the queue's ``message_ttl``
    (``x-message-ttl``), when it has one. ``task_limits``: the open queue's (``tenants.tenant_of``);
    none where the caller tags limited tasks itself (the Spark sink, per queue).
    """
    props = message["properties"]
    priority = props.get("priority")
    if priority is None:
        priority = options.default_priority  # a message that did not come through prepare_message
    headers = message.get("headers") or {}
    task_id = headers.get("id") or props.get("correlation_id") or None
    task = headers.get("task") if options.event_log else None
    message = without_properties(message, NOT_STORED)
    ttl_ms = _earliest(expiration_ms(props.get("expiration")), queue_ttl_ms)
    return Item(
        serialized(queue, message, options),
        priority,
        str(task_id) if task_id else None,
        tenant=tenant_of(message, options, decode_body, task_limits),
        due_ms=eta_ms(headers.get("eta")),
        publish_id=publish_id_,
        task=task if isinstance(task, str) else None,
        ttl=None if ttl_ms is None else ttl_ms / 1000,
        expires_ms=expires_ms(headers.get("expires")),
    )


def _earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two deadlines, either of them None for none (one runs per publish)."""
    return b if a is None else a if b is None else min(a, b)


def expiration_ms(expiration) -> int | None:
    """kombu's ``expiration`` property (AMQP per-message TTL: ms, as text) as ms, or None when
    absent or not a number (a message is never refused for it: the worker's checks still run)."""
    if expiration is None or expiration == "":
        return None
    try:
        return max(0, int(float(expiration)))
    except (TypeError, ValueError):
        return None


def message_ttl_ms(arguments) -> int | None:
    """A queue's message TTL (ms) from its declaration's arguments (kombu's
    ``Queue(message_ttl=seconds)`` sends ``x-message-ttl`` in ms), or None."""
    ttl = (arguments or {}).get("x-message-ttl") if isinstance(arguments, dict) else None
    if ttl is None or isinstance(ttl, bool):
        return None
    try:
        return max(0, int(ttl))
    except (TypeError, ValueError):
        raise ValueError(f"x-message-ttl must be a number of milliseconds, got {ttl!r}") from None


def expires_ms(expires) -> int | None:
    """Celery's ``expires`` header (ISO 8601; naive times are UTC) as Unix ms, or None when
    absent or unreadable (then only the worker checks it, as before)."""
    if not expires or not isinstance(expires, str):
        return None
    try:
        when = datetime.fromisoformat(expires)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0, int(when.timestamp() * 1000))


#: Message properties that are never stored: the publish stamp is the publisher's alone, and
#: each delivery gets its lease token as its delivery tag.
NOT_STORED = frozenset(("delivery_tag", STAMP))
#: Message properties that never leave the publisher (a fanout broadcast keeps its tag).
NOT_SENT = frozenset((STAMP,))


def without_properties(message: dict, names: frozenset) -> dict:
    """``message`` without the properties ``names`` (the message itself when it has none of them:
    the common case costs no copy)."""
    props = message["properties"]
    if not isinstance(props, dict) or names.isdisjoint(props):
        return message
    return {**message, "properties": {k: v for k, v in props.items() if k not in names}}


def serialized(queue: str, message: dict, options: Options) -> bytes:
    """The message as stored (``codec.encode``); MessageTooLarge (nothing written) when over
    max_message_bytes.

    A message property whose value has no stored form (an object neither this codec nor
    kombu's JSON writes) is left out with a warning naming it, as an AMQP broker keeps only
    the properties it knows (Celery's ``before_task_publish`` handlers that re-publish with
    ``**kwargs`` pass the signal itself as one). A header or body value without one is an error
    (ValueError naming it, nothing written): those are the task's own data."""
    try:
        data = encode(message)
    except TypeError:
        data = encode(_storable(queue, message))
    limit = options.max_message_bytes
    if limit is not None and len(data) > limit:
        raise MessageTooLarge(queue, len(data), limit)
    return data


def _storable(queue: str, message: dict) -> dict:
    """``message`` less the properties that have no stored form; ValueError naming a header
    that has none."""
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
    """16 bytes naming ``parts`` (each length-prefixed, so no two lists of parts collide)."""
    h = blake2b(digest_size=16)
    for part in parts:
        text = bytes(part) if isinstance(part, bytes) else str(part).encode()
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
        when = when.replace(tzinfo=UTC)
    return max(0, int(when.timestamp() * 1000))


# -- reading: what an operator sees of a stored message ----------------------------------------
#: Characters of an args preview at most (the rest is cut with "...").
PREVIEW_CHARS = 60


def describe(payload: bytes | str, width: int = PREVIEW_CHARS) -> dict:
    """``{"task": name or None, "args": preview}`` of a stored payload."""
    try:
        message = decode(payload)
    except CodecError as exc:
        if _stored_form(payload):
            why = str(exc).removeprefix("stored message's ").removeprefix("stored message ")
            return {"task": None, "args": _cut(f"unreadable: {why}", width)}
        message = None
    except Exception:
        message = None
    if not isinstance(message, dict) or "body" not in message:
        return {"task": None, "args": _cut(_text(payload), width)}
    headers = message.get("headers") or {}
    task = headers.get("task") if isinstance(headers, dict) else None
    if isinstance(headers, dict) and ("argsrepr" in headers or "kwargsrepr" in headers):
        args = _join(headers.get("argsrepr"), headers.get("kwargsrepr"))
    else:
        args = _body_preview(message)
    return {"task": task, "args": _cut(args, width)}


def _stored_form(payload: bytes | str) -> bool:
    """Whether a payload the codec refused is in the stored form (its first byte is the
    format's version)."""
    head = payload[:1] if isinstance(payload, bytes) else payload[:1].encode()
    return head == bytes((VERSION,))


def _body_preview(message: dict) -> str:
    body = message.get("body")
    if not isinstance(body, (str, bytes, bytearray)):  # (neither base64 nor JSON text: shown as it is)
        return _text(body)
    props = message.get("properties") or {}
    try:
        if isinstance(props, dict) and props.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        if message.get("content-type") == "application/json":
            decoded = json.loads(body)
            # Celery protocol 2: [args, kwargs, embed]
            if (
                isinstance(decoded, list)
                and len(decoded) == 3
                and isinstance(decoded[0], list)
                and isinstance(decoded[1], dict)
            ):
                return _join(repr(tuple(decoded[0])), repr(decoded[1]))
            return json.dumps(decoded)
    except (ValueError, TypeError):
        pass
    return _text(body)


def _join(args, kwargs) -> str:
    parts = [a for a in (args, kwargs) if a and a not in ("()", "{}")]
    return " ".join(parts) if parts else "()"


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
