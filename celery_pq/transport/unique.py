"""Unique tasks by key, the transport's side: a message's key, mode and seconds; ``publish_outcome``. docs/unique.md."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..queue.unique import MAX_KEY_BYTES, MODES, PublishOutcome, UniqueKey
from .tenants import message_key

if TYPE_CHECKING:
    from .options import Options

#: The headers of a key's mode and seconds (the key's own is the option ``unique_key``).
MODE_HEADER, SECONDS_HEADER = "pq_unique_mode", "pq_unique_seconds"
#: Celery's retry count (``Task.retry`` sends the id again, this one up): tells a retry of the
#: task standing for a key from a publish of its id.
RETRIES_HEADER = "retries"
#: Publishes with a key whose outcome this process remembers (the latest ones).
OUTCOMES_KEPT = 10_000

__all__ = ["MODES", "PublishOutcome", "UniqueKey", "publish_outcome", "unique_of"]


def unique_of(message: dict, options: Options, queue: str, decode_body: Callable) -> UniqueKey | None:
    """The unique key of an outgoing message, or None; ValueError naming the header or function at fault."""
    headers = message.get("headers") or {}
    key = message_key(message, "unique_key", options.unique_key, options.unique_fn, decode_body)
    if key is None:
        if MODE_HEADER in headers or SECONDS_HEADER in headers:
            raise ValueError(
                f"header {MODE_HEADER!r} or {SECONDS_HEADER!r} given without a unique key ({_source(options)}); "
                "the message was not published"
            )
        return None
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(
            f"{_source(options)}: a unique key is a non-empty str of at most {MAX_KEY_BYTES} bytes, got {key!r:.80}; "
            "the message was not published"
        )
    mode, seconds = options.unique_defaults(queue)
    mode = headers.get(MODE_HEADER, mode)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(
            f"header {MODE_HEADER!r} must be one of {', '.join(MODES)}, got {mode!r}; the message was not published"
        )
    retries = headers.get(RETRIES_HEADER) or 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(
            f"header {RETRIES_HEADER!r} of a message with a unique key must be an int >= 0 (a retry count), "
            f"got {retries!r:.80}; the message was not published"
        )
    try:
        seconds = headers.get(SECONDS_HEADER, seconds)
        return UniqueKey(key, mode, seconds, source=f"header {SECONDS_HEADER!r}", retries=retries)
    except ValueError as exc:
        raise ValueError(f"{exc}; the message was not published") from None


def _source(options: Options) -> str:
    """Where a message's unique key comes from, for an error message."""
    return f"{'header' if options.unique_fn is None else 'unique_key function'} {options.unique_key!r}"


#: The outcomes of this process's latest publishes with a key, by the id published.
_outcomes: OrderedDict[str, PublishOutcome] = OrderedDict()
_outcomes_lock = threading.Lock()


def remember(outcome: PublishOutcome) -> None:
    """Keep ``outcome`` for ``publish_outcome`` (the latest OUTCOMES_KEPT)."""
    if outcome.requested is None:
        return
    with _outcomes_lock:
        _outcomes[outcome.requested] = outcome
        _outcomes.move_to_end(outcome.requested)
        while len(_outcomes) > OUTCOMES_KEPT:
            _outcomes.popitem(last=False)


def publish_outcome(result: Any) -> PublishOutcome | None:
    """What became of the publish of ``result`` (an ``AsyncResult`` or a task id; TypeError for another) in this
    process: a ``PublishOutcome`` (``kind``: stored, merged, replaced, debounced or throttled; ``task_id``: the task
    standing for the key), or None for a publish without a key or not among this process's last ``OUTCOMES_KEPT``."""
    task_id = result if isinstance(result, str) else getattr(result, "id", None)
    if not isinstance(task_id, str):
        raise TypeError(f"publish_outcome takes an AsyncResult or a task id str, got {type(result).__name__}")
    with _outcomes_lock:
        return _outcomes.get(task_id)
