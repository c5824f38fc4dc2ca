"""The stored form of a kombu message: ``encode(message) -> bytes``, ``decode(bytes) -> message``.

``decode(encode(m)) == m`` for every kombu message dict (tests/unit/test_codec.py checks it over
arbitrary messages, Celery messages of every protocol-2 field, and non-Celery ones). What makes it
small, against the JSON dict kombu's own transports store:

- the body as raw bytes when it is base64 text (``properties.body_encoding == "base64"``, the
  virtual Channel's default), turned back into the same text on read; Celery's JSON body loses
  its constant tail (the ``{"callbacks": null, ...}`` embed of a plain task);
- every UUID string as 16 bytes, and written once: a UUID seen before in the same message
  (``root_id``, ``correlation_id`` equal to ``id``, ...) is a reference of one byte and its index;
- field names from a fixed table (``FIELDS``), and fields that hold their default left out;
  Celery's protocol-2 headers (celery/app/amqp.py ``as_task_v2``) have their defaults when the
  message is a Celery task (``lang`` and ``task`` in its headers);
- ``argsrepr`` / ``kwargsrepr`` left out when they are exactly what ``repr`` of the body's args /
  kwargs gives (checked at write; otherwise kept as they are): args are read alone from a body as
  Celery writes it, whatever its size; kwargs other than ``{}`` only from bodies up to
  REPR_BODY_MAX (``_reprs_of``);
- the rest of the record zstd-compressed when that makes it smaller (records of
  ``COMPRESS_MIN`` bytes and over; benchmarks/memory_tasks.py measures it).

Anything else is kept as it is: a field not in the table is written with its name, a value of a
type this codec does not write itself (a datetime, a Decimal) as kombu's JSON of it.

A stored record is untrusted input (anyone who can write to Redis can write one), so the reader
bounds what it builds: a zstd frame is inflated only when the size its header declares is at most
MAX_INFLATED (a frame that declares 300 MB from 9 KB is refused before anything is allocated; one
that declares less than it holds fails at the declared size), and a record makes at most
MAX_VALUES fields and MAX_VALUES list and dict items (kombu's JSON inside it counted by its
separators); the varint of a length, count or reference takes at most MAX_VARINT_BYTES, an
integer's at most MAX_INT_BYTES (read in linear time). A record over a bound is a CodecError
like any unreadable one: the transport moves its entry to the dead-letter queue (reason
``malformed``). The writer keeps to the same bounds: a record over MAX_INFLATED is stored
uncompressed, and a message over MAX_VALUES, or with an integer over MAX_INT_BYTES, is refused
(CodecError, nothing written), so every record it writes reads back.

Layout: one version byte (``VERSION``), one flags byte (``F_*``), then records to the end, each a
varint code and what the code takes:

======================  =============================================================
code                    then
======================  =============================================================
0..3 (unnamed field)    section (the code), field name (string), value
4 (absent)              table code of a field the section has by default but this
                        message lacks
table code (8 on)       the field's value (``body``: a body form byte, then its data)
======================  =============================================================

A value is a tag byte (``T_*``) then its data: varints are unsigned LEB128, integers zigzag,
floats 8 bytes big-endian, strings and bytes a varint length then the bytes (strings UTF-8).
The sections are the message itself, its ``headers``, its ``properties`` and their
``delivery_info``.

The package, one module a job: ``layout`` (the format's bytes and its table of fields),
``writer`` (``encode``), ``reader`` (``decode``), ``reprs`` (argsrepr/kwargsrepr derived from
the body) and ``bounds`` (compression, the bounds on what a record may cost, the caches' size).
"""

from .bounds import COMPRESS_MIN, MAX_INFLATED, MAX_INT_BYTES, MAX_VALUES, MAX_VARINT_BYTES, ZSTD_LEVEL
from .layout import (
    B_BASE64,
    B_BASE64_EMBED,
    B_BYTES,
    B_TEXT,
    B_VALUE,
    C_ABSENT,
    CELERY_EMBED_TAIL,
    F_ARGSREPR,
    F_CELERY,
    F_KWARGSREPR,
    F_ZSTD,
    FIELDS,
    S_DELIVERY_INFO,
    S_HEADERS,
    S_MESSAGE,
    S_PROPERTIES,
    T_BYTES,
    T_DICT,
    T_FALSE,
    T_FLOAT,
    T_INT,
    T_JSON,
    T_LIST,
    T_NONE,
    T_REF,
    T_STR,
    T_TRUE,
    T_UUID,
    VERSION,
    Base64Body,
    CodecError,
)
from .reader import decode
from .reprs import REPR_BODY_MAX
from .writer import encode

__all__ = [
    "B_BASE64",
    "B_BASE64_EMBED",
    "B_BYTES",
    "B_TEXT",
    "B_VALUE",
    "CELERY_EMBED_TAIL",
    "COMPRESS_MIN",
    "C_ABSENT",
    "FIELDS",
    "F_ARGSREPR",
    "F_CELERY",
    "F_KWARGSREPR",
    "F_ZSTD",
    "MAX_INFLATED",
    "MAX_INT_BYTES",
    "MAX_VALUES",
    "MAX_VARINT_BYTES",
    "REPR_BODY_MAX",
    "S_DELIVERY_INFO",
    "S_HEADERS",
    "S_MESSAGE",
    "S_PROPERTIES",
    "T_BYTES",
    "T_DICT",
    "T_FALSE",
    "T_FLOAT",
    "T_INT",
    "T_JSON",
    "T_LIST",
    "T_NONE",
    "T_REF",
    "T_STR",
    "T_TRUE",
    "T_UUID",
    "VERSION",
    "ZSTD_LEVEL",
    "Base64Body",
    "CodecError",
    "decode",
    "encode",
]
