"""What kombu declares, shared in Redis: the queue names (one set) and each exchange's bindings
(one set per exchange, members ``routing_key|pattern|queue``). A channel's ``RoutingTables``
caches an exchange's table for ``binding_cache_seconds``; its own binds and unbinds drop the
cached table at once, and a lookup that finds nothing reads it again (a binding made elsewhere).
"""

from __future__ import annotations

from time import monotonic

from .keys import BINDING_SEP, binding_key, queues_key
from .options import Options


class RoutingTables:
    """The declared queues and the exchanges' binding tables, read through a cache."""

    def __init__(self, client, options: Options):
        self.client = client
        self.options = options
        self._tables: dict[str, tuple[float, list]] = {}  # exchange -> (read at, rows)

    # -- queues ------------------------------------------------------------------------------
    def add_queue(self, queue: str) -> None:
        self.client.sadd(queues_key(self.options.key_prefix), queue)

    def has_queue(self, queue: str) -> bool:
        return bool(self.client.sismember(queues_key(self.options.key_prefix), queue))

    def remove_queue(self, queue: str) -> None:
        self.client.srem(queues_key(self.options.key_prefix), queue)

    # -- bindings ----------------------------------------------------------------------------
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
