"""The ``pq`` commands (``celery -A proj pq ...``, ``python -m celery_pq --broker URL ...``): click
wrappers over the queue's own methods. ``base`` holds the group; the commands live in ``looking``
(read only), ``changing``, ``serving`` and ``importing``. docs/operations.md."""

from __future__ import annotations

from . import changing, importing, looking, serving  # noqa: F401  (each registers its commands on pq)
from .base import pq

__all__ = ["pq"]
