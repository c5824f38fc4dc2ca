"""The tenant of an outgoing message, for fair queues: ``task:<name>`` for a task the
``task_rate`` option limits on the queue (``task_rates.py``), else the header named by the
``fair_key`` option, or what the function it names returns (``Options.tenant_fn``)."""

from __future__ import annotations

from collections.abc import Callable

from .options import Options
from .task_rates import limited_tenant


def tenant_of(message: dict, options: Options, decode_body: Callable, queue: str) -> str | None:
    """The tenant of a message going to ``queue`` (None: the shared default tenant).
    ``decode_body`` is the channel's (kombu's ``Channel.decode_body``). ValueError, with nothing
    written, when the function raises or the tenant is not a string."""
    if options.task_rate:  # a limited task's messages form a tenant of their own
        tenant = limited_tenant(options.task_rate, queue, message.get("headers") or {})
        if tenant is not None:
            return tenant
    fair_key, fn = options.fair_key, options.tenant_fn
    if fair_key is None:
        return None
    if fn is not None:
        try:
            # the function sees the message with its body decoded (the serialized payload)
            props = message.get("properties") or {}
            body = decode_body(message.get("body"), props.get("body_encoding"))
            tenant = fn({**message, "body": body})
        except Exception as exc:
            raise ValueError(f"fair_key function {fair_key!r} raised {exc!r}; the message was not published") from exc
    else:
        tenant = (message.get("headers") or {}).get(fair_key)
    if tenant is not None and not isinstance(tenant, str):
        raise ValueError(
            f"fair_key {fair_key!r} gave {tenant!r} ({type(tenant).__name__}), "
            "not a string; the message was not published"
        )
    return tenant
