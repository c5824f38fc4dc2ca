"""Entry ids as stored (``decode_id(encode_id(x)) == x``): a lowercase UUID as ``\\x01`` + its 16
bytes [+ ``~<seq>``], any other as its text (``\\x02`` in front if it starts with ``\\x01`` or
``\\x02``); ``unique_bytes`` for publish ids and lease tokens. docs/key-layout.md ("Per queue")."""

from __future__ import annotations

import itertools
import os
import re

_UUID = re.compile(r"([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})(~[0-9]+)?\Z")
_PACKED, _ESCAPED = 1, 2


#: Stored forms of ids decoded lately (a delivered id comes back in its ack); cleared when full.
_RECENT: dict[str, bytes] = {}
RECENT_MAX = 4096


def encode_id(id: str) -> bytes:
    raw = _RECENT.get(id)
    if raw is not None:
        return raw
    m = _UUID.match(id)
    if m:
        return b"\x01" + bytes.fromhex("".join(m.group(1, 2, 3, 4, 5))) + (m.group(6) or "").encode()
    raw = id.encode()
    if raw[:1] in (b"\x01", b"\x02"):
        return b"\x02" + raw
    return raw


def decode_id(raw: bytes | str) -> str:
    if isinstance(raw, str):
        raw = raw.encode()
    if raw[:1] == b"\x01" and len(raw) >= 17:
        h = raw[1:17].hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        if len(raw) > 17:
            return text + raw[17:].decode()
        if len(_RECENT) >= RECENT_MAX:
            _RECENT.clear()
        _RECENT[text] = raw  # (only the plain form: encode_id gives it back for this text)
        return text
    if raw[:1] == b"\x02":
        return raw[1:].decode()
    return raw.decode()


# -- ids made here: unique, not secret (a child after fork takes a prefix of its own) ---------
_COUNTER_SPAN = 1 << 32
_made: list = []


def _reseed() -> None:
    _made[:] = [os.urandom(8), itertools.count()]


_reseed()
os.register_at_fork(after_in_child=_reseed)


def unique_bytes() -> bytes:
    """12 bytes no other call makes: 8 random per process (renewed when the counter wraps), a 4-byte counter."""
    prefix, counter = _made
    n = next(counter)
    if n >= _COUNTER_SPAN:
        _reseed()
        prefix, counter = _made
        n = next(counter)
    return prefix + n.to_bytes(4, "big")
