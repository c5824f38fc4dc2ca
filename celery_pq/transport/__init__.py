"""The kombu transport (``celery_pq.transport:Transport``) and its channel (channel.py), with
the channel's helpers: publishing, batches, delivery, the lease book and keeper, the poller,
options, routing and views (docs/architecture.md)."""

from .channel import Channel, TLSTransport, Transport

__all__ = ["Channel", "TLSTransport", "Transport"]
