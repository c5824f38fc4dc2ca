"""A DataFrame row (a sequence of values in column order; no pyspark here) as a Celery task message
made by Celery's own ``as_task_v2``, stored as the transport stores one. docs/spark.md ("Columns")."""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import uuid
from dataclasses import replace
from datetime import UTC, date, datetime
from hashlib import blake2b

from celery import Celery
from celery.utils.saferepr import saferepr
from kombu import serialization

from ...queue import validate_priority
from ...storage.checks import text
from ...storage.errors import MessageTooLarge
from ...transport.messages import digest, prepare_message, stored_item
from .settings import KEY_NAMESPACE, WriterSettings

#: Types whose repr is what Celery's saferepr writes for them.
_REPR_SAFE = frozenset({int, float, bool, type(None)})


class Rejected(ValueError):
    """A row that is not sent; the message is the reason (it names the column)."""


def _decode_body(body, encoding):
    """kombu's virtual ``Channel.decode_body`` for the base64 bodies made here."""
    return base64.b64decode(body) if encoding == "base64" else body


def plain(value):
    """A Spark value as JSON can carry it: a struct (Row) becomes a dict, recursively."""
    if isinstance(value, tuple) and hasattr(value, "asDict"):
        return {k: plain(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        raise TypeError("binary values cannot be sent as JSON (encode them, e.g. base64, first)")
    return value


class TaskRows:
    """The task messages of partition ``partition``'s rows, each ``build`` (or ``skip``) the next row.
    ``eta_is_local``: naive ``eta`` datetimes are local time (TimestampType), not UTC as naive ISO text is."""

    def __init__(self, settings: WriterSettings, *, partition: int = 0, eta_is_local: bool = True):
        self.s = settings
        self.partition = partition
        self.position = -1  # of the row being built, in its partition
        #: {digest of a row's values: how many rows of those values the partition had so far}
        self.seen: dict[int, int] = {}
        #: Part of a row's identity without task_id or key (the streaming sink sets it per attempt)
        self.write_id = settings.write_id
        self.options = settings.transport
        self.app = Celery("celery_pq.spark", set_as_current=False)
        self.origin = f"gen{os.getpid()}@{socket.gethostname()}"  # Celery's anon_nodename
        index = {c: i for i, c in enumerate(settings.columns)}
        self.args = [index[c] for c in settings.args]
        self.kwargs = [(c, index[c]) for c in settings.kwargs]
        self.key = [index[c] for c in settings.key]
        self.role = {c: index[c] for c in settings.roles}
        self.fair_column = index.get(settings.fair_column) if settings.fair_column else None
        self.fair_header = settings.transport.fair_key if settings.transport.tenant_fn is None else None
        self.eta_is_local = eta_is_local
        # as_task_v2 once for the headers rows share; build() fills in the rest as it would (a test compares)
        amqp = self.app.amqp
        self.headers = amqp.as_task_v2("", settings.task, origin=self.origin).headers
        self.headers.update(settings.trace_context)  # the driver's trace context (docs/spark.md)
        self.repr_sizes = amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize
        self.repr_levels = self.app.conf.task_repr_maxlevels

    def _role(self, row, name):
        i = self.role.get(name)
        return None if i is None else row[i]

    def skip(self, row) -> None:
        """Pass over the next row (handled by an earlier attempt), keeping the ids of those after."""
        self.position += 1
        self._occurrence(row)

    def _occurrence(self, row) -> tuple[int, int]:
        """(the digest of ``row``'s values, how many rows of the partition had them before)."""
        values = int.from_bytes(blake2b(repr(tuple(row)).encode(), digest_size=8).digest(), "big")
        n = self.seen.get(values, 0)
        self.seen[values] = n + 1
        return values, n

    def build(self, row, now: float) -> tuple[str, object]:
        """``(queue, Item)`` of the next row, or ``Rejected``; countdowns count from ``now``."""
        self.position += 1
        queue = self._role(row, "queue")
        if queue is None:
            queue = self.s.queue
        elif not isinstance(queue, str) or not queue:
            raise Rejected(f"queue must be a non-empty string, got {queue!r}")
        priority = self._role(row, "priority")
        if priority is not None:
            try:
                validate_priority(priority)
            except ValueError as exc:
                raise Rejected(str(exc)) from None
        tenant = self._role(row, "tenant")
        if tenant is None and self.fair_column is not None:
            tenant = row[self.fair_column]
        if tenant is not None and not isinstance(tenant, str):
            raise Rejected(f"tenant must be a string, got {tenant!r} ({type(tenant).__name__})")
        eta = self._eta(row, now)
        try:
            args = [plain(row[i]) for i in self.args]
            kwargs = {c: plain(row[i]) for c, i in self.kwargs}
            content_type, content_encoding, body = serialization.dumps(
                (args, kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}), serializer="json"
            )
        except (TypeError, ValueError) as exc:
            raise Rejected(f"args/kwargs cannot be sent as JSON: {exc}") from None
        task_id = self._task_id(row)
        headers = self.headers.copy()
        headers.update(
            id=task_id,
            root_id=task_id,
            eta=eta,
            argsrepr=self._repr(args, self.repr_sizes[0]),
            kwargsrepr=self._repr(kwargs, self.repr_sizes[1]),
        )
        if tenant is not None and self.fair_header:
            headers[self.fair_header] = tenant  # apply_async(headers={fair_key: tenant})
        properties = {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2}
        message = prepare_message(self.options, body, priority, content_type, content_encoding, headers, properties)
        message["body"] = base64.b64encode(body.encode() if isinstance(body, str) else body).decode()
        props = message["properties"]
        props["delivery_info"].update(exchange="", routing_key=queue)
        props.update(body_encoding="base64", delivery_tag=str(uuid.uuid4()))
        try:
            item = stored_item(
                queue, message, self.options, _decode_body, publish_id_=digest("celery_pq.spark", task_id)
            )
        except MessageTooLarge as exc:
            raise Rejected(f"message is {exc.size} bytes, over max_message_bytes={exc.limit}") from None
        except ValueError as exc:
            raise Rejected(str(exc)) from None
        # The task name always goes with a row (for the event log's enqueue events); a tenant
        # column wins over a fair_key function.
        item = replace(item, tenant=item.tenant if tenant is None else tenant, task=self.s.task)
        return queue, item

    def _repr(self, value, maxsize: int) -> str:
        """Celery's argsrepr/kwargsrepr of ``value`` (``saferepr``'s text)."""
        values = value.values() if isinstance(value, dict) else value
        if all(type(v) in _REPR_SAFE for v in values):
            text = repr(value)
            if len(text) < maxsize:
                return text
        return saferepr(value, maxsize, maxlevels=self.repr_levels)

    def _eta(self, row, now: float) -> str | None:
        countdown, eta = self._role(row, "countdown"), self._role(row, "eta")
        if countdown is not None and eta is not None:
            raise Rejected("countdown and eta are both given; give one")
        if countdown is not None:
            if isinstance(countdown, bool) or not isinstance(countdown, (int, float)) or not 0 <= countdown < math.inf:
                raise Rejected(f"countdown must be a number of seconds >= 0, got {countdown!r}")
            return datetime.fromtimestamp(now + countdown, UTC).isoformat()
        if eta is None:
            return None
        if isinstance(eta, str):
            try:
                when = datetime.fromisoformat(eta)
            except ValueError:
                raise Rejected(f"eta {eta!r} is not an ISO 8601 time") from None
            local = False
        elif isinstance(eta, datetime):
            when, local = eta, self.eta_is_local
        else:
            kind = "a date without a time" if isinstance(eta, date) else type(eta).__name__
            raise Rejected(f"eta must be a timestamp or an ISO 8601 string, got {kind} {eta!r}")
        if when.tzinfo is None:
            when = when.astimezone() if local else when.replace(tzinfo=UTC)
        return when.astimezone(UTC).isoformat()

    def _task_id(self, row) -> str:
        """The row's ``task_id``; else derived from its ``key`` columns and the job (the same in
        every write); else from the write, the partition, the row's values and how many rows had
        them before (the same in every attempt, in any order; identical rows still apart)."""
        if "task_id" in self.role:
            return text("task_id", row[self.role["task_id"]], error=Rejected)
        if self.key:
            values = [row[i] for i in self.key]
            for c, v in zip(self.s.key, values):
                if v is None:
                    raise Rejected(f"key column {c!r} is null")
            if all(type(v) in (int, str) for v in values):  # the common case, without JSON
                name = self.s.job + "".join(f"\0{type(v).__name__[0]}{v}" for v in values)
            else:
                name = json.dumps([self.s.job, [plain(v) for v in values]], default=str, sort_keys=True)
            return str(uuid.uuid5(KEY_NAMESPACE, name))
        digest, n = self._occurrence(row)
        return str(uuid.uuid5(KEY_NAMESPACE, f"{self.write_id}:{self.partition}:{digest:x}:{n}"))
