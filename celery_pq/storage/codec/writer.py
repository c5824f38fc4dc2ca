"""The codec's writer: ``encode(message) -> bytes``. Plain functions over a bytearray, the common
values inline and a Celery task or plain kombu message written without a loop over its fields:
docs/storage.md ("CPU") says why and what it costs."""

from __future__ import annotations

import binascii
import operator
import re

from kombu.utils.json import dumps as kombu_dumps

from . import layout as L
from .bounds import MAX_INT_BYTES, MAX_VALUES, compress, remember
from .layout import Base64Body, CodecError
from .reader import read_message
from .reprs import derivable_reprs

#: headers the reader derives from the body when the flag says so
_DERIVED = {(L.S_HEADERS, "argsrepr"): L.F_ARGSREPR, (L.S_HEADERS, "kwargsrepr"): L.F_KWARGSREPR}
#: (section, celery) -> {name: (code, default or NO_DEFAULT, subsection or None, F_* flag or 0)}
_NAMES = {
    (sec, c): {
        name: (
            L.CODE[s, name],
            L.DEFAULTS[sec, c].get(name, L.NO_DEFAULT),
            L.SUBSECTIONS.get((s, name)),
            _DERIVED.get((s, name), 0),
        )
        for s, name, _ in L.FIELDS
        if s == sec
    }
    for sec in range(4)
    for c in (False, True)
}
#: (section, celery) -> the defaults and subsections a section has unless a record says not
_EXPECTED = {
    (sec, c): (*L.DEFAULTS[sec, c], *(name for (s, name) in L.SUBSECTIONS if s == sec))
    for sec in range(4)
    for c in (False, True)
}

#: Celery's protocol-2 headers in table order (as_task_v2's): those with a default as one tuple
#: to compare at once, those without as (name, code, F_* flag, repeating)
_CELERY_DEFAULTED = tuple((name, d) for name, d in L.CELERY_HEADERS.items() if d is not L.NO_DEFAULT)
_CELERY_DEFAULTED_GET = operator.itemgetter(*(name for name, _ in _CELERY_DEFAULTED))
_CELERY_DEFAULT_VALUES = tuple(d for _, d in _CELERY_DEFAULTED)
_CELERY_DEFAULT_TYPES = tuple(type(d) for _, d in _CELERY_DEFAULTED)
#: fields whose values repeat between messages: their records come from _RECORDS
_REPEATING = frozenset((s, n) for s, n, _ in L.FIELDS if n in ("task", "origin", "routing_key", "exchange"))
_CELERY_OWN = tuple(
    (name, L.CODE[L.S_HEADERS, name], _DERIVED.get((L.S_HEADERS, name), 0), (L.S_HEADERS, name) in _REPEATING)
    for name, d in L.CELERY_HEADERS.items()
    if d is L.NO_DEFAULT
)
_CELERY_HEADERS = frozenset(L.CELERY_HEADERS)
#: a Celery task message's own fields and its properties, as kombu's virtual channel hands them over
_CELERY_MESSAGE = frozenset({"body", "content-encoding", "content-type", "headers", "properties"})
_CELERY_PROPERTIES = frozenset(
    {"correlation_id", "reply_to", "delivery_mode", "delivery_info", "priority", "body_encoding"}
)
_DELIVERY_INFO = frozenset({"exchange", "routing_key"})
_C_CORRELATION_ID, _C_REPLY_TO, _C_PRIORITY = (
    L.CODE[L.S_PROPERTIES, n] for n in ("correlation_id", "reply_to", "priority")
)
_C_ROUTING_KEY = L.CODE[L.S_DELIVERY_INFO, "routing_key"]


def encode(message: dict) -> bytes:
    """The stored form of a kombu message dict."""
    if not isinstance(message, dict):
        raise CodecError(f"a message is a dict, not {type(message).__name__}")
    headers = message.get("headers")
    celery = isinstance(headers, dict) and "lang" in headers and "task" in headers
    flags = L.F_CELERY if celery else 0
    raw = _base64_body(message)
    if (
        raw is not None
        and isinstance(headers, dict)
        and message.get("content-type") == "application/json"
        and message.get("content-encoding") == "utf-8"
    ):
        flags |= derivable_reprs(headers, raw)
    out = bytearray()
    if celery:
        if raw is None or not _write_celery(out, message, flags, raw):
            _write_section(out, {}, L.S_MESSAGE, message, celery, flags, raw)
    elif not _write_plain(out, message, raw):
        _write_section(out, {}, L.S_MESSAGE, message, celery, flags, raw)
    if len(out) > MAX_VALUES:  # a value takes a byte at least: a shorter record holds fewer
        try:  # nothing written of a record the reader would refuse
            read_message(bytes(out), 0, flags & ~(L.F_ARGSREPR | L.F_KWARGSREPR), raw_body=True)
        except CodecError as exc:
            raise CodecError(f"message cannot be stored: {exc}") from None
    packed = compress(out)
    if packed is not None:
        return bytes((L.VERSION, flags | L.F_ZSTD)) + packed
    return bytes((L.VERSION, flags)) + out


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


#: Seven binary digits: the groups of a long integer's varint.
_SEPTET = re.compile("[01]{7}")


def _write_int(out: bytearray, v: int) -> None:
    """An integer as its zigzag varint, in linear time (a long one from its binary text: each
    shift would copy the number). CodecError for one over MAX_INT_BYTES."""
    z = v << 1 if v >= 0 else ((-v) << 1) - 1
    bits = z.bit_length()
    if bits <= 64:
        _varint(out, z)
        return
    if bits > 7 * MAX_INT_BYTES:
        raise CodecError(f"an integer of {bits} bits cannot be stored (at most {7 * MAX_INT_BYTES})")
    septets = _SEPTET.findall(format(z, "b").zfill(-(-bits // 7) * 7))  # most significant first
    # least significant first, each with the high bit set but the last
    text = "1" + "1".join(reversed(septets[1:])) + "0" + septets[0]
    out += int(text, 2).to_bytes(len(septets), "big")


def _blob(out: bytearray, data: bytes) -> None:
    n = len(data)
    if n < 0x80:
        out.append(n)
    else:
        _varint(out, n)
    out += data


def _write_section(
    out: bytearray, uuids: dict, section: int, d: dict, celery: bool, flags: int, raw: bytes | None
) -> None:
    """The records of one section's fields, subsections inline. ``uuids``: {UUID text: index}
    written so far; ``raw``: the body's bytes when it is base64 text."""
    names = _NAMES[section, celery]
    expected = 0  # fields of _EXPECTED present in d
    for name, value in d.items():
        info = names.get(name)
        if info is None:  # a field the table does not name
            if type(name) is not str:
                raise CodecError(f"message field name {name!r} is not a string")
            out.append(section)  # below 0x80: its varint is one byte
            _blob(out, name.encode("utf-8", "surrogatepass"))
            _write_value(out, uuids, value)
            continue
        code, default, sub, derived_flag = info
        if default is not L.NO_DEFAULT:
            expected += 1
            if value is default or (
                type(value) is type(default)
                and value == default
                and (type(value) not in (list, dict) or _same(value, default))
            ):
                continue
        elif sub is not None:
            expected += 1
            if isinstance(value, dict):  # a subclass is read back as a dict
                if sub != L.S_HEADERS or not celery or not _write_celery_headers(out, uuids, value, flags):
                    _write_section(out, uuids, sub, value, celery, flags, raw)
                continue
        if flags & derived_flag:
            continue
        out.append(code)
        if code == L.C_BODY:
            _write_body(out, uuids, value, raw)
        else:
            _write_value(out, uuids, value)
    if expected < len(_EXPECTED[section, celery]):
        for name in _EXPECTED[section, celery]:
            if name not in d:
                out.append(L.C_ABSENT)
                out.append(L.CODE[section, name])


def _write_celery(out: bytearray, message: dict, flags: int, raw: bytes) -> bool:
    """What ``_write_section`` writes for a Celery task message as kombu's virtual channel hands
    it over (five fields, JSON in UTF-8, its properties, ``delivery_mode`` 2, exchange ""),
    without a loop; False (nothing written) for any other message. ``raw``: the body's bytes."""
    headers, props = message["headers"], message.get("properties")
    if (
        message.keys() != _CELERY_MESSAGE
        or type(props) is not dict
        or props.keys() != _CELERY_PROPERTIES
        or type(headers) is not dict
    ):
        return False
    info, mode, priority = props["delivery_info"], props["delivery_mode"], props["priority"]
    if (
        type(info) is not dict
        or info.keys() != _DELIVERY_INFO
        or type(info["exchange"]) is not str
        or info["exchange"]
        or type(mode) is not int
        or mode != 2
        or type(priority) is not int
        or type(props["body_encoding"]) is not str
        or type(message["content-type"]) is not str
        or message["content-type"] != "application/json"
        or type(message["content-encoding"]) is not str
        or message["content-encoding"] != "utf-8"
    ):
        return False
    uuids: dict[str, int] = {}
    out.append(L.C_BODY)
    _write_body(out, uuids, None, raw)
    if not _write_celery_headers(out, uuids, headers, flags):
        _write_section(out, uuids, L.S_HEADERS, headers, True, flags, raw)
    out.append(_C_CORRELATION_ID)
    _write_value(out, uuids, props["correlation_id"])
    out.append(_C_REPLY_TO)
    _write_value(out, uuids, props["reply_to"])
    _write_repeating(out, uuids, _C_ROUTING_KEY, info["routing_key"])
    if priority:
        out.append(_C_PRIORITY)
        _write_value(out, uuids, priority)
    return True


#: a plain kombu message (published outside Celery) as kombu's virtual channel hands it over:
#: its fields, properties and delivery info in this order, its headers empty
_PLAIN_MESSAGE = ("body", "content-encoding", "content-type", "headers", "properties")
_PLAIN_PROPERTIES = ("delivery_mode", "delivery_info", "priority", "body_encoding")
_PLAIN_DELIVERY_INFO = ("exchange", "routing_key")
#: (code, default or NO_DEFAULT, repeating) of the fields _write_plain writes after the body, in order
_PLAIN_FIELDS = tuple(
    (L.CODE[f], L.DEFAULTS[f[0], False].get(f[1], L.NO_DEFAULT), f in _REPEATING)
    for f in (
        (L.S_MESSAGE, "content-encoding"),
        (L.S_MESSAGE, "content-type"),
        (L.S_PROPERTIES, "delivery_mode"),
        (L.S_DELIVERY_INFO, "exchange"),
        (L.S_DELIVERY_INFO, "routing_key"),
        (L.S_PROPERTIES, "priority"),
        (L.S_PROPERTIES, "body_encoding"),
    )
)


def _write_plain(out: bytearray, message: dict, raw: bytes | None) -> bool:
    """What ``_write_section`` writes for a plain kombu message (``_PLAIN_MESSAGE``, no headers),
    without a loop; False (nothing written) for any other. ``raw``: the body's bytes if base64."""
    if tuple(message) != _PLAIN_MESSAGE:
        return False
    headers, props = message["headers"], message["properties"]
    if type(headers) is not dict or headers or type(props) is not dict or tuple(props) != _PLAIN_PROPERTIES:
        return False
    info = props["delivery_info"]
    if type(info) is not dict or tuple(info) != _PLAIN_DELIVERY_INFO:
        return False
    uuids: dict[str, int] = {}
    out.append(L.C_BODY)
    _write_body(out, uuids, message["body"], raw)
    values = (message["content-encoding"], message["content-type"], props["delivery_mode"], info["exchange"])
    for (code, default, repeating), value in zip(
        _PLAIN_FIELDS, (*values, info["routing_key"], props["priority"], props["body_encoding"])
    ):
        if value is default or (type(value) is type(default) and value == default):
            continue  # a field without a default (NO_DEFAULT) is always written
        if repeating:
            _write_repeating(out, uuids, code, value)
        else:
            out.append(code)
            _write_value(out, uuids, value)
    return True


def _write_celery_headers(out: bytearray, uuids: dict, headers: dict, flags: int) -> bool:
    """What ``_write_section`` writes for Celery's protocol-2 headers when they are exactly its
    fields, every default held (one tuple comparison); False (nothing written) otherwise."""
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


#: field code -> {text: its record}: records of repeating texts (task name, origin, routing key)
_RECORDS: dict[int, dict[str, bytes]] = {L.CODE[key]: {} for key in _REPEATING}
#: {UUID text: its 16 bytes} written lately (a client's reply_to is in every message)
_PACKED: dict[str, bytes] = {}
#: A UUID in canonical text (lowercase, 8-4-4-4-12), the only text the reader makes again
_UUID_TEXT = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _write_repeating(out: bytearray, uuids: dict, code: int, value) -> None:
    """A field of _REPEATING: code and value, a short text's record made once."""
    if type(value) is str:
        cache = _RECORDS[code]
        record = cache.get(value)
        if record is None and len(value) < 0x80 and len(value) != 36 and value.isascii():
            record = remember(cache, value, bytes((code, L.T_STR, len(value))) + value.encode("ascii"))
        if record is not None:
            out += record
            return
    out.append(code)
    _write_value(out, uuids, value)


def _write_body(out: bytearray, uuids: dict, body, raw: bytes | None) -> None:
    if raw is not None:
        if raw.endswith(L.CELERY_EMBED_TAIL):
            out.append(L.B_BASE64_EMBED)
            _blob(out, raw[: -len(L.CELERY_EMBED_TAIL)])
        else:
            out.append(L.B_BASE64)
            _blob(out, raw)
    elif type(body) is bytes or type(body) is Base64Body:
        out.append(L.B_BYTES)
        _blob(out, body)
    elif type(body) is str:
        out.append(L.B_TEXT)
        _blob(out, body.encode("utf-8", "surrogatepass"))
    else:
        out.append(L.B_VALUE)
        _write_value(out, uuids, body)


def _write_value(out: bytearray, uuids: dict, v) -> None:
    t = type(v)
    if t is str:
        n = len(v)
        if n < 0x80 and n != 36 and v.isascii():  # most values: a short text, no UUID
            out.append(L.T_STR)
            out.append(n)
            out += v.encode("ascii")
            return
        ref = uuids.get(v)
        if ref is not None:  # a UUID written before in this message
            out.append(L.T_REF)
            _varint(out, ref)
            return
        packed = _PACKED.get(v)
        if packed is None and n == 36 and _UUID_TEXT.match(v):
            packed = remember(_PACKED, v, bytes.fromhex(v.replace("-", "")))
        if packed is not None:
            uuids[v] = len(uuids)
            out.append(L.T_UUID)
            out += packed
            return
        out.append(L.T_STR)
        _blob(out, v.encode("utf-8", "surrogatepass"))
    elif v is None:
        out.append(L.T_NONE)
    elif t is bool:
        out.append(L.T_TRUE if v else L.T_FALSE)
    elif t is int:
        out.append(L.T_INT)
        _write_int(out, v)
    elif t is float:
        out.append(L.T_FLOAT)
        out += L.DOUBLE.pack(v)
    elif t is bytes:
        out.append(L.T_BYTES)
        _blob(out, v)
    elif isinstance(v, list):
        out.append(L.T_LIST)
        _varint(out, len(v))
        for item in v:
            _write_value(out, uuids, item)
    elif isinstance(v, dict) and all(type(k) is str for k in v):
        out.append(L.T_DICT)
        _varint(out, len(v))
        for k, item in v.items():
            _blob(out, k.encode("utf-8", "surrogatepass"))
            _write_value(out, uuids, item)
    else:  # a tuple, a datetime, ...: kombu's JSON of it
        out.append(L.T_JSON)
        _blob(out, kombu_dumps(v).encode("utf-8", "surrogatepass"))


def _same(a, b) -> bool:
    """``a == b`` with equal types too (``0`` is not the default ``False``)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _base64_body(message: dict) -> bytes | None:
    """The bytes of a base64 body that is exactly their base64 text, else None."""
    props = message.get("properties")
    body = message.get("body")
    if type(body) is Base64Body:
        return bytes(body) if type(props) is dict and props.get("body_encoding") == "base64" else None
    if type(body) is not str or type(props) is not dict or props.get("body_encoding") != "base64":
        return None
    try:  # strict: only the alphabet, padding only at the end and only as much as is due
        raw = binascii.a2b_base64(body, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    # Only a padded last group can spell its bytes another way (low bits decoding drops).
    tail = len(raw) % 3
    if tail and binascii.b2a_base64(raw[-tail:], newline=False) != body[-4:].encode("ascii"):
        return None
    return raw
