"""Stored records made to exhaust a reader: what anyone who can write to Redis could put in a
queue. Made without ever holding what they expand to."""

from __future__ import annotations

import functools

import zstandard

from celery_pq.storage import codec

#: A zstd frame of this many zeros compresses to some 9.6 KB.
BOMB_BYTES = 300 * 1024 * 1024


@functools.cache
def zstd_bomb(size: int = BOMB_BYTES) -> bytes:
    """A record in the stored form whose zstd frame declares, and really holds, ``size`` zero
    bytes (compressed 1 MiB at a time)."""
    packer = zstandard.ZstdCompressor(level=3).compressobj(size=size)
    chunk = bytes(1 << 20)
    parts = [packer.compress(chunk[: min(len(chunk), size - done)]) for done in range(0, size, len(chunk))]
    parts.append(packer.flush())
    return bytes((codec.VERSION, codec.layout.F_ZSTD)) + b"".join(parts)


def lying_bomb(declared: int = 1000, size: int = BOMB_BYTES) -> bytes:
    """``zstd_bomb(size)`` whose frame header declares only ``declared`` bytes (its 4-byte size
    field rewritten)."""
    record = bytearray(zstd_bomb(size))
    frame = record[2:]
    assert zstandard.frame_content_size(bytes(frame)) == size and frame[4] == 0x80  # a 4-byte size at 6..9
    record[2 + 6 : 2 + 10] = declared.to_bytes(4, "little")
    return bytes(record)


def fields_bomb(fields: int) -> bytes:
    """An uncompressed record of ``fields`` unnamed message fields (4 bytes each)."""
    one = bytes((codec.layout.S_MESSAGE, 1)) + b"a" + bytes((codec.layout.T_NONE,))
    return bytes((codec.VERSION, 0)) + one * fields


def varint_bomb(size: int = 16 * 1024 * 1024 - 64) -> bytes:
    """A record in the stored form whose zstd frame (some 550 bytes, declaring ``size`` + 2, within
    MAX_INFLATED) holds one message field whose name's length is a varint of ``size`` 0xFF bytes:
    a reader that shifts in every byte of a varint spends hours on it."""
    records = bytes((codec.layout.S_MESSAGE,)) + b"\xff" * size + b"\x01"
    return bytes((codec.VERSION, codec.layout.F_ZSTD)) + zstandard.ZstdCompressor(level=3).compress(records)
