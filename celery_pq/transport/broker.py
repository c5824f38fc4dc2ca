"""How the commands, the metrics exporter and the autoscaler reach the queues: a celery-pq
channel on a broker named by a Celery app or a URL, without kombu's retries. docs/architecture.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import redis
from kombu import Connection

from ..queue import open_queue
from ..storage.errors import BrokerUnreachable, ConfigError
from ..storage.keys import queue_keys, queues_key
from ..storage.redact import redact
from .channel import Channel
from .revokes import declared_queues, task_queues
from .task_rates import celery_own_queue
from .views import View

#: Errors that mean the broker's Redis is not there (refused, timed out, lost mid-command).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError)


class Broker:
    """A broker to open celery-pq channels on (``channel()``), one connection per use."""

    def __init__(self, connect: Callable[[], Any]):  # a kombu Connection
        self._connect = connect

    @classmethod
    def of(cls, app_or_url, transport_options: dict | None = None) -> Broker:
        """From a Celery app (its broker settings) or a broker URL (with ``transport_options``)."""
        if isinstance(app_or_url, Broker):
            return app_or_url
        if isinstance(app_or_url, str):
            url, options = app_or_url, dict(transport_options or {})
            return cls(lambda: Connection(url, transport_options=options))
        if hasattr(app_or_url, "connection_for_write"):
            return cls(app_or_url.connection_for_write)
        raise ConfigError(f"a broker is a Celery app or a broker URL, got {redact(app_or_url)}")

    @contextmanager
    def channel(self) -> Iterator:
        """A celery-pq channel, closed after use. BrokerUnreachable (named by host:port only: a URL
        may hold a password) when Redis does not answer, ConfigError when it is not celery-pq."""
        conn = self._connect()
        try:
            channel = conn.channel()  # not default_channel: that one retries for seconds
            if not isinstance(channel, Channel):
                raise ConfigError(
                    f"the broker is not celery-pq (transport {type(conn.transport).__name__}); "
                    "use a pq:// URL or broker_transport='celery_pq.transport:Transport'"
                )
            yield channel
        except UNREACHABLE as exc:
            reason = str(exc) or type(exc).__name__  # the password cut from it
            for secret in (conn.password, conn.userid and conn.password and f"{conn.userid}:{conn.password}"):
                if secret:
                    reason = reason.replace(secret, "***")
            raise BrokerUnreachable(f"{conn.hostname or '127.0.0.1'}:{conn.port or 6379}", reason) from None
        finally:
            with suppress(Exception):  # closing a connection that never opened
                conn.release()


def queue_names(channel, names=()) -> list[str]:
    """The names given, else the declared task queues (``revokes.task_queues``), or Celery's own
    when only those are declared."""
    if names:
        return list(names)
    known = declared_queues(channel)
    if any(not celery_own_queue(n) for n in known):
        return task_queues(known)
    return [n for n in known if not n.endswith(".dead")]


def queue_stats(broker: Broker, names=()) -> list[dict]:
    """Each queue's ``stats()`` (the ``names`` given, else the declared queues), read on one
    channel: what ``pq stats`` prints and Flower's broker page shows (celery_pq.ops.flower)."""
    with broker.channel() as channel:
        return [queue_and_view(channel, name)[0].stats() for name in queue_names(channel, names)]


def queue_and_view(channel, name: str):
    """(queue, the view's rank range or None) of ``name``, opened with the mode each shard recorded (a
    command works on a queue made by workers with other options), the channel's options for the rest."""
    view = View.parse(name)
    base = view.base if view else name
    q = open_queue(channel.client, base, channel.options.queue_settings(base), declare=False)
    return q, None if view is None else view.rank_range(q)


def known(channel, name: str) -> bool:
    """Is ``name`` (or the queue a view names) a declared queue or one with stored keys?"""
    view = View.parse(name)
    base = view.base if view else name
    if channel.client.sismember(queues_key(channel.options.key_prefix), base):
        return True
    k = queue_keys(base, channel.options.key_prefix)
    return bool(channel.client.exists(k.mode, k.entries, k.leases, k.delayed))
