"""The stored form of a kombu message: ``decode(encode(m)) == m`` for every kombu message dict;
compact (UUIDs as bytes, defaults left out, zstd) and bounded against untrusted records.
docs/storage.md: ``layout`` the bytes, ``writer``, ``reader``, ``reprs`` (argsrepr) and ``bounds``."""

from . import bounds, layout, reprs, writer
from .layout import CELERY_EMBED_TAIL, VERSION, Base64Body, CodecError
from .reader import decode
from .writer import encode

__all__ = [
    "CELERY_EMBED_TAIL",
    "VERSION",
    "Base64Body",
    "CodecError",
    "bounds",
    "decode",
    "encode",
    "layout",
    "reprs",
    "writer",
]
