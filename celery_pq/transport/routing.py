"""What kombu declares, shared in Redis (queue names, message TTLs, bindings), read through a
per-channel cache of ``binding_cache_seconds``. docs/key-layout.md ("Not per queue")."""

from __future__ import annotations

from time import monotonic

from ..storage.keys import BINDING_SEP, binding_key, message_ttls_key, queues_key
from .options import Options


class RoutingTables:
    """The declared queues and the exchanges' binding tables, read through a cache."""

    def __init__(self, client, options: Options):
        self.client = client
        self.options = options
        self._tables: dict[str, tuple[float, list]] = {}  # exchange -> (read at, rows)
        self._ttls: dict[str, tuple[float, int | None]] = {}  # queue -> (read at, ms or None)

    def add_queue(self, queue: str, message_ttl_ms: int | None = None) -> None:
        """Record a declared queue and its message TTL for every publisher (kept if declared again without)."""
        self.client.sadd(queues_key(self.options.key_prefix), queue)
        if message_ttl_ms is not None:
            self.client.hset(message_ttls_key(self.options.key_prefix), queue, message_ttl_ms)
            self._ttls[queue] = (monotonic(), message_ttl_ms)

    def message_ttl(self, queue: str) -> int | None:
        """The message TTL (ms) queue ``queue`` was declared with, or None."""
        hit = self._ttls.get(queue)
        now = monotonic()
        if hit and now - hit[0] < self.options.binding_cache_seconds:
            return hit[1]
        raw = self.client.hget(message_ttls_key(self.options.key_prefix), queue)
        ttl = int(raw) if raw is not None else None
        self._ttls[queue] = (now, ttl)
        return ttl

    def has_queue(self, queue: str) -> bool:
        return bool(self.client.sismember(queues_key(self.options.key_prefix), queue))

    def remove_queue(self, queue: str) -> None:
        self.client.srem(queues_key(self.options.key_prefix), queue)
        self.client.hdel(message_ttls_key(self.options.key_prefix), queue)
        self._ttls.pop(queue, None)

    def bind(self, exchange, routing_key, pattern, queue) -> None:
        self.client.sadd(self._key(exchange), self._member(routing_key, pattern, queue))
        self._tables.pop(exchange, None)

    def unbind(self, exchange, routing_key, pattern, queue) -> None:
        self.client.srem(self._key(exchange), self._member(routing_key, pattern, queue))
        self._tables.pop(exchange, None)

    def table(self, exchange) -> list:
        """kombu's table of an exchange: [(routing_key, pattern, queue), ...]."""
        hit = self._tables.get(exchange)
        now = monotonic()
        if hit and now - hit[0] < self.options.binding_cache_seconds:
            return hit[1]
        members = self.client.smembers(self._key(exchange))
        rows = [tuple(m.decode().split(BINDING_SEP)) for m in members]
        self._tables[exchange] = (now, rows)
        return rows

    def forget(self, exchange) -> bool:
        """Drop the cached table of an exchange; True when there was one."""
        return self._tables.pop(exchange, None) is not None

    def _key(self, exchange) -> str:
        return binding_key(exchange, self.options.key_prefix)

    @staticmethod
    def _member(routing_key, pattern, queue) -> str:
        return BINDING_SEP.join([routing_key or "", pattern or "", queue or ""])
