"""``celery -A proj pq ...`` and ``python -m celery_pq --broker URL ...``: administration of
celery-pq queues. Each command is a thin click wrapper: the queue does the work
(``queue/``), ``broker.py`` opens the broker, ``render.py`` shows rows, ``messages.py``
describes a stored message, ``metrics.py`` serves Prometheus. Errors are one line and exit 1
(``click.ClickException``).

``base`` holds the group and what the commands share; the commands live by what they do:
``looking`` (read only), ``changing`` (admin), ``serving`` (exporter, dashboard, event log), ``importing`` (import-kombu).
"""

from __future__ import annotations

from . import changing, importing, looking, serving  # noqa: F401  (each registers its commands on pq)
from .base import broker_of, command, pq

__all__ = ["broker_of", "command", "pq"]
