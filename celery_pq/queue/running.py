"""Running a queue's script calls (``scripts.run_replicated``): error replies as the project's
exceptions, WAIT for the queues' replicas, and the waits out of a mode migration.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NoReturn
from urllib.parse import unquote

import redis

from .. import scripts as _scripts
from ..storage import constants as C
from ..storage.errors import ERROR_REPLY, QueueMigrating, error_for
from ..storage.records import mode_dict
from ..storage.retrying import again_while_refused

logger = logging.getLogger("celery_pq.queue")


def translate_error(exc: Exception) -> Exception:
    """A script's error reply with a code (``errors.ERROR_REPLY``: ModeMismatch,
    QueueMigrating) as the project's exception, else ``exc``."""
    if not isinstance(exc, redis.ResponseError):
        return exc
    parts = str(exc).split(" ")
    if len(parts) < 4 or parts[0] != ERROR_REPLY:
        return exc
    _, code, key, stored, *wanted = parts  # key: <prefix>:{<tag>}:[dead:]<suffix>
    queue = unquote(key[key.index("{") + 1 : key.index("}:")])
    if key[key.index("}:") + 2 :].startswith("dead:"):
        queue += ".dead"
    mode, theirs = readable_mode(stored), readable_mode(wanted[0]) if wanted else None
    return error_for(int(code), queue, stored=mode, wanted=theirs) or exc


def readable_mode(mode: str) -> dict:
    """A mode record as settings; a plain queue's has no fair_scope nor fair_cost."""
    d = mode_dict(mode)
    if not d["fair"]:
        d.pop("fair_scope")
        d.pop("fair_cost")
    return d


def wait_out_migration(call):
    """``call()``, again while it raises QueueMigrating (nothing done), for up to
    ``C.MIGRATION_WAIT`` seconds. Only for one script call of one queue: of several, those of
    other queues would have run."""

    def give_up(exc: Exception, waited: float) -> NoReturn:
        raise exc

    return again_while_refused(
        lambda n: call(),
        lambda exc: isinstance(exc, QueueMigrating),
        bound=lambda: C.MIGRATION_WAIT,
        first=0.005,
        most=0.2,
        give_up=give_up,
    )


def run_waiting(client: redis.Redis, calls: list[tuple], queues: Sequence = ()) -> tuple[list, int | None]:
    """``scripts.run_replicated`` with the most ``wait_replicas`` and longest ``wait_timeout`` of
    ``queues`` (queues or their ``Scripts``), script error replies as the project's exceptions:
    (replies, replicas that acknowledged them; None without WAIT)."""
    wanted = timeout = 0
    for q in queues:
        wanted, timeout = max(wanted, q.settings.wait_replicas), max(timeout, q.settings.wait_timeout)
    try:
        replies, acked = _scripts.run_replicated(client, calls, wanted, int(timeout * 1000))
    except redis.ResponseError as exc:
        raise translate_error(exc) from None
    return replies, acked if wanted else None


def run_calls(client: redis.Redis, calls: list[tuple]) -> list:
    """``run_waiting`` without WAIT: the replies."""
    return run_waiting(client, calls)[0]


def run_acks(client: redis.Redis, calls: list[tuple], queues: Sequence) -> list:
    """``run_waiting`` of calls that carry acks: acks that fewer replicas acknowledged are logged
    (a failover now may deliver those tasks again: at least once still holds)."""
    replies, acked = run_waiting(client, calls, queues)
    wanted = max(q.settings.wait_replicas for q in queues)
    if acked is not None and acked < wanted:
        logger.warning(
            "celery-pq: acks in %s: only %d of %d replicas acknowledged them within %gs; a failover "
            "now may deliver those tasks again",
            ", ".join(repr(q.name) for q in queues),
            acked,
            wanted,
            max(q.settings.wait_timeout for q in queues),
        )
    return replies
