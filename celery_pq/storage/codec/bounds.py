"""The codec's bounds on what an untrusted record may cost (the reader refuses a record over
them; the writer keeps to them, so all it writes reads back), zstd compression and the caches'
size. docs/storage.md ("Untrusted stored bytes", "Compression") gives the reasons and figures."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import zstandard

from .layout import CodecError

#: A record of at least this many bytes is offered to zstd, kept compressed only if smaller.
COMPRESS_MIN = 512
#: zstd's own default level (a reader does not depend on it).
ZSTD_LEVEL = 3
#: The most bytes a reader inflates one zstd frame to (its declared size); a larger record is
#: stored uncompressed.
MAX_INFLATED = 16 * 1024 * 1024
#: The most fields a record may make, and apart from them the most list and dict items (Celery's
#: messages have some thirty fields and a handful of items).
MAX_VALUES = 65_536
#: The most bytes of the varint of a length, a count or a UUID reference: 35 bits, more than a
#: Redis string holds.
MAX_VARINT_BYTES = 5
#: The most bytes of an integer's (zigzag) varint: 14,336 bits, more than the 4,300 decimal digits
#: of Python's default int-to-text limit, so more than kombu's JSON carries.
MAX_INT_BYTES = 2048
#: The most entries one of the codec's caches holds before it starts again (``remember``).
CACHE_MAX = 4096


def compress(record: bytearray) -> bytes | None:
    """The zstd frame of a record of COMPRESS_MIN to MAX_INFLATED bytes when it is smaller; else
    None (stored as it is)."""
    if COMPRESS_MIN <= len(record) <= MAX_INFLATED:
        packed = _zstd().compressor.compress(record)
        if len(packed) < len(record):
            return packed
    return None


def inflate(frame) -> bytes:
    """The bytes of a zstd frame that declares its size, at most MAX_INFLATED (checked before
    allocating; one holding more than it declares fails there). CodecError otherwise."""
    try:
        size = zstandard.frame_content_size(frame)
        if size < 0:
            raise CodecError("stored message's zstd frame does not declare its size; not inflated")
        if size > MAX_INFLATED:
            raise CodecError(
                f"stored message's zstd frame declares {size} bytes, over the {MAX_INFLATED} "
                "a record may inflate to; not inflated"
            )
        return _zstd().decompressor.decompress(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(f"stored message's zstd frame is corrupt: {exc}") from None


def remember(cache: dict, key, value):
    """``cache[key] = value`` (the cache cleared once it holds CACHE_MAX entries); ``value``."""
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


_local = threading.local()


def _zstd():
    """This thread's zstd compressor and decompressor (not thread-safe; made once per thread, as
    making one costs more than compressing a message)."""
    z = getattr(_local, "zstd", None)
    if z is None:
        z = _local.zstd = SimpleNamespace(
            compressor=zstandard.ZstdCompressor(level=ZSTD_LEVEL), decompressor=zstandard.ZstdDecompressor()
        )
    return z
