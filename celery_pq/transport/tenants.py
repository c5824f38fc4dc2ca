"""A message's tenant on a fair queue: ``task:<name>`` for a task it limits, else ``fair_key``'s. docs/fairness.md."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from ..queue.item import MAX_COST, MIN_COST
from ..storage.constants import TASK_TENANT_PREFIX
from .options import Options

logger = logging.getLogger("celery_pq")

#: The header a message declares its cost in (``fair_cost="declared"``; docs/fairness.md).
COST_HEADER = "x-pq-cost"


def tenant_of(message: dict, options: Options, decode_body: Callable, limits: Mapping[str, float] | None) -> str | None:
    """The tenant of a message (None: the default tenant). ``decode_body``: kombu's; ``limits``:
    the queue's ``task_limits``. ValueError when ``fair_key`` gives a non-str or its function raises."""
    if limits:
        task = (message.get("headers") or {}).get("task")
        if isinstance(task, str) and TASK_TENANT_PREFIX + task in limits:
            return TASK_TENANT_PREFIX + task
    if options.fair_key is None:
        return None
    return message_key(message, "fair_key", options.fair_key, options.tenant_fn, decode_body)


def message_key(message: dict, option: str, value: str, fn: Callable | None, decode_body: Callable) -> str | None:
    """What a key option (``fair_key``, ``unique_key``) gives a message: the header ``value``, or ``fn`` of the
    message, body decoded. ValueError when the function raises or either gives neither a str nor None."""
    if fn is None:
        key = (message.get("headers") or {}).get(value)
    else:
        try:
            props = message.get("properties") or {}
            key = fn({**message, "body": decode_body(message.get("body"), props.get("body_encoding"))})
        except Exception as exc:
            raise ValueError(f"{option} function {value!r} raised {exc!r}; the message was not published") from exc
    if key is not None and not isinstance(key, str):
        raise ValueError(
            f"{option} {'' if fn is None else 'function '}{value!r} gave {key!r} ({type(key).__name__}), "
            "not a string; the message was not published"
        )
    return key


def cost_of(message: dict, queue: str) -> float | None:
    """The cost a message declares (header ``x-pq-cost``), stored with it whatever this process's
    ``fair_cost`` (the queue's recorded one decides whether it counts). None when missing (it
    counts 1) or invalid (logged): never refused."""
    given = (message.get("headers") or {}).get(COST_HEADER)
    if given is None:
        return None
    try:
        cost = float(given)
    except (TypeError, ValueError, OverflowError):
        cost = float("nan")
    if isinstance(given, bool) or not MIN_COST <= cost <= MAX_COST:  # (nan fails both)
        logger.warning(
            "celery-pq: queue %r: header %s=%r is not a number from %g to %g; the message counts 1",
            queue,
            COST_HEADER,
            given,
            MIN_COST,
            MAX_COST,
        )
        return None
    return cost
