"""Flower's broker page and ``/api/queues/length`` with celery-pq's real counts.

One line in Flower's configuration turns it on (docs/operations.md, "Flower")::

    import celery_pq.ops.flower          # in flowerconfig.py (or in the Celery app's module)

Flower picks its broker reader by the URL's scheme and has no hook for another one: for
``pq://``/``pqs://`` its broker page answers 404, and for ``redis://`` with
``broker_transport = "celery_pq.transport:Transport"`` it would count kombu-redis's lists, which
celery-pq does not use. Importing this module wraps Flower's one point that knows the Celery app,
``flower.views.BaseHandler.get_broker``: when the app's transport is celery-pq it returns a
``PQFlowerBroker``, which reads each queue's ``stats()`` the way ``pq stats`` does
(``celery_pq.transport.broker.queue_stats``), in a thread (Flower's loop never waits on Redis);
for any other broker Flower's own reader answers, unchanged.

Each queue's row carries RabbitMQ's names, which Flower's page shows (``flower_row``), then
``pq stats --json``'s figures as they are (delayed, dead, per_priority, per_tenant, paused, ...),
which ``/api/queues/length`` returns with the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from ..storage.errors import PQError
from ..transport import Transport
from ..transport.broker import Broker, queue_stats

try:
    from flower.utils.broker import BrokerBase
    from flower.views import BaseHandler
except ImportError as exc:
    raise ImportError(
        "celery_pq.ops.flower adapts Flower's broker page to celery-pq and needs Flower: "
        "pip install 'flower>=2.0' (it is imported by Flower's configuration, flowerconfig.py)"
    ) from exc

logger = logging.getLogger("celery_pq.ops.flower")

#: Seconds a page or API call waits for the queues' stats before it shows none (and logs why).
READ_TIMEOUT_SECONDS = 10.0

#: ``pq stats`` figures left out of a row: the name is ``name``, the rank index is internal.
_NOT_SHOWN = ("queue", "index_members")


def flower_row(stats: Mapping[str, Any], consumers: int | None = None) -> dict[str, Any]:
    """A queue's ``stats()`` as a row of Flower's broker table (RabbitMQ's names), then the
    stats' own figures: ready = waiting (stored, not delayed, not leased), unacknowledged =
    leased (delivered, not acked yet), messages = all stored (ready + delayed + leased; the dead
    letters are kept apart, in ``dead``). ``consumers``: the workers Flower's last inspect saw
    consuming the queue, None when it knows of no worker; ``idle_since``: None (celery-pq
    records no such time)."""
    waiting, delayed, leased = stats["waiting"], stats["delayed"], stats["leased"]
    row: dict[str, Any] = {
        "name": stats["queue"],
        "messages": waiting + delayed + leased,
        "messages_ready": waiting,
        "messages_unacknowledged": leased,
        "consumers": consumers,
        "idle_since": None,
    }
    row.update((k, v) for k, v in stats.items() if k not in _NOT_SHOWN and k not in row)
    return row


def consumers_of(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Queue name -> how many workers consume it, from Flower's inspector (``active_queues``)."""
    counts: dict[str, int] = {}
    for info in workers.values():
        for name in {q.get("name") for q in info.get("active_queues") or ()}:
            if name:
                counts[name] = counts.get(name, 0) + 1
    return counts


def is_celery_pq(capp) -> bool:
    """Whether the Celery app's broker transport is celery-pq (``pq://``, ``pqs://``, or any
    URL with ``broker_transport = "celery_pq.transport:Transport"``); connects to nothing."""
    with capp.connection_for_write() as conn:
        cls = conn.get_transport_cls()
    return isinstance(cls, type) and issubclass(cls, Transport)


class PQFlowerBroker(BrokerBase):
    """Flower's broker reader for a celery-pq app: ``await queues(names)``, one row per name."""

    def __init__(self, capp, workers: Callable[[], Mapping[str, Mapping[str, Any]]] = dict):
        with capp.connection_for_write() as conn:
            super().__init__(conn.as_uri())  # (no password)
            self.host, self.port = conn.hostname or "localhost", conn.port or 6379  # any scheme's
        self.broker = Broker.of(capp)
        self._workers = workers

    async def queues(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The rows of ``names``; none (Flower's "no queue data") when Redis cannot be read, with
        the reason logged."""
        names = list(names)
        try:
            stats = await asyncio.wait_for(asyncio.to_thread(queue_stats, self.broker, names), READ_TIMEOUT_SECONDS)
        except TimeoutError:  # (an OSError: caught before those)
            logger.error(
                "celery-pq: Flower got no queue stats from Redis at %s:%s within %s s",
                self.host,
                self.port,
                READ_TIMEOUT_SECONDS,
            )
            return []
        except (PQError, redis.RedisError, OSError) as exc:  # BrokerUnreachable names host:port only
            logger.error("celery-pq: Flower cannot read the queues' stats: %s", exc)
            return []
        except Exception:
            logger.exception("celery-pq: Flower cannot read the queues' stats")
            return []
        names = names or [s["queue"] for s in stats]  # (none asked: the declared queues)
        workers = self._workers()
        consumers = consumers_of(workers)
        return [
            flower_row({**s, "queue": name}, consumers.get(name, 0) if workers else None)
            for name, s in zip(names, stats)
        ]


def _get_broker(flower_get_broker: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def get_broker(self):
        """celery-pq's reader for a celery-pq app (celery_pq.ops.flower), else Flower's own."""
        if is_celery_pq(self.capp):
            return PQFlowerBroker(self.capp, workers=lambda: self.application.workers)
        return flower_get_broker(self)

    get_broker.celery_pq = True  # type: ignore[attr-defined]
    get_broker.__wrapped__ = flower_get_broker  # type: ignore[attr-defined]
    return get_broker


def install() -> None:
    """Wrap ``BaseHandler.get_broker`` (once: importing again changes nothing). Done on import."""
    if not getattr(BaseHandler.get_broker, "celery_pq", False):
        BaseHandler.get_broker = _get_broker(BaseHandler.get_broker)


install()
