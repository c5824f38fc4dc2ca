"""The lease keeper under gevent or eventlet: their monkey-patching makes its thread a greenlet,
which cannot run while a task holds the hub (a CPU-bound task that never yields). ``NativeWatch``
renews the leases from a real OS thread whenever the keeper is late. docs/leases.md ("Green
pools: gevent and eventlet")."""

from __future__ import annotations

import sys
from time import monotonic
from typing import Any

import redis

from ..queue import PriorityQueue
from ..storage import connections

#: Seconds between two looks of the watch before the keeper said how often it renews.
FIRST_POLL = 0.25


def green_runtime() -> str | None:
    """``"gevent"`` or ``"eventlet"`` when that library monkey-patched ``threading`` in this
    process, else None. Imports neither: patching imports its module first, so one not loaded
    has patched nothing."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


def _native(runtime: str):
    """(start_new_thread, allocate_lock) of the unpatched ``_thread``: a real OS thread and lock."""
    if runtime == "gevent":
        from gevent.monkey import get_original

        return get_original("_thread", ["start_new_thread", "allocate_lock"])
    from eventlet.patcher import original

    thread = original("_thread")
    return thread.start_new_thread, thread.allocate_lock


class NativeWatch:
    """A real OS thread beside a green lease keeper. While the keeper renews on time it only
    looks, every quarter of the renewal interval; once the keeper's renewal is a quarter interval
    overdue (the hub is held), it renews every held lease over a Redis connection of its own,
    made in its thread (a gevent or eventlet hub of that thread's own serves its socket), every
    ``renew_interval`` until the keeper is back. It reports and settles nothing: a refused
    renewal is the keeper's to report when it runs again. A SIGKILL ends it with its process, so
    a dead worker's leases run out as before."""

    def __init__(self, keeper, runtime: str):
        self.keeper = keeper
        self.runtime = runtime
        start, allocate_lock = _native(runtime)
        self._stopped = allocate_lock()
        self._stopped.acquire()  # released by stop()
        self._client: Any = None  # redis.Redis, or redis.RedisCluster on a cluster
        self._queues: dict[str, PriorityQueue] = {}  # name -> the same queue on our client
        #: Renewal passes made (the keeper late), passes that failed, leases renewed.
        self.passes = self.failures = self.renewed = 0
        start(self._run, ())

    def stop(self) -> None:
        if self._stopped.locked():
            self._stopped.release()

    def _run(self) -> None:
        next_pass = 0.0
        try:
            while not self._stopped.acquire(True, self._poll()):
                books, due, every = self.keeper.seen
                now = monotonic()
                if not books or now < due + every / 4 or now < next_pass:
                    continue
                try:
                    self._renew(books)
                    next_pass = now + every
                except Exception:
                    self.failures += 1  # (tried again at the next look)
        finally:
            if self._client is not None:
                connections.close_pool(
                    self._client if isinstance(self._client, redis.RedisCluster) else self._client.connection_pool
                )

    def _poll(self) -> float:
        every = self.keeper.seen[2]
        return FIRST_POLL if every is None else max(0.02, min(every / 4, 5.0))

    def _renew(self, books) -> None:
        self.passes += 1
        for book in books:
            # gevent's locks may be waited on from another OS thread; eventlet's may not, and
            # its tables are copied each in one step instead (the hub thread is held meanwhile)
            held = book.held() if self.runtime == "gevent" else book.held(locked=False)
            for q, pairs in held.items():
                mine = self._queue(q, book.options)
                self.renewed += sum(mine.extend(pairs, book.options.lease_seconds))

    def _queue(self, q: PriorityQueue, options) -> PriorityQueue:
        mine = self._queues.get(q.name)
        if mine is None:
            if self._client is None:
                self._client = self._connect(options)
            mine = self._queues[q.name] = PriorityQueue(self._client, q.name, q.settings)
        return mine

    def _connect(self, options) -> redis.Redis | redis.RedisCluster:
        """A client of a pool of our own, made like the transport's (same server, sentinels,
        TLS, timeouts); its connections are made in this thread, on its own hub."""
        transport = self.keeper.transport
        if options.cluster:
            cluster = connections.make_cluster(transport.client, options, transport.tls)
            connections.set_cluster_retry(cluster, options.cluster_retry_seconds)
            return cluster
        return redis.Redis(connection_pool=connections.make_pool(transport.client, options, transport.tls))
