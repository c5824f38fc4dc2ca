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
  kwargs gives (checked at write; otherwise kept as they are), for bodies up to REPR_BODY_MAX;
- the rest of the record zstd-compressed when that makes it smaller (records of
  ``COMPRESS_MIN`` bytes and over; benchmarks/memory_tasks.py measures it).

Anything else is kept as it is: a field not in the table is written with its name, a value of a
type this codec does not write itself (a datetime, a Decimal) as kombu's JSON of it.

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

import base64
import binascii
import json
import re
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
#: argsrepr/kwargsrepr are derived from bodies of at most this many bytes: beyond it Celery has
#: usually cut them (argsrepr_maxsize, 1 KB) and parsing the body on every read costs more.
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
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
assert _TABLE_START + len(FIELDS) < 0x80  # every code is one byte (the reader counts on it)


def _defaults(section: int, celery: bool) -> dict:
    """The fields a section has by default."""
    if section == S_HEADERS and not celery:
        return {}
    return {name: d for s, name, d in FIELDS if s == section and d is not _NO_DEFAULT}


_DEFAULTS = {(s, c): _defaults(s, c) for s in range(4) for c in (False, True)}
#: (section, celery) -> {field name: (code, default or _NO_DEFAULT, subsection or None)}: the writer's table
_NAMES = {(sec, c): {name: (_CODE[s, name], _DEFAULTS[sec, c].get(name, _NO_DEFAULT), _SUBSECTIONS.get((s, name)))
                     for s, name, _ in FIELDS if s == sec}
          for sec in range(4) for c in (False, True)}
#: (section, celery) -> names of the defaults and subsections a section has unless a record says not
_EXPECTED = {(sec, c): (*_DEFAULTS[sec, c], *(name for (s, name) in _SUBSECTIONS if s == sec))
             for sec in range(4) for c in (False, True)}
#: defaults that are lists or dicts: the reader copies them per message
_MUTABLE = {key: [(n, v) for n, v in d.items() if type(v) in (list, dict)] for key, d in _DEFAULTS.items()}


class CodecError(ValueError):
    """A stored record this codec cannot read (or a message it cannot write)."""


# -- writing ---------------------------------------------------------------------------------
def encode(message: dict) -> bytes:
    """The stored form of a kombu message dict."""
    if not isinstance(message, dict):
        raise CodecError(f"a message is a dict, not {type(message).__name__}")
    w = _Writer(message)
    headers = message.get("headers")
    celery = isinstance(headers, dict) and "lang" in headers and "task" in headers
    flags = F_CELERY if celery else 0
    skip: set[tuple[int, str]] = set()
    w.raw_body = raw = _base64_body(message)
    if isinstance(headers, dict) and raw is not None and len(raw) <= REPR_BODY_MAX \
            and message.get("content-type") == "application/json" and message.get("content-encoding") == "utf-8":
        # Only reprs Celery did not cut ("...") can be repr's: the others are not computed.
        want = [(key, flag) for key, flag in (("argsrepr", F_ARGSREPR), ("kwargsrepr", F_KWARGSREPR))
                if type(headers.get(key)) is str and "..." not in headers[key]]
        derived = _reprs_of(raw, flags=sum(flag for _, flag in want)) if want else None
        if derived is not None:
            for key, flag in want:
                if headers[key] == derived[flag]:
                    flags |= flag
                    skip.add((S_HEADERS, key))
    w.section(S_MESSAGE, message, celery, skip)
    body = w.out
    if zstandard is not None and len(body) >= COMPRESS_MIN:
        packed = _zstd().compressor.compress(bytes(body))
        if len(packed) < len(body):
            return bytes((VERSION, flags | F_ZSTD)) + packed
    return bytes((VERSION, flags)) + body


_local = threading.local()


def _zstd():
    """This thread's zstd compressor and decompressor (made once: making one costs more than
    compressing a message; they are not to be shared between threads)."""
    z = getattr(_local, "zstd", None)
    if z is None:
        z = _local.zstd = SimpleNamespace(compressor=zstandard.ZstdCompressor(level=ZSTD_LEVEL),
                                          decompressor=zstandard.ZstdDecompressor())
    return z


class _Writer:
    def __init__(self, message: dict):
        self.message = message
        self.out = bytearray()
        self.uuids: dict[str, int] = {}
        self.raw_body: bytes | None = None  # the message's body as bytes, when it is base64 text

    def varint(self, n: int) -> None:
        out = self.out
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)

    def blob(self, data: bytes) -> None:
        self.varint(len(data))
        self.out += data

    def section(self, section: int, d: dict, celery: bool, skip=frozenset()) -> None:
        names = _NAMES[section, celery]
        expected = 0  # fields of _EXPECTED present in d
        out = self.out
        for name, value in d.items():
            info = names.get(name)
            if info is None:  # a field the table does not name
                if type(name) is not str:
                    raise CodecError(f"message field name {name!r} is not a string")
                self.varint(section)
                self.blob(name.encode("utf-8", "surrogatepass"))
                self.value(value)
                continue
            code, default, sub = info
            if default is not _NO_DEFAULT:
                expected += 1
                if value == default and type(value) is type(default) \
                        and (type(value) not in (list, dict) or _same(value, default)):
                    continue
            elif sub is not None:
                expected += 1
                if isinstance(value, dict):  # a dict, or a subclass of one (read back as a dict)
                    self.section(sub, value, celery, skip)
                    continue
            if skip and (section, name) in skip:
                continue
            out.append(code)
            if code == _C_BODY:
                self.body(value, d)
            else:
                self.value(value)
        if expected < len(_EXPECTED[section, celery]):
            for name in _EXPECTED[section, celery]:
                if name not in d:
                    self.out.append(C_ABSENT)
                    self.out.append(_CODE[section, name])

    def body(self, body, message: dict) -> None:
        out = self.out
        if message is self.message:
            raw = self.raw_body
            if raw is not None:
                if raw.endswith(CELERY_EMBED_TAIL):
                    out.append(B_BASE64_EMBED)
                    self.blob(raw[: -len(CELERY_EMBED_TAIL)])
                else:
                    out.append(B_BASE64)
                    self.blob(raw)
                return
        if type(body) is bytes:
            out.append(B_BYTES)
            self.blob(body)
        elif type(body) is str:
            out.append(B_TEXT)
            self.blob(body.encode("utf-8", "surrogatepass"))
        else:
            out.append(B_VALUE)
            self.value(body)

    def value(self, v) -> None:
        out = self.out
        t = type(v)
        if t is str:
            if len(v) == 36 and v[8] == "-" and _UUID.match(v):
                ref = self.uuids.get(v)
                if ref is not None:
                    out.append(T_REF)
                    self.varint(ref)
                    return
                self.uuids[v] = len(self.uuids)
                out.append(T_UUID)
                out += bytes.fromhex(v.replace("-", ""))
                return
            data = v.encode("utf-8", "surrogatepass")
            if len(data) < 0x80:  # a one-byte length: most strings
                out.append(T_STR)
                out.append(len(data))
                out += data
            else:
                out.append(T_STR)
                self.blob(data)
        elif v is None:
            out.append(T_NONE)
        elif t is bool:
            out.append(T_TRUE if v else T_FALSE)
        elif t is int:
            out.append(T_INT)
            self.varint(v << 1 if v >= 0 else ((-v) << 1) - 1)
        elif t is float:
            out.append(T_FLOAT)
            out += struct.pack(">d", v)
        elif t is bytes:
            out.append(T_BYTES)
            self.blob(v)
        elif isinstance(v, list):
            out.append(T_LIST)
            self.varint(len(v))
            for item in v:
                self.value(item)
        elif isinstance(v, dict) and all(type(k) is str for k in v):
            out.append(T_DICT)
            self.varint(len(v))
            for k, item in v.items():
                self.blob(k.encode("utf-8", "surrogatepass"))
                self.value(item)
        else:  # a tuple, a datetime, ...: what kombu's JSON makes of it, as the JSON layout did
            out.append(T_JSON)
            self.blob(kombu_dumps(v).encode("utf-8", "surrogatepass"))


def _same(a, b) -> bool:
    """``a == b`` with the types equal too (``0 == False`` is not the default ``False``)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _unbase64(text: str) -> bytes | None:
    """The bytes of a base64 text, or None when the text is not exactly their base64."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _base64_body(message: dict) -> bytes | None:
    """The bytes of a message's body when it is their base64 text (``body_encoding`` base64)."""
    props = message.get("properties")
    body = message.get("body")
    if type(body) is not str or type(props) is not dict or props.get("body_encoding") != "base64":
        return None
    return _unbase64(body)


def _reprs_of(raw: bytes, flags: int) -> dict | None:
    """{F_ARGSREPR: argsrepr, F_KWARGSREPR: kwargsrepr} (those ``flags`` ask for) as ``repr``
    makes them from a Celery JSON body ``[args, kwargs, embed]``, or None when ``raw`` is not
    one. A reader derives them again only when the writer found them equal to the headers'."""
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
def decode(data: bytes | str) -> dict:
    """The kombu message dict of a stored record (this format, or the JSON written before it).
    CodecError (a ValueError) naming the problem for a record that is neither."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if data[:1] == b"{":
        return kombu_loads(data)
    if len(data) < 2:
        raise CodecError(f"stored message of {len(data)} byte(s) is too short")
    if data[0] != VERSION:
        raise CodecError(f"stored message has format version {data[0]}; this celery-pq reads version {VERSION} "
                         "and JSON")
    flags = data[1]
    if flags & ~_KNOWN_FLAGS:
        raise CodecError(f"stored message has unknown flags {flags:#04x}")
    body = memoryview(data)[2:]
    if flags & F_ZSTD:
        if zstandard is None:
            raise CodecError("stored message is zstd-compressed and the zstandard package is not installed")
        try:
            body = memoryview(_zstd().decompressor.decompress(body))
        except zstandard.ZstdError as exc:
            raise CodecError(f"stored message's zstd frame is corrupt: {exc}") from None
    try:
        return _Reader(body, flags).message()
    except (IndexError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise CodecError(f"stored message is truncated or corrupt ({exc!r})") from None


class _Reader:
    def __init__(self, data: memoryview, flags: int):
        self.data = data
        self.pos = 0
        self.flags = flags
        self.uuids: list[str] = []
        self.raw_body: bytes | None = None  # the body's bytes, when it was base64

    def varint(self) -> int:
        data, pos = self.data, self.pos
        n = shift = 0
        while True:
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return n
            shift += 7

    def blob(self) -> bytes:
        n = self.varint()
        start = self.pos
        self.pos = end = start + n
        if end > len(self.data):
            raise IndexError("a length runs past the end")
        return bytes(self.data[start:end])

    def text(self) -> str:
        return self.blob().decode("utf-8", "surrogatepass")

    def message(self) -> dict:
        celery = bool(self.flags & F_CELERY)
        sections = []
        for s in range(4):
            d = dict(_DEFAULTS[s, celery])
            for name, v in _MUTABLE[s, celery]:
                d[name] = _copy(v)
            sections.append(d)
        message, headers, props = sections[S_MESSAGE], sections[S_HEADERS], sections[S_PROPERTIES]
        props["delivery_info"] = sections[S_DELIVERY_INFO]
        message["headers"] = headers
        message["properties"] = props
        data, n, field, value = self.data, len(self.data), _FIELD, self.value
        while self.pos < n:
            code = data[self.pos]
            self.pos += 1
            if code > C_ABSENT:
                if code == _C_BODY:
                    message["body"] = self.body()
                else:
                    s, name = field[code]
                    sections[s][name] = value()
            elif code == C_ABSENT:
                s, name = field[data[self.pos]]
                self.pos += 1
                sections[s].pop(name, None)
            else:
                name = self.text()
                sections[code][name] = value()
        wanted = self.flags & (F_ARGSREPR | F_KWARGSREPR)
        if wanted:
            derived = _reprs_of(self.raw_body, wanted) if self.raw_body is not None else None
            if derived is None:
                raise CodecError("stored message's argsrepr is derived from a body that is not Celery's")
            if wanted & F_ARGSREPR:
                headers["argsrepr"] = derived[F_ARGSREPR]
            if wanted & F_KWARGSREPR:
                headers["kwargsrepr"] = derived[F_KWARGSREPR]
        return message

    def body(self):
        form = self.data[self.pos]
        self.pos += 1
        if form == B_BASE64 or form == B_BASE64_EMBED:
            raw = self.blob() if form == B_BASE64 else self.blob() + CELERY_EMBED_TAIL
            self.raw_body = raw
            return base64.b64encode(raw).decode("ascii")
        if form == B_BYTES:
            return self.blob()
        if form == B_TEXT:
            return self.text()
        if form == B_VALUE:
            return self.value()
        raise CodecError(f"stored message has unknown body form {form}")

    def value(self):
        data = self.data
        tag = data[self.pos]
        self.pos += 1
        if tag == T_STR:
            n = data[self.pos]
            if n < 0x80:  # one-byte length: most strings
                start = self.pos + 1
                self.pos = end = start + n
                if end > len(data):
                    raise IndexError("a string runs past the end")
                return str(data[start:end], "utf-8", "surrogatepass")
            return self.text()
        if tag == T_NONE:
            return None
        if tag == T_UUID:
            start = self.pos
            self.pos = end = start + 16
            if end > len(data):
                raise IndexError("a UUID runs past the end")
            h = data[start:end].hex()
            text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            self.uuids.append(text)
            return text
        if tag == T_REF:
            return self.uuids[self.varint()]
        if tag == T_INT:
            z = self.varint()
            return z >> 1 if not z & 1 else -((z + 1) >> 1)
        if tag == T_TRUE:
            return True
        if tag == T_FALSE:
            return False
        if tag == T_FLOAT:
            start = self.pos
            self.pos += 8
            return struct.unpack(">d", data[start:self.pos])[0]
        if tag == T_BYTES:
            return self.blob()
        if tag == T_LIST:
            return [self.value() for _ in range(self.varint())]
        if tag == T_DICT:
            d = {}
            for _ in range(self.varint()):
                key = self.text()
                d[key] = self.value()
            return d
        if tag == T_JSON:
            return kombu_loads(self.text())
        raise CodecError(f"stored message has unknown value tag {tag}")


def _copy(value):
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    return value
