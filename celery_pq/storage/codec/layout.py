"""The codec's format: version and flags bytes, value tags, body forms, sections and the table of
fields (``FIELDS``) with their defaults, drawn in docs/storage.md ("Layout"). Varints are unsigned
LEB128, integers zigzag, floats 8 bytes big-endian, strings UTF-8."""

from __future__ import annotations

import struct

#: The format's version, the first byte of every record (kombu's JSON starts with ``{``).
VERSION = 1

# flags byte
F_CELERY = 0x01  # headers default to Celery's protocol-2 defaults
F_ARGSREPR = 0x02  # headers["argsrepr"] is repr(tuple(args)) of the JSON body
F_KWARGSREPR = 0x04  # headers["kwargsrepr"] is repr(kwargs) of the JSON body
F_ZSTD = 0x08  # the records after the two first bytes are one zstd frame
KNOWN_FLAGS = F_CELERY | F_ARGSREPR | F_KWARGSREPR | F_ZSTD

# value tags
T_NONE, T_TRUE, T_FALSE, T_INT, T_FLOAT, T_STR, T_BYTES, T_UUID, T_REF, T_LIST, T_DICT, T_JSON = range(12)

# body forms (the byte after the body's code)
B_VALUE = 0  # then a value (a body that is not text or bytes)
B_BYTES = 1  # raw bytes
B_TEXT = 2  # UTF-8 text
B_BASE64 = 3  # raw bytes whose base64 text is the body
B_BASE64_EMBED = 4  # as B_BASE64, the bytes without CELERY_EMBED_TAIL at their end

#: The end of Celery's JSON body for a task with no callbacks, errbacks, chain or chord.
CELERY_EMBED_TAIL = b', {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'

# sections
S_MESSAGE, S_HEADERS, S_PROPERTIES, S_DELIVERY_INFO = range(4)
C_ABSENT = 4
_TABLE_START = 8

NO_DEFAULT = object()

#: Celery's protocol-2 headers in order (as_task_v2's) -> default or NO_DEFAULT
CELERY_HEADERS = {
    "lang": "py",
    "task": NO_DEFAULT,
    "id": NO_DEFAULT,
    "shadow": None,
    "eta": None,
    "expires": None,
    "group": None,
    "group_index": None,
    "retries": 0,
    "timelimit": [None, None],
    "root_id": NO_DEFAULT,
    "parent_id": None,
    "argsrepr": NO_DEFAULT,
    "kwargsrepr": NO_DEFAULT,
    "origin": NO_DEFAULT,
    "ignore_result": False,
    "replaced_task_nesting": 0,
    "stamped_headers": None,
    "stamps": {},
}

#: (section, field name, default or NO_DEFAULT). The code of a field is _TABLE_START + its index:
#: append only, never reorder (stored records name fields by these codes).
FIELDS: tuple[tuple[int, str, object], ...] = (
    (S_MESSAGE, "body", NO_DEFAULT),
    (S_MESSAGE, "content-type", "application/json"),
    (S_MESSAGE, "content-encoding", "utf-8"),
    (S_MESSAGE, "headers", NO_DEFAULT),  # a dict unless a record says otherwise
    (S_MESSAGE, "properties", NO_DEFAULT),  # the same
    (S_PROPERTIES, "correlation_id", NO_DEFAULT),
    (S_PROPERTIES, "reply_to", NO_DEFAULT),
    (S_PROPERTIES, "delivery_mode", 2),
    (S_PROPERTIES, "delivery_info", NO_DEFAULT),  # a dict unless a record says otherwise
    (S_PROPERTIES, "priority", 0),
    (S_PROPERTIES, "body_encoding", "base64"),
    (S_PROPERTIES, "delivery_tag", NO_DEFAULT),
    (S_PROPERTIES, "expiration", NO_DEFAULT),
    (S_DELIVERY_INFO, "exchange", ""),
    (S_DELIVERY_INFO, "routing_key", NO_DEFAULT),
    # Celery protocol 2 headers; their defaults hold only for a Celery message (F_CELERY)
    *((S_HEADERS, name, default) for name, default in CELERY_HEADERS.items()),
)

CODE = {(s, name): _TABLE_START + i for i, (s, name, _) in enumerate(FIELDS)}
FIELD = {_TABLE_START + i: (s, name) for i, (s, name, _) in enumerate(FIELDS)}
C_BODY = CODE[S_MESSAGE, "body"]
SUBSECTIONS = {
    (S_MESSAGE, "headers"): S_HEADERS,
    (S_MESSAGE, "properties"): S_PROPERTIES,
    (S_PROPERTIES, "delivery_info"): S_DELIVERY_INFO,
}
assert _TABLE_START + len(FIELDS) < 0x80  # every code is one byte (the reader counts on it)


#: (section, celery) -> the fields the section has by default (Celery's headers only for a Celery message)
DEFAULTS: dict[tuple[int, bool], dict] = {
    (sec, c): {name: d for s, name, d in FIELDS if s == sec and d is not NO_DEFAULT and (c or s != S_HEADERS)}
    for sec in range(4)
    for c in (False, True)
}
#: floats: 8 bytes big-endian
DOUBLE = struct.Struct(">d")


class CodecError(ValueError):
    """A stored record this codec cannot read (or a message it cannot write)."""


class Base64Body(bytes):
    """A body whose ``body_encoding`` is base64, held as its bytes, not the text: the transport
    publishes one and ``decode(data, raw_body=True)`` gives one back, so the base64 step is
    skipped both ways (the transport's ``decode_body`` knows it is done)."""

    __slots__ = ()
