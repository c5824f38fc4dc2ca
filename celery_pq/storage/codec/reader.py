"""The codec's reader: ``decode(bytes) -> message`` within the bounds of ``bounds``
(docs/storage.md, "Untrusted stored bytes")."""

from __future__ import annotations

import binascii
import re
import struct

from kombu.utils.json import loads as kombu_loads

from . import layout as L
from .bounds import MAX_INT_BYTES, MAX_VALUES, MAX_VARINT_BYTES, inflate
from .layout import C_ABSENT, C_BODY, T_REF, T_STR, Base64Body, CodecError
from .reprs import derived_reprs

#: celery -> the four sections' defaults, copied per message; the lists and dicts among them
#: (_MUTABLE: (section, name, default), holding none themselves) copied again
_TEMPLATES = {c: tuple(dict(L.DEFAULTS[s, c]) for s in range(4)) for c in (False, True)}
_MUTABLE = {
    c: [(s, n, v) for s in range(4) for n, v in L.DEFAULTS[s, c].items() if type(v) in (list, dict)]
    for c in (False, True)
}
assert not any(
    type(x) in (list, dict) for c in _MUTABLE for _, _, v in _MUTABLE[c] for x in (v.values() if type(v) is dict else v)
)


def decode(data: bytes | str, raw_body: bool = False) -> dict:
    """The kombu message dict of a stored record; CodecError (a ValueError) naming the problem.
    ``raw_body``: a base64 body is given as its bytes, a ``Base64Body``, not the text."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) < 2:
        raise CodecError(f"stored message of {len(data)} byte(s) is too short")
    if data[0] != L.VERSION:
        raise CodecError(f"stored message has format version {data[0]}; this celery-pq reads version {L.VERSION}")
    flags = data[1]
    if flags & ~L.KNOWN_FLAGS:
        raise CodecError(f"stored message has unknown flags {flags:#04x}")
    start = 2
    if flags & L.F_ZSTD:
        data, start = inflate(memoryview(data)[2:]), 0
    elif not isinstance(data, bytes):
        data = bytes(data)
    try:
        return read_message(data, start, flags, raw_body)
    except (IndexError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise CodecError(f"stored message is truncated or corrupt ({exc!r})") from None
    except RecursionError:
        raise CodecError("stored message's lists and dicts are nested too deep") from None


class _Seen(list):
    """The UUIDs read so far (a reference is an index), and the list and dict items the record
    may still make (``left``)."""

    __slots__ = ("left",)

    def __init__(self):
        super().__init__()
        self.left = MAX_VALUES

    def take(self, items: int) -> None:
        self.left -= items
        if self.left < 0:
            raise CodecError(f"stored message holds more than {MAX_VALUES} list and dict items")


def read_message(data: bytes, pos: int, flags: int, raw_body: bool = False) -> dict:
    """The message of the records in ``data`` from ``pos`` to its end."""
    celery = bool(flags & L.F_CELERY)
    message, headers, props, info = sections = [d.copy() for d in _TEMPLATES[celery]]
    for s, name, v in _MUTABLE[celery]:
        sections[s][name] = v.copy()
    props["delivery_info"] = info
    message["headers"] = headers
    message["properties"] = props
    uuids = _Seen()
    raw = None  # the body's bytes, when base64
    n = len(data)
    field = L.FIELD
    fields = 0
    while pos < n:
        fields += 1
        if fields > MAX_VALUES:
            raise CodecError(f"stored message has more than {MAX_VALUES} fields")
        code = data[pos]
        pos += 1
        if code > C_ABSENT:
            if code == C_BODY:
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
            blob, pos = _read_blob(data, pos)
            name = blob.decode("utf-8", "surrogatepass")
            target = sections[code]
        tag = data[pos]  # the common values inline, others in _read_value
        if tag == T_STR and data[pos + 1] < 0x80:
            end = pos + 2 + data[pos + 1]
            if end > n:
                raise IndexError("a string runs past the end")
            target[name] = data[pos + 2 : end].decode("utf-8", "surrogatepass")
            pos = end
        elif tag == T_REF and data[pos + 1] < 0x80:
            target[name] = uuids[data[pos + 1]]
            pos += 2
        else:
            target[name], pos = _read_value(data, pos, uuids)
    wanted = flags & (L.F_ARGSREPR | L.F_KWARGSREPR)
    if wanted:
        derived = derived_reprs(raw, wanted) if raw is not None else None
        if derived is None or len(derived) != bin(wanted).count("1"):
            raise CodecError("stored message's argsrepr is derived from a body that is not Celery's")
        headers.update(derived)
    return message


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(the length, count or reference at ``pos``, the position after): at most MAX_VARINT_BYTES."""
    start = pos
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift == 7 * MAX_VARINT_BYTES:
            raise CodecError(f"stored message's varint at byte {start} runs over {MAX_VARINT_BYTES} bytes")


#: An integer's varint: up to MAX_INT_BYTES - 1 bytes with the high bit set, then one without.
_INT_VARINT = re.compile(rb"[\x80-\xff]{0,%d}[\x00-\x7f]" % (MAX_INT_BYTES - 1))
#: A varint byte -> its seven low bits as binary text: a long integer is read as one text.
_SEPTETS = tuple(format(b & 0x7F, "07b") for b in range(256))


def _read_int(data: bytes, pos: int) -> tuple[int, int]:
    """(the integer at ``pos``, the position after): a zigzag varint of at most MAX_INT_BYTES, in
    linear time (over 9 bytes its bits are joined as text for ``int``, not shifted in)."""
    start = pos
    z = shift = 0
    while shift < 63:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1 if not z & 1 else -((z + 1) >> 1)), pos
        shift += 7
    match = _INT_VARINT.match(data, start)
    if match is None:
        if len(data) - start < MAX_INT_BYTES:
            raise IndexError("an integer runs past the end")
        raise CodecError(f"stored message's integer at byte {start} runs over {MAX_INT_BYTES} bytes")
    pos = match.end()
    z = int("".join(map(_SEPTETS.__getitem__, reversed(data[start:pos]))), 2)
    return (z >> 1 if not z & 1 else -((z + 1) >> 1)), pos


def _read_blob(data: bytes, pos: int) -> tuple[bytes, int]:
    length, pos = _read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise IndexError("a length runs past the end")
    return bytes(data[pos:end]), end


def _read_body(data: bytes, pos: int, uuids: _Seen, raw_body: bool = False) -> tuple[object, bytes | None, int]:
    """(body, its bytes if it was base64 else None, position after); ``raw_body``: see ``decode``."""
    form = data[pos]
    pos += 1
    if form in (L.B_BASE64, L.B_BASE64_EMBED):
        raw, pos = _read_blob(data, pos)
        if form == L.B_BASE64_EMBED:
            raw += L.CELERY_EMBED_TAIL
        if raw_body:
            return Base64Body(raw), raw, pos
        return binascii.b2a_base64(raw, newline=False).decode("ascii"), raw, pos
    if form == L.B_BYTES:
        blob, pos = _read_blob(data, pos)
        return blob, None, pos
    if form == L.B_TEXT:
        blob, pos = _read_blob(data, pos)
        return blob.decode("utf-8", "surrogatepass"), None, pos
    if form == L.B_VALUE:
        value, pos = _read_value(data, pos, uuids)
        return value, None, pos
    raise CodecError(f"stored message has unknown body form {form}")


#: The values of the tags T_NONE, T_TRUE and T_FALSE (0, 1, 2).
_CONSTANTS = (None, True, False)


def _read_value(data: bytes, pos: int, uuids: _Seen) -> tuple[object, int]:
    """(the value at ``pos``, the position after it)."""
    tag = data[pos]
    pos += 1
    if tag == L.T_STR:
        blob, pos = _read_blob(data, pos)
        return blob.decode("utf-8", "surrogatepass"), pos
    if tag <= L.T_FALSE:
        return _CONSTANTS[tag], pos
    if tag == L.T_UUID:
        end = pos + 16
        if end > len(data):
            raise IndexError("a UUID runs past the end")
        h = data[pos:end].hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        uuids.append(text)
        return text, end
    if tag == L.T_REF:
        ref, pos = _read_varint(data, pos)
        return uuids[ref], pos
    if tag == L.T_INT:
        return _read_int(data, pos)
    if tag == L.T_FLOAT:
        return L.DOUBLE.unpack(data[pos : pos + 8])[0], pos + 8
    if tag == L.T_BYTES:
        return _read_blob(data, pos)
    if tag == L.T_LIST:
        count, pos = _read_varint(data, pos)
        uuids.take(count)
        items = []
        for _ in range(count):
            item, pos = _read_value(data, pos, uuids)
            items.append(item)
        return items, pos
    if tag == L.T_DICT:
        count, pos = _read_varint(data, pos)
        uuids.take(count)
        d = {}
        for _ in range(count):
            key, pos = _read_blob(data, pos)
            d[key.decode("utf-8", "surrogatepass")], pos = _read_value(data, pos, uuids)
        return d, pos
    if tag == L.T_JSON:
        blob, pos = _read_blob(data, pos)
        uuids.take(blob.count(b",") + blob.count(b"[") + blob.count(b"{"))  # its list and dict items, at most
        return kombu_loads(blob.decode("utf-8", "surrogatepass")), pos
    raise CodecError(f"stored message has unknown value tag {tag}")
