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
separators). A record over either bound is a CodecError like any unreadable one: the transport
moves its entry to the dead-letter queue (reason ``malformed``). The writer keeps to the same
bounds: a record over MAX_INFLATED is stored uncompressed, and a message over MAX_VALUES is
refused (CodecError, nothing written), so every record it writes reads back.

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
``delivery_info``. Entries written before this format (kombu's JSON, first byte ``{``) are read
as JSON, as before.
"""

from __future__ import annotations

import binascii
import json
import operator
import struct
import threading
from types import SimpleNamespace

from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

try:  # the dependency is declared; a reader without it can still read everything uncompressed
    import zstandard
except ImportError:  # pragma: no cover - zstandard is a dependency of celery-pq
    zstandard = None

#: The format's version, the first byte of every record (kombu's JSON starts with ``{``).
VERSION = 1
#: A record of at least this many bytes is offered to zstd; kept compressed only if smaller.
#: Below it there is little to gain for the CPU: a small task's 151-byte record grows to 160.
COMPRESS_MIN = 512
#: zstd's own default level; it shrank the benchmark's 1 KB and 20 KB tasks 2x and 5x.
ZSTD_LEVEL = 3
#: The most bytes a reader inflates one zstd frame to (the size its header declares): bounds the
#: memory a stored record can make a reader allocate. A record larger than this is stored
#: uncompressed (its size in Redis is then its size in memory).
MAX_INFLATED = 16 * 1024 * 1024
#: The most fields a record may make, and apart from them the most list and dict items (a field
#: or an item is a Python object or two: a record of a few MB could otherwise make hundreds of MB
#: of them). Celery's messages have some thirty fields and a handful of items.
MAX_VALUES = 65_536
#: kwargsrepr (and argsrepr of a body not shaped as Celery writes it) is derived from bodies of at
#: most this many bytes: beyond it Celery has usually cut it (argsrepr_maxsize, 1 KB) and parsing
#: the kwargs on every read costs more. A Celery body's args are read alone, at any size.
REPR_BODY_MAX = 1024

# flags byte
F_CELERY = 0x01  # headers default to Celery's protocol-2 defaults
F_ARGSREPR = 0x02  # headers["argsrepr"] is repr(tuple(args)) of the JSON body
F_KWARGSREPR = 0x04  # headers["kwargsrepr"] is repr(kwargs) of the JSON body
F_ZSTD = 0x08  # the records after the two first bytes are one zstd frame
_KNOWN_FLAGS = F_CELERY | F_ARGSREPR | F_KWARGSREPR | F_ZSTD

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

_NO_DEFAULT = object()

#: (section, field name, default or _NO_DEFAULT). The code of a field is _TABLE_START + its index:
#: append only, never reorder (stored records name fields by these codes).
FIELDS: tuple[tuple[int, str, object], ...] = (
    (S_MESSAGE, "body", _NO_DEFAULT),
    (S_MESSAGE, "content-type", "application/json"),
    (S_MESSAGE, "content-encoding", "utf-8"),
    (S_MESSAGE, "headers", _NO_DEFAULT),  # a dict unless a record says otherwise
    (S_MESSAGE, "properties", _NO_DEFAULT),  # the same
    (S_PROPERTIES, "correlation_id", _NO_DEFAULT),
    (S_PROPERTIES, "reply_to", _NO_DEFAULT),
    (S_PROPERTIES, "delivery_mode", 2),
    (S_PROPERTIES, "delivery_info", _NO_DEFAULT),  # a dict unless a record says otherwise
    (S_PROPERTIES, "priority", 0),
    (S_PROPERTIES, "body_encoding", "base64"),
    (S_PROPERTIES, "delivery_tag", _NO_DEFAULT),
    (S_PROPERTIES, "expiration", _NO_DEFAULT),
    (S_DELIVERY_INFO, "exchange", ""),
    (S_DELIVERY_INFO, "routing_key", _NO_DEFAULT),
    # Celery protocol 2 headers; their defaults hold only for a Celery message (F_CELERY)
    (S_HEADERS, "lang", "py"),
    (S_HEADERS, "task", _NO_DEFAULT),
    (S_HEADERS, "id", _NO_DEFAULT),
    (S_HEADERS, "shadow", None),
    (S_HEADERS, "eta", None),
    (S_HEADERS, "expires", None),
    (S_HEADERS, "group", None),
    (S_HEADERS, "group_index", None),
    (S_HEADERS, "retries", 0),
    (S_HEADERS, "timelimit", [None, None]),
    (S_HEADERS, "root_id", _NO_DEFAULT),
    (S_HEADERS, "parent_id", None),
    (S_HEADERS, "argsrepr", _NO_DEFAULT),
    (S_HEADERS, "kwargsrepr", _NO_DEFAULT),
    (S_HEADERS, "origin", _NO_DEFAULT),
    (S_HEADERS, "ignore_result", False),
    (S_HEADERS, "replaced_task_nesting", 0),
    (S_HEADERS, "stamped_headers", None),
    (S_HEADERS, "stamps", {}),
)

_CODE = {(s, name): _TABLE_START + i for i, (s, name, _) in enumerate(FIELDS)}
_FIELD = {_TABLE_START + i: (s, name) for i, (s, name, _) in enumerate(FIELDS)}
_C_BODY = _CODE[S_MESSAGE, "body"]
_SUBSECTIONS = {(S_MESSAGE, "headers"): S_HEADERS, (S_MESSAGE, "properties"): S_PROPERTIES,
                (S_PROPERTIES, "delivery_info"): S_DELIVERY_INFO}
assert _TABLE_START + len(FIELDS) < 0x80  # every code is one byte (the reader counts on it)


def _defaults(section: int, celery: bool) -> dict:
    """The fields a section has by default."""
    if section == S_HEADERS and not celery:
        return {}
    return {name: d for s, name, d in FIELDS if s == section and d is not _NO_DEFAULT}


_DEFAULTS = {(s, c): _defaults(s, c) for s in range(4) for c in (False, True)}
#: headers whose value the reader derives from the body when the flag says so
_DERIVED = {(S_HEADERS, "argsrepr"): F_ARGSREPR, (S_HEADERS, "kwargsrepr"): F_KWARGSREPR}
#: (section, celery) -> {field name: (code, default or _NO_DEFAULT, subsection or None, its F_* flag
#: when derivable or 0)}: the writer's table
_NAMES = {(sec, c): {name: (_CODE[s, name], _DEFAULTS[sec, c].get(name, _NO_DEFAULT), _SUBSECTIONS.get((s, name)),
                            _DERIVED.get((s, name), 0))
                     for s, name, _ in FIELDS if s == sec}
          for sec in range(4) for c in (False, True)}
#: (section, celery) -> names of the defaults and subsections a section has unless a record says not
_EXPECTED = {(sec, c): (*_DEFAULTS[sec, c], *(name for (s, name) in _SUBSECTIONS if s == sec))
             for sec in range(4) for c in (False, True)}
#: celery -> the four sections' defaults, copied per message by the reader (the lists and dicts
#: among them, in _MUTABLE as (section, name, default), copied again: a shallow copy suffices)
_TEMPLATES = {c: tuple(dict(_DEFAULTS[s, c]) for s in range(4)) for c in (False, True)}
_MUTABLE = {c: [(s, n, v) for s in range(4) for n, v in _DEFAULTS[s, c].items() if type(v) in (list, dict)]
            for c in (False, True)}
assert not any(type(x) in (list, dict) for c in _MUTABLE for _, _, v in _MUTABLE[c]
               for x in (v.values() if type(v) is dict else v))


#: Celery's protocol-2 headers in table order (as_task_v2 makes them in this order): the fields
#: with a default, as one tuple to compare at once, and those without, each (name, code, F_* flag)
_CELERY_DEFAULTED = tuple((name, d) for s, name, d in FIELDS if s == S_HEADERS and d is not _NO_DEFAULT)
_CELERY_DEFAULTED_GET = operator.itemgetter(*(name for name, _ in _CELERY_DEFAULTED))
_CELERY_DEFAULT_VALUES = tuple(d for _, d in _CELERY_DEFAULTED)
_CELERY_DEFAULT_TYPES = tuple(type(d) for _, d in _CELERY_DEFAULTED)
#: fields whose values repeat from message to message: their records come from _RECORDS
_REPEATING = frozenset({(S_HEADERS, "task"), (S_HEADERS, "origin"), (S_DELIVERY_INFO, "routing_key")})
_CELERY_OWN = tuple((name, _CODE[S_HEADERS, name], _DERIVED.get((S_HEADERS, name), 0), (S_HEADERS, name) in _REPEATING)
                    for s, name, d in FIELDS if s == S_HEADERS and d is _NO_DEFAULT)
_CELERY_HEADERS = frozenset(name for s, name, _ in FIELDS if s == S_HEADERS)
#: a Celery task message's own fields and its properties, as kombu's virtual channel hands them over
_CELERY_MESSAGE = frozenset({"body", "content-encoding", "content-type", "headers", "properties"})
_CELERY_PROPERTIES = frozenset({"correlation_id", "reply_to", "delivery_mode", "delivery_info", "priority",
                                "body_encoding"})
_DELIVERY_INFO = frozenset({"exchange", "routing_key"})
_C_CORRELATION_ID, _C_REPLY_TO, _C_PRIORITY, _C_ROUTING_KEY = (
    _CODE[S_PROPERTIES, "correlation_id"], _CODE[S_PROPERTIES, "reply_to"], _CODE[S_PROPERTIES, "priority"],
    _CODE[S_DELIVERY_INFO, "routing_key"])


class CodecError(ValueError):
    """A stored record this codec cannot read (or a message it cannot write)."""


class Base64Body(bytes):
    """A message body whose ``body_encoding`` is base64, held as its bytes instead of the base64
    text: the transport publishes a body so (the codec stores such a body as its bytes anyway),
    and ``decode(data, raw_body=True)`` gives one back for a delivery (kombu would decode the text
    at once). Whoever holds one knows that the base64 step is done (the transport's
    ``decode_body``)."""

    __slots__ = ()


# -- writing ---------------------------------------------------------------------------------
# The writer and the reader are plain functions over a bytearray (or bytes) and a position, with
# the common values (short strings, UUIDs, references, None) handled inline: per message they run
# some thirty times, and a method call per value cost more than the JSON layout's whole dumps
# (benchmarks/codec_cpu.py measures both).
def encode(message: dict) -> bytes:
    """The stored form of a kombu message dict."""
    if not isinstance(message, dict):
        raise CodecError(f"a message is a dict, not {type(message).__name__}")
    headers = message.get("headers")
    celery = isinstance(headers, dict) and "lang" in headers and "task" in headers
    flags = F_CELERY if celery else 0
    raw = _base64_body(message)
    if raw is not None and isinstance(headers, dict) and message.get("content-type") == "application/json" \
            and message.get("content-encoding") == "utf-8":
        flags |= _derivable_reprs(headers, raw)
    out = bytearray()
    if not (celery and raw is not None and _write_celery(out, message, flags, raw)):
        _write_section(out, {}, S_MESSAGE, message, celery, flags, raw)
    if len(out) > MAX_VALUES:  # each value takes a byte at least: a shorter record holds fewer
        _check_readable(out, flags)
    if zstandard is not None and COMPRESS_MIN <= len(out) <= MAX_INFLATED:
        packed = _zstd().compressor.compress(out)
        if len(packed) < len(out):
            return bytes((VERSION, flags | F_ZSTD)) + packed
    return bytes((VERSION, flags)) + out


def _check_readable(out: bytearray, flags: int) -> None:
    """CodecError (nothing is written) for a record the reader would refuse: more than
    MAX_VALUES fields, or list and dict items."""
    try:
        _read_message(bytes(out), 0, flags & ~(F_ARGSREPR | F_KWARGSREPR), raw_body=True)
    except CodecError as exc:
        raise CodecError(f"message cannot be stored: {exc}") from None


_local = threading.local()


def _zstd():
    """This thread's zstd compressor and decompressor (made once: making one costs more than
    compressing a message; they are not to be shared between threads)."""
    z = getattr(_local, "zstd", None)
    if z is None:
        z = _local.zstd = SimpleNamespace(compressor=zstandard.ZstdCompressor(level=ZSTD_LEVEL),
                                          decompressor=zstandard.ZstdDecompressor())
    return z


def _derivable_reprs(headers: dict, raw: bytes) -> int:
    """F_ARGSREPR / F_KWARGSREPR for the reprs in ``headers`` that are what a reader derives from
    the body (``_reprs_of``). Only reprs Celery did not cut ("...") can be: the others are not
    computed. kwargs of a body over REPR_BODY_MAX are not parsed (unless they are ``{}``)."""
    argsrepr, kwargsrepr = headers.get("argsrepr"), headers.get("kwargsrepr")
    want = (F_ARGSREPR if type(argsrepr) is str and "..." not in argsrepr else 0) \
        | (F_KWARGSREPR if type(kwargsrepr) is str and "..." not in kwargsrepr else 0)
    if not want:
        return 0
    derived = _reprs_of(raw, want, kwargs_limit=REPR_BODY_MAX)
    if derived is None:
        return 0
    return (F_ARGSREPR if want & F_ARGSREPR and derived.get(F_ARGSREPR) == argsrepr else 0) \
        | (F_KWARGSREPR if want & F_KWARGSREPR and derived.get(F_KWARGSREPR) == kwargsrepr else 0)


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _blob(out: bytearray, data: bytes) -> None:
    n = len(data)
    if n < 0x80:
        out.append(n)
    else:
        _varint(out, n)
    out += data


def _write_section(out: bytearray, uuids: dict, section: int, d: dict, celery: bool, flags: int,
                   raw: bytes | None) -> None:
    """The records of one section's fields (a subsection's inline, each code naming its section).
    ``uuids``: {UUID text: its index} of those written so far; ``raw``: the body's bytes when it
    is base64 text."""
    names = _NAMES[section, celery]
    expected = 0  # fields of _EXPECTED present in d
    for name, value in d.items():
        info = names.get(name)
        if info is None:  # a field the table does not name
            if type(name) is not str:
                raise CodecError(f"message field name {name!r} is not a string")
            out.append(section)  # a section is below 0x80: its varint is one byte
            _blob(out, name.encode("utf-8", "surrogatepass"))
            _write_value(out, uuids, value)
            continue
        code, default, sub, derived_flag = info
        if default is not _NO_DEFAULT:
            expected += 1
            if value is default or (type(value) is type(default) and value == default
                                    and (type(value) not in (list, dict) or _same(value, default))):
                continue
        elif sub is not None:
            expected += 1
            if isinstance(value, dict):  # a dict, or a subclass of one (read back as a dict)
                if sub != S_HEADERS or not celery or not _write_celery_headers(out, uuids, value, flags):
                    _write_section(out, uuids, sub, value, celery, flags, raw)
                continue
        if flags & derived_flag:  # argsrepr / kwargsrepr the reader derives from the body
            continue
        out.append(code)
        if code == _C_BODY:
            _write_body(out, uuids, value, raw)
        else:
            _write_value(out, uuids, value)
    if expected < len(_EXPECTED[section, celery]):
        for name in _EXPECTED[section, celery]:
            if name not in d:
                out.append(C_ABSENT)
                out.append(_CODE[section, name])


def _write_celery(out: bytearray, message: dict, flags: int, raw: bytes) -> bool:
    """The records of a Celery task message as kombu's virtual channel hands it over (its five
    fields, content type JSON in UTF-8, the properties Celery and the channel set, ``delivery_mode``
    2, exchange ""), the same ``_write_section`` writes for it in the same order, without a loop
    over its fields; False (nothing written) for any other message. ``raw``: its body's bytes."""
    headers, props = message["headers"], message.get("properties")
    if message.keys() != _CELERY_MESSAGE or type(props) is not dict or props.keys() != _CELERY_PROPERTIES \
            or type(headers) is not dict:
        return False
    info, mode, priority = props["delivery_info"], props["delivery_mode"], props["priority"]
    if type(info) is not dict or info.keys() != _DELIVERY_INFO or type(info["exchange"]) is not str \
            or info["exchange"] or type(mode) is not int or mode != 2 or type(priority) is not int \
            or type(props["body_encoding"]) is not str or type(message["content-type"]) is not str \
            or message["content-type"] != "application/json" or type(message["content-encoding"]) is not str \
            or message["content-encoding"] != "utf-8":
        return False
    uuids: dict[str, int] = {}
    out.append(_C_BODY)
    _write_body(out, uuids, None, raw)
    if not _write_celery_headers(out, uuids, headers, flags):
        _write_section(out, uuids, S_HEADERS, headers, True, flags, raw)
    out.append(_C_CORRELATION_ID)
    _write_value(out, uuids, props["correlation_id"])
    out.append(_C_REPLY_TO)
    _write_value(out, uuids, props["reply_to"])
    _write_repeating(out, uuids, _C_ROUTING_KEY, info["routing_key"])
    if priority:
        out.append(_C_PRIORITY)
        _write_value(out, uuids, priority)
    return True


def _write_celery_headers(out: bytearray, uuids: dict, headers: dict, flags: int) -> bool:
    """The records of Celery's protocol-2 headers when they are exactly its fields and every
    field that has a default holds it (a plain task: one tuple comparison for the thirteen), as
    ``_write_section`` writes them; False (nothing written) for any other headers."""
    if len(headers) != len(_CELERY_HEADERS) or headers.keys() != _CELERY_HEADERS:
        return False
    values = _CELERY_DEFAULTED_GET(headers)
    if values != _CELERY_DEFAULT_VALUES or tuple(map(type, values)) != _CELERY_DEFAULT_TYPES:
        return False
    for name, code, derived_flag, repeating in _CELERY_OWN:
        if flags & derived_flag:
            continue
        if repeating:
            _write_repeating(out, uuids, code, headers[name])
        else:
            out.append(code)
            _write_value(out, uuids, headers[name])
    return True


#: field code -> {text: the field's record}: the records of texts that repeat (a task name, a
#: worker's origin, a routing key), each made once; a cache over CACHE_MAX texts starts again
_RECORDS: dict[int, dict[str, bytes]] = {_CODE[key]: {} for key in _REPEATING}
#: {UUID text: its 16 bytes} of UUIDs written lately (a client's reply_to is in every message)
_PACKED: dict[str, bytes] = {}
CACHE_MAX = 4096


def _remember(cache: dict, key, value):
    """Keep ``value`` under ``key`` in one of the module's caches (it starts again once it holds
    CACHE_MAX entries); ``value``."""
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def _write_repeating(out: bytearray, uuids: dict, code: int, value) -> None:
    """A field of _REPEATING: its code and value, as a record made once for a short text."""
    if type(value) is str:
        cache = _RECORDS[code]
        record = cache.get(value)
        if record is None and len(value) < 0x80 and len(value) != 36 and value.isascii():
            record = _remember(cache, value, bytes((code, T_STR, len(value))) + value.encode("ascii"))
        if record is not None:
            out += record
            return
    out.append(code)
    _write_value(out, uuids, value)


def _write_body(out: bytearray, uuids: dict, body, raw: bytes | None) -> None:
    if raw is not None:
        if raw.endswith(CELERY_EMBED_TAIL):
            out.append(B_BASE64_EMBED)
            _blob(out, raw[: -len(CELERY_EMBED_TAIL)])
        else:
            out.append(B_BASE64)
            _blob(out, raw)
    elif type(body) is bytes or type(body) is Base64Body:
        out.append(B_BYTES)
        _blob(out, body)
    elif type(body) is str:
        out.append(B_TEXT)
        _blob(out, body.encode("utf-8", "surrogatepass"))
    else:
        out.append(B_VALUE)
        _write_value(out, uuids, body)


def _write_value(out: bytearray, uuids: dict, v) -> None:
    t = type(v)
    if t is str:
        n = len(v)
        if n < 0x80 and n != 36 and v.isascii():  # most values: a short text that is no UUID
            out.append(T_STR)
            out.append(n)
            out += v.encode("ascii")
            return
        ref = uuids.get(v)
        if ref is not None:  # a UUID written before in this message
            out.append(T_REF)
            _varint(out, ref)
            return
        packed = _PACKED.get(v)
        if packed is None and n == 36:
            packed = _uuid_bytes(v)
            if packed is not None:
                _remember(_PACKED, v, packed)
        if packed is not None:
            uuids[v] = len(uuids)
            out.append(T_UUID)
            out += packed
            return
        out.append(T_STR)
        _blob(out, v.encode("utf-8", "surrogatepass"))
    elif v is None:
        out.append(T_NONE)
    elif t is bool:
        out.append(T_TRUE if v else T_FALSE)
    elif t is int:
        out.append(T_INT)
        _varint(out, v << 1 if v >= 0 else ((-v) << 1) - 1)
    elif t is float:
        out.append(T_FLOAT)
        out += _DOUBLE.pack(v)
    elif t is bytes:
        out.append(T_BYTES)
        _blob(out, v)
    elif isinstance(v, list):
        out.append(T_LIST)
        _varint(out, len(v))
        for item in v:
            _write_value(out, uuids, item)
    elif isinstance(v, dict) and all(type(k) is str for k in v):
        out.append(T_DICT)
        _varint(out, len(v))
        for k, item in v.items():
            _blob(out, k.encode("utf-8", "surrogatepass"))
            _write_value(out, uuids, item)
    else:  # a tuple, a datetime, ...: what kombu's JSON makes of it, as the JSON layout did
        out.append(T_JSON)
        _blob(out, kombu_dumps(v).encode("utf-8", "surrogatepass"))


def _uuid_bytes(text: str) -> bytes | None:
    """The 16 bytes of a UUID in its canonical text (lowercase hex, dashes at 8-4-4-4-12), else
    None: only that text is what the reader makes of the bytes again."""
    if text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        return None
    digits = text.replace("-", "")
    try:
        packed = bytes.fromhex(digits)
    except ValueError:
        return None
    return packed if len(packed) == 16 and packed.hex() == digits else None


_DOUBLE = struct.Struct(">d")


def _same(a, b) -> bool:
    """``a == b`` with the types equal too (``0 == False`` is not the default ``False``)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _base64_body(message: dict) -> bytes | None:
    """The bytes of a message's body when it is exactly their base64 text (``body_encoding``
    base64), else None."""
    props = message.get("properties")
    body = message.get("body")
    if type(body) is Base64Body:  # the bytes themselves (the transport's publish)
        return bytes(body) if type(props) is dict and props.get("body_encoding") == "base64" else None
    if type(body) is not str or type(props) is not dict or props.get("body_encoding") != "base64":
        return None
    try:  # strict: only the alphabet, padding only at the end and only as much as is due
        raw = binascii.a2b_base64(body, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    # Four characters of a full group are three bytes and back: only a padded last group can be
    # another spelling of its bytes (low bits set that decoding drops), so only it is compared.
    tail = len(raw) % 3
    if tail and binascii.b2a_base64(raw[-tail:], newline=False) != body[-4:].encode("ascii"):
        return None
    return raw


_JSON_SCAN = json.JSONDecoder().scan_once  # (value, end) of the JSON at a position; StopIteration if none
_TAIL_TEXT = CELERY_EMBED_TAIL.decode("ascii")


def _reprs_of(raw: bytes, flags: int, kwargs_limit: int | None = None) -> dict | None:
    """{F_ARGSREPR: argsrepr, F_KWARGSREPR: kwargsrepr} (those ``flags`` ask for) as ``repr``
    makes them from a Celery JSON body ``[args, kwargs, embed]``, or None when ``raw`` is not
    one. A reader derives them again only when the writer found them equal to the headers'.

    A body as Celery writes it (``[[`` ... CELERY_EMBED_TAIL, kombu's ", " separators) has its
    args read alone and its kwargs only when asked (``{}`` without parsing); any other body is
    parsed whole, up to REPR_BODY_MAX bytes for the writer. ``kwargs_limit`` (the writer's):
    kwargs of a longer body are not parsed, and left out of the answer."""
    text = None
    if raw.startswith(b"[[") and raw.endswith(CELERY_EMBED_TAIL):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if text is not None:
        try:
            args, end = _JSON_SCAN(text, 1)
        except StopIteration:
            return None
        stop = len(text) - len(_TAIL_TEXT)  # where kwargs end
        if type(args) is list and text.startswith(", ", end):
            out = {F_ARGSREPR: repr(tuple(args))} if flags & F_ARGSREPR else {}
            if not flags & F_KWARGSREPR:
                return out
            if stop == end + 4 and text.startswith("{}", end + 2):
                out[F_KWARGSREPR] = "{}"
                return out
            if kwargs_limit is not None and len(raw) > kwargs_limit:
                return out
            try:
                kwargs, kwargs_end = _JSON_SCAN(text, end + 2)
            except StopIteration:
                return None
            if type(kwargs) is not dict or kwargs_end != stop:
                return None
            out[F_KWARGSREPR] = repr(kwargs)
            return out
    if kwargs_limit is not None and len(raw) > kwargs_limit:
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:
        return None
    if type(decoded) is not list or len(decoded) != 3 or type(decoded[0]) is not list \
            or type(decoded[1]) is not dict:
        return None
    out = {}
    if flags & F_ARGSREPR:
        out[F_ARGSREPR] = repr(tuple(decoded[0]))
    if flags & F_KWARGSREPR:
        out[F_KWARGSREPR] = repr(decoded[1])
    return out


# -- reading ---------------------------------------------------------------------------------
def decode(data: bytes | str, raw_body: bool = False) -> dict:
    """The kombu message dict of a stored record (this format, or the JSON written before it).
    CodecError (a ValueError) naming the problem for a record that is neither.

    ``raw_body``: a body stored as the bytes of its base64 text is given as those bytes, a
    ``Base64Body``, not as the text (a delivery: kombu would decode the text at once)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if data[:1] == b"{":
        if len(data) > MAX_VALUES and _json_items(data) > MAX_VALUES:
            raise CodecError(f"stored message (JSON) holds more than {MAX_VALUES} list and dict items")
        try:
            return kombu_loads(data)
        except RecursionError:
            raise CodecError("stored message (JSON) is nested too deep") from None
    if len(data) < 2:
        raise CodecError(f"stored message of {len(data)} byte(s) is too short")
    if data[0] != VERSION:
        raise CodecError(f"stored message has format version {data[0]}; this celery-pq reads version {VERSION} "
                         "and JSON")
    flags = data[1]
    if flags & ~_KNOWN_FLAGS:
        raise CodecError(f"stored message has unknown flags {flags:#04x}")
    start = 2
    if flags & F_ZSTD:
        if zstandard is None:
            raise CodecError("stored message is zstd-compressed and the zstandard package is not installed")
        data, start = _inflate(memoryview(data)[2:]), 0
    elif not isinstance(data, bytes):
        data = bytes(data)
    try:
        return _read_message(data, start, flags, raw_body)
    except (IndexError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise CodecError(f"stored message is truncated or corrupt ({exc!r})") from None
    except RecursionError:
        raise CodecError("stored message's lists and dicts are nested too deep") from None


def _inflate(frame) -> bytes:
    """The bytes of a zstd frame, when its header declares how many and at most MAX_INFLATED
    (checked before anything is allocated; a frame that holds more than it declares fails once
    the declared size is reached)."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(f"stored message's zstd frame is corrupt: {exc}") from None
    if size < 0:
        raise CodecError("stored message's zstd frame does not declare its size; not inflated")
    if size > MAX_INFLATED:
        raise CodecError(f"stored message's zstd frame declares {size} bytes, over the {MAX_INFLATED} "
                         "a record may inflate to; not inflated")
    try:
        return _zstd().decompressor.decompress(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(f"stored message's zstd frame is corrupt: {exc}") from None


def _json_items(text: bytes) -> int:
    """At least as many as the list and dict items of the JSON ``text`` (each item is the first
    of its list or dict, or follows a comma)."""
    return text.count(b",") + text.count(b"[") + text.count(b"{")


class _Seen(list):
    """The UUIDs one record's reader has read (a reference names one by its index), and how many
    list and dict items the record may still make (``left``)."""

    __slots__ = ("left",)

    def __init__(self):
        super().__init__()
        self.left = MAX_VALUES

    def take(self, items: int) -> None:
        self.left -= items
        if self.left < 0:
            raise CodecError(f"stored message holds more than {MAX_VALUES} list and dict items")


def _read_message(data: bytes, pos: int, flags: int, raw_body: bool = False) -> dict:
    """The message of the records in ``data`` from ``pos`` to its end."""
    celery = bool(flags & F_CELERY)
    message, headers, props, info = sections = [d.copy() for d in _TEMPLATES[celery]]
    for s, name, v in _MUTABLE[celery]:
        sections[s][name] = v.copy()
    props["delivery_info"] = info
    message["headers"] = headers
    message["properties"] = props
    uuids = _Seen()
    raw = None  # the body's bytes, when it was base64
    n = len(data)
    field = _FIELD
    fields = 0
    while pos < n:
        fields += 1
        if fields > MAX_VALUES:
            raise CodecError(f"stored message has more than {MAX_VALUES} fields")
        code = data[pos]
        pos += 1
        if code > C_ABSENT:
            if code == _C_BODY:
                message["body"], raw, pos = _read_body(data, pos, uuids, raw_body)
                continue
            s, name = field[code]
            target = sections[s]
        elif code == C_ABSENT:
            s, name = field[data[pos]]
            pos += 1
            sections[s].pop(name, None)
            continue
        else:
            length, pos = _read_varint(data, pos)
            end = pos + length
            if end > n:
                raise IndexError("a field name runs past the end")
            name = data[pos:end].decode("utf-8", "surrogatepass")
            pos = end
            target = sections[code]
        tag = data[pos]  # the common values inline, the others in _read_value
        if tag == T_STR and data[pos + 1] < 0x80:
            end = pos + 2 + data[pos + 1]
            if end > n:
                raise IndexError("a string runs past the end")
            target[name] = data[pos + 2:end].decode("utf-8", "surrogatepass")
            pos = end
        elif tag == T_UUID:
            pos += 17
            if pos > n:
                raise IndexError("a UUID runs past the end")
            h = data[pos - 16:pos].hex()
            target[name] = text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            uuids.append(text)
        elif tag == T_REF and data[pos + 1] < 0x80:
            target[name] = uuids[data[pos + 1]]
            pos += 2
        elif tag == T_NONE:
            target[name] = None
            pos += 1
        else:
            target[name], pos = _read_value(data, pos, uuids)
    wanted = flags & (F_ARGSREPR | F_KWARGSREPR)
    if wanted:
        derived = _derived_reprs(raw, wanted) if raw is not None else None
        if derived is None or len(derived) != bin(wanted).count("1"):
            raise CodecError("stored message's argsrepr is derived from a body that is not Celery's")
        if wanted & F_ARGSREPR:
            headers["argsrepr"] = derived[F_ARGSREPR]
        if wanted & F_KWARGSREPR:
            headers["kwargsrepr"] = derived[F_KWARGSREPR]
    return message


#: argsrepr/kwargsrepr a reader derived lately, by (body, flags), for bodies of at most
#: REPRS_CACHED_BODY bytes: tasks sent with the same small args (none, an id) are common.
_REPRS: dict[tuple[bytes, int], dict] = {}
REPRS_CACHED_BODY = 256


def _derived_reprs(raw: bytes, flags: int) -> dict | None:
    """``_reprs_of(raw, flags)``, from _REPRS when the body is small and was read lately."""
    if len(raw) > REPRS_CACHED_BODY:
        return _reprs_of(raw, flags)
    key = (raw, flags)
    derived = _REPRS.get(key)
    if derived is None:
        derived = _reprs_of(raw, flags)
        if derived is not None:
            _remember(_REPRS, key, derived)
    return derived


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def _read_blob(data: bytes, pos: int) -> tuple[bytes, int]:
    length, pos = _read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise IndexError("a length runs past the end")
    return bytes(data[pos:end]), end


def _read_body(data: bytes, pos: int, uuids: _Seen, raw_body: bool = False) -> tuple[object, bytes | None, int]:
    """(body, its bytes when it was base64 or None, position after it); with ``raw_body`` a
    base64 body is its bytes (a Base64Body)."""
    form = data[pos]
    pos += 1
    if form == B_BASE64 or form == B_BASE64_EMBED:
        raw, pos = _read_blob(data, pos)
        if form == B_BASE64_EMBED:
            raw += CELERY_EMBED_TAIL
        if raw_body:
            return Base64Body(raw), raw, pos
        return binascii.b2a_base64(raw, newline=False).decode("ascii"), raw, pos
    if form == B_BYTES:
        body, pos = _read_blob(data, pos)
        return body, None, pos
    if form == B_TEXT:
        body, pos = _read_blob(data, pos)
        return body.decode("utf-8", "surrogatepass"), None, pos
    if form == B_VALUE:
        body, pos = _read_value(data, pos, uuids)
        return body, None, pos
    raise CodecError(f"stored message has unknown body form {form}")


def _read_value(data: bytes, pos: int, uuids: _Seen) -> tuple[object, int]:
    """(the value at ``pos``, the position after it)."""
    tag = data[pos]
    pos += 1
    if tag == T_STR:
        text, pos = _read_blob(data, pos)
        return text.decode("utf-8", "surrogatepass"), pos
    if tag == T_NONE:
        return None, pos
    if tag == T_UUID:
        end = pos + 16
        if end > len(data):
            raise IndexError("a UUID runs past the end")
        h = data[pos:end].hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        uuids.append(text)
        return text, end
    if tag == T_REF:
        ref, pos = _read_varint(data, pos)
        return uuids[ref], pos
    if tag == T_INT:
        z, pos = _read_varint(data, pos)
        return (z >> 1 if not z & 1 else -((z + 1) >> 1)), pos
    if tag == T_TRUE:
        return True, pos
    if tag == T_FALSE:
        return False, pos
    if tag == T_FLOAT:
        return _DOUBLE.unpack(data[pos:pos + 8])[0], pos + 8
    if tag == T_BYTES:
        return _read_blob(data, pos)
    if tag == T_LIST:
        count, pos = _read_varint(data, pos)
        uuids.take(count)
        items = []
        for _ in range(count):
            item, pos = _read_value(data, pos, uuids)
            items.append(item)
        return items, pos
    if tag == T_DICT:
        count, pos = _read_varint(data, pos)
        uuids.take(count)
        d = {}
        for _ in range(count):
            key, pos = _read_blob(data, pos)
            d[key.decode("utf-8", "surrogatepass")], pos = _read_value(data, pos, uuids)
        return d, pos
    if tag == T_JSON:
        text, pos = _read_blob(data, pos)
        uuids.take(_json_items(text))
        return kombu_loads(text.decode("utf-8", "surrogatepass")), pos
    raise CodecError(f"stored message has unknown value tag {tag}")

