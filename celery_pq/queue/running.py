"""Running a queue's script calls: one or several in one round trip, script error replies turned
into the project's exceptions, WAIT for replicas after acks, and the waits out of a mode
migration. Also the calls that cross queues: one pop with the acks of several queues
(``pop_with_acks``), the acks of several queues (``ack_all``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

import redis

from .. import constants as C
from .. import scripts as _scripts
from ..errors import ErrorCode, QueueMigrating, error_for
from ..records import mode_dict
from ..retrying import again_while_refused
from .values import Popped

if TYPE_CHECKING:
    from .base import QueueBase
    from .core import PriorityQueue

logger = logging.getLogger("celery_pq.queue")

#: The error reply of a script whose caller's mode is not the queue's (see common.lua).
_MODE_MISMATCH = re.compile(r"MODE_MISMATCH (?P<key>\S+) (?P<stored>\S+) (?P<wanted>\S+)")
#: The error reply of a script called while the queue's mode is being migrated (migrate.lua).
_MIGRATING = re.compile(r"MIGRATING (?P<key>\S+) (?P<mode>\S+)")


def _queue_of_key(key: str) -> str:
    """The queue name in a key ``<prefix>:{<tag>}:[dead:]<suffix>``."""
    from urllib.parse import unquote

    tag = key[key.index("{") + 1 : key.index("}:")]
    dead = key[key.index("}:") + 2 :].startswith("dead:")
    return unquote(tag) + (".dead" if dead else "")


def translate_error(exc: Exception) -> Exception:
    """A script's error reply as the project's exception (ModeMismatch, QueueMigrating), else
    ``exc``."""
    if not isinstance(exc, redis.ResponseError):
        return exc
    m = _MIGRATING.search(str(exc))
    if m is not None:
        return QueueMigrating(_queue_of_key(m.group("key")), readable_mode(m.group("mode")))
    m = _MODE_MISMATCH.search(str(exc))
    if m is None:
        return exc
    return (
        error_for(
            ErrorCode.MODE_MISMATCH,
            _queue_of_key(m.group("key")),
            stored=readable_mode(m.group("stored")),
            wanted=readable_mode(m.group("wanted")),
        )
        or exc
    )


def readable_mode(mode: str) -> dict:
    """A mode record as settings; a plain queue's has no fair_scope."""
    d = mode_dict(mode)
    if not d["fair"]:
        d.pop("fair_scope")
    return d


def wait_out_migration(call):
    """``call()``, again while it raises QueueMigrating (the queue's mode is being migrated and
    the script did nothing), for up to ``C.MIGRATION_WAIT`` seconds. Only for a call that is one
    script call of one queue: of several, those of other queues would have run."""

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


def run_calls(client: redis.Redis, calls: list[tuple]) -> list:
    """``scripts.run_calls`` with script error replies turned into the project's exceptions."""
    try:
        return _scripts.run_calls(client, calls)
    except redis.ResponseError as exc:
        raise translate_error(exc) from None


def run_replicated(client: redis.Redis, calls: list[tuple], replicas: int, timeout: float) -> tuple[list, int]:
    """``run_calls`` ending with WAIT for ``replicas`` (at most ``timeout`` seconds): (replies,
    replicas that acknowledged them)."""
    try:
        return _scripts.run_replicated(client, calls, replicas, int(timeout * 1000))
    except redis.ResponseError as exc:
        raise translate_error(exc) from None


def run_acks(client: redis.Redis, calls: list[tuple], queues: Sequence[QueueBase]) -> list:
    """``run_calls`` of calls that carry acks: with ``wait_replicas`` set (on any of
    ``queues``), the round trip ends with WAIT, and acks that fewer replicas acknowledged are
    logged (a failover now may deliver those tasks again: at least once still holds)."""
    wanted = max((q.wait_replicas for q in queues), default=0)
    if not wanted:
        return run_calls(client, calls)
    timeout = max(q.wait_timeout for q in queues)
    replies, acked = run_replicated(client, calls, wanted, timeout)
    if acked < wanted:
        logger.warning(
            "celery-pq: acks in %s: only %d of %d replicas acknowledged them within %gs; a failover "
            "now may deliver those tasks again",
            ", ".join(repr(q.name) for q in queues),
            acked,
            wanted,
            timeout,
        )
    return replies


def pop_with_acks(
    queue: PriorityQueue,
    count: int = 1,
    *,
    acks: dict | None = None,
    lean: bool = False,
    lease_seconds: float | None = None,
    consumer: str | None = None,
    view: tuple[int, int] | None = None,
    bound: int | None = None,
) -> tuple[Popped, dict]:
    """One pop of ``queue`` and the acks of several queues, in one round trip.

    ``acks`` maps queues to ``(entry id, token)`` pairs; the other arguments are
    ``PriorityQueue.pop_call``'s. The popping queue's own acks ride in its pop script, the
    others' in ack scripts pipelined before it. Returns the leases and ``{queue: [code, ...]}``
    (1 acked, or an ErrorCode value, one per pair, in order). ``lean``: ``Delivery`` tuples
    instead of leases.
    """
    acks = acks or {}
    others = [(q, pairs) for q, pairs in acks.items() if q is not queue and pairs]
    own = acks.get(queue, ())
    calls = [q.ack_call(pairs) for q, pairs in others]
    calls.append(
        queue.pop_call(count, acks=own, lease_seconds=lease_seconds, consumer=consumer, view=view, bound=bound)
    )
    if own or others:
        replies = run_acks(queue.client, calls, [queue, *(q for q, _ in others)])
    else:
        replies = run_calls(queue.client, calls)
    reply = replies.pop()
    codes = {q: list(r) for (q, _), r in zip(others, replies)}
    if own:
        codes[queue] = queue.ack_codes(reply)
    popped: Popped = Popped(queue.parse_deliveries(reply) if lean else queue.parse_pop(reply), queue)
    return popped, codes


def ack_all(acks: dict) -> dict:
    """The acks of several queues, ``{queue: [(entry id, token), ...]}``, in one round trip;
    ``{queue: [code, ...]}`` (1 acked, or an ErrorCode value, one per pair, in order)."""
    batches = [(q, pairs) for q, pairs in acks.items() if pairs]
    if not batches:
        return {}
    replies = run_acks(batches[0][0].client, [q.ack_call(pairs) for q, pairs in batches], [q for q, _ in batches])
    return {q: list(r) for (q, _), r in zip(batches, replies)}
