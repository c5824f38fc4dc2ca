"""What an operator sees of a stored message: its task name and a short preview of its args.

The transport stores the kombu message as JSON (``transport.Channel._serialized``): the body
base64 in ``body`` (``properties.body_encoding``), Celery's protocol 2 headers in ``headers``
(``task``, ``argsrepr``, ``kwargsrepr``). A payload that is not such a message (a queue used
without kombu, a malformed entry set aside) is shown as its own text. Nothing here raises on
stored data.
"""

from __future__ import annotations

import base64
import json

#: Characters of an args preview at most (the rest is cut with "...").
PREVIEW_CHARS = 60


def describe(payload: bytes | str, width: int = PREVIEW_CHARS) -> dict:
    """``{"task": name or None, "args": preview}`` of a stored payload."""
    try:
        message = json.loads(payload)
    except (ValueError, TypeError, UnicodeDecodeError):
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


def _body_preview(message: dict) -> str:
    body = message.get("body")
    props = message.get("properties") or {}
    try:
        if isinstance(props, dict) and props.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        if message.get("content-type") == "application/json":
            decoded = json.loads(body)
            # Celery protocol 2: [args, kwargs, embed]
            if isinstance(decoded, list) and len(decoded) == 3 and isinstance(decoded[0], list) \
                    and isinstance(decoded[1], dict):
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
