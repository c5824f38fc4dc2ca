"""The codec's bounds on what a record may cost: zstd compression (offered to records of
COMPRESS_MIN bytes and over, a frame inflated only up to MAX_INFLATED), the most values a record
may make (MAX_VALUES), the longest varint of a length, a count or a reference
(MAX_VARINT_BYTES) and of an integer (MAX_INT_BYTES), and the size of the codec's caches
(CACHE_MAX).

A stored record is untrusted input (anyone who can write to Redis can write one): the reader
refuses a record over these bounds, and the writer keeps to them so that every record it writes
reads back."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from .layout import CodecError

try:  # the dependency is declared; a reader without it can still read everything uncompressed
    import zstandard
except ImportError:  # pragma: no cover - zstandard is a dependency of celery-pq
    zstandard = None  # type: ignore[assignment]

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
#: The most bytes of the varint of a length, a count or a UUID reference: 35 bits, more than any
#: record holds (a Redis string is at most 512 MB). Without a bound, a varint of a million 0xFF
#: bytes (a few hundred bytes of zstd) takes the reader hours: each byte shifts a growing number.
MAX_VARINT_BYTES = 5
#: The most bytes of an integer's (zigzag) varint: 14,336 bits, more than the 4,300 decimal digits
#: Python reads or writes as text by default (kombu's JSON, and so the JSON layout, carries no
#: larger integer). The writer refuses a larger one; both read and write it in linear time.
MAX_INT_BYTES = 2048
#: The most entries one of the codec's caches holds before it starts again (``remember``).
CACHE_MAX = 4096


def compress(record: bytearray) -> bytes | None:
    """The zstd frame of ``record`` when compressing is worth it: a record of COMPRESS_MIN to
    MAX_INFLATED bytes whose frame is smaller; else None (stored as it is)."""
    if zstandard is not None and COMPRESS_MIN <= len(record) <= MAX_INFLATED:
        packed = _zstd().compressor.compress(record)
        if len(packed) < len(record):
            return packed
    return None


def inflate(frame) -> bytes:
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
        raise CodecError(
            f"stored message's zstd frame declares {size} bytes, over the {MAX_INFLATED} "
            "a record may inflate to; not inflated"
        )
    try:
        return _zstd().decompressor.decompress(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(f"stored message's zstd frame is corrupt: {exc}") from None


def json_items(text: bytes) -> int:
    """At least as many as the list and dict items of the JSON ``text`` (each item is the first
    of its list or dict, or follows a comma)."""
    return text.count(b",") + text.count(b"[") + text.count(b"{")


def remember(cache: dict, key, value):
    """Keep ``value`` under ``key`` in one of the codec's caches (it starts again once it holds
    CACHE_MAX entries); ``value``."""
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


_local = threading.local()


def _zstd():
    """This thread's zstd compressor and decompressor (made once: making one costs more than
    compressing a message; they are not to be shared between threads)."""
    z = getattr(_local, "zstd", None)
    if z is None:
        z = _local.zstd = SimpleNamespace(
            compressor=zstandard.ZstdCompressor(level=ZSTD_LEVEL), decompressor=zstandard.ZstdDecompressor()
        )
    return z
