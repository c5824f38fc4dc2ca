"""Celery's revoke reaching the broker: a revoke broadcast to every worker (on a pidbox fanout
exchange, ``app.control.revoke``) removes the waiting and delayed messages of its task ids from
every declared queue before it is broadcast, and marks them REVOKED in the revoking app's result
backend. Leased (running or prefetched) messages are left to the workers. The broadcast itself is
always sent, unchanged. docs/operations.md ("Revoking tasks")."""

from __future__ import annotations

import logging
from typing import Any

from kombu.compression import decompress
from kombu.serialization import loads

from ..queue.values import as_text
from ..storage.errors import ModeMismatch
from ..storage.keys import queues_key
from .task_rates import celery_own_queue

logger = logging.getLogger(__name__)

#: The name of a kombu ``Mailbox``'s fanout exchange ends so (``celery.pidbox`` by default).
PIDBOX_SUFFIX = ".pidbox"


class NotDecodable(ValueError):
    """A pidbox broadcast whose body cannot be read (the reason named)."""


def revoked_ids(message: dict, decode_body) -> list[str] | None:
    """The task ids of a revoke broadcast to every worker (kombu's pidbox message: ``method``
    "revoke", ``arguments["task_id"]`` one id or a list, no ``destination``, ``pattern`` or
    ``matcher``); None for any other broadcast. NotDecodable when it cannot be read."""
    props = message.get("properties") or {}
    headers = message.get("headers") or {}
    compression = headers.get("compression")
    try:
        raw = decode_body(message["body"], props.get("body_encoding"))
        if compression:
            raw = decompress(raw, compression)
        elif b"revoke" not in (raw.encode() if isinstance(raw, str) else bytes(raw)):
            return None  # (a ping, an inspect: not decoded at all)
        # The body is this process's own publish: any serializer kombu knows is read.
        payload = loads(raw, message.get("content-type"), message.get("content-encoding"), force=True)
    except Exception as exc:
        raise NotDecodable(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("method") != "revoke":
        return None
    if any(payload.get(k) for k in ("destination", "pattern", "matcher")):
        return None  # addressed to some workers: theirs alone, as Celery's (the others would run it)
    arguments = payload.get("arguments")
    ids = arguments.get("task_id") if isinstance(arguments, dict) else None
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, str) and i for i in ids):
        raise NotDecodable(f"a revoke whose task_id is not an id or a list of ids: {ids!r}")
    return list(dict.fromkeys(ids))


def declared_queues(channel) -> list[str]:
    """The names of the queues declared under the channel's key prefix, sorted."""
    return sorted(map(as_text, channel.client.smembers(queues_key(channel.options.key_prefix))))


def task_queues(declared) -> list[str]:
    """The ``declared`` queues that hold tasks: not Celery's own (pidbox, replies, events), not the
    dead-letter queues (a dead letter runs only when an operator replays it)."""
    return [n for n in declared if not celery_own_queue(n) and not n.endswith(".dead")]


def remove_revoked(channel, ids: list[str]) -> dict[str, int]:
    """Remove the waiting and delayed messages of ``ids`` from every task queue (each shard, a
    fair queue's tenants alike; leased ones stay); {id: how many} of the ids found."""
    removed: dict[str, int] = {}
    for name in task_queues(declared_queues(channel)):
        for task_id in ids:
            try:
                n = channel.queue(name).remove(task_id)
            except ModeMismatch:  # migrated since this channel opened it
                n = channel.reopen(name).remove(task_id)
            if n:
                removed[task_id] = removed.get(task_id, 0) + n
                logger.info("revoke of task %s: %d waiting message(s) removed from queue %r", task_id, n, name)
    return removed


def mark_revoked(connection, ids: list[str]) -> None:
    """Mark ``ids`` REVOKED in the result backend of Celery's current app, as a worker does when
    it meets a revoked message, when that app's broker is this ``connection`` (a kombu
    Connection) and it keeps results by task id (not ``rpc://``); otherwise nothing (the state
    stays PENDING)."""
    from celery import current_app  # (public API; imported here: kombu alone never gets here)
    from celery.backends.rpc import RPCBackend

    app: Any = current_app._get_current_object()
    conf = app.conf
    if conf.task_ignore_result and not conf.task_store_errors_even_if_ignored:
        return
    if not _same_broker(app, connection):
        logger.debug("revoke: Celery's current app %r uses another broker; results not marked", app.main)
        return
    backend = app.backend
    if isinstance(backend, RPCBackend):  # replies to the publisher's reply queue, which only the task's message names
        return
    for task_id in ids:
        backend.mark_as_revoked(task_id, reason="revoked")


def _same_broker(app, connection) -> bool:
    """Does ``app`` publish to ``connection``'s broker: its URL (no password) and key prefix?"""
    theirs = app.connection_for_write()
    try:
        prefixes = [(c.transport_options or {}).get("key_prefix") for c in (theirs, connection)]
        return theirs.as_uri() == connection.as_uri() and prefixes[0] == prefixes[1]
    finally:
        theirs.release()


def on_broadcast(channel, exchange: str, message: dict) -> None:
    """What a broadcast on ``exchange`` (a pidbox one) revokes, removed and marked; never raises:
    a problem is logged as a warning and the broadcast goes on."""
    try:
        ids = revoked_ids(message, channel.decode_body)
    except NotDecodable as exc:
        logger.warning("broadcast on exchange %r: not read as a revoke (%s); it is broadcast as it is", exchange, exc)
        return
    if not ids:
        return
    try:
        removed = remove_revoked(channel, ids)
    except Exception as exc:
        logger.warning(
            "revoke of %s: its waiting messages were not removed from the queues (%s: %s); the revoke "
            "is broadcast to the workers as it is",
            ", ".join(ids),
            type(exc).__name__,
            exc,
        )
        return
    if not removed:
        return
    try:
        mark_revoked(channel.transport.client, list(removed))
    except Exception as exc:
        logger.warning(
            "revoke of %s: removed from the broker, but not marked REVOKED in the result backend (%s: %s)",
            ", ".join(removed),
            type(exc).__name__,
            exc,
        )
