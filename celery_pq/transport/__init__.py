"""The kombu transport (``celery_pq.transport:Transport``), its channel and its helpers (docs/architecture.md)."""

from .channel import Channel, TLSTransport, Transport

__all__ = ["Channel", "TLSTransport", "Transport"]
