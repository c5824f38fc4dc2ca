"""OpenTelemetry for celery-pq: ``instrument(app)`` turns on opentelemetry-instrumentation-celery
(its publish and run spans, one trace from ``apply_async`` to the run) and adds what only the
broker knows of each delivery, as metrics and as attributes of the run span. Needs the ``[otel]``
extra. docs/operations.md ("Tracing and metrics with OpenTelemetry").

The transport does not import OpenTelemetry: each delivery's ``delivery_info`` carries
``x-pq-entry`` (the queue, the entry's stored header, the delivery's Unix ms), which reaches a
task as ``task.request.properties["delivery_info"]``; the ``task_prerun`` handler here reads it.
Lease expiries and dead letters happen in the Lua scripts, which count them (docs/events.md,
"Counters"); with ``queue_counters=True`` observable counters report those counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..queue.values import unescape_tenant
from ..storage.errors import OTEL_EXTRA
from ..storage.records import split_entry
from ..transport.broker import Broker, queue_and_view, queue_names
from ..transport.messages import DELIVERED_ENTRY, unix_ms

try:
    from celery import signals
    from opentelemetry import metrics, trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.metrics import CallbackOptions, Observation
except ImportError as exc:  # the [otel] extra
    raise ImportError(OTEL_EXTRA.format(what="celery_pq.ops.otel")) from exc

#: The metrics (instrument names; docs/operations.md lists them with their attributes).
WAIT = "celery_pq.queue.wait"  # histogram, seconds in the broker: publish (or due time) to delivery
DELIVERIES = "celery_pq.deliveries"  # counter, deliveries run by this process
LEASE_EXPIRIES = "celery_pq.lease_expiries"  # observable counter, the scripts' lease_expired
DEAD_LETTERS = "celery_pq.dead_letters"  # observable counter, the scripts' dead_lettered

#: Attributes, of the metrics and of the run span.
QUEUE = "messaging.destination.name"
PRIORITY = "messaging.celery_pq.priority"
TENANT = "messaging.celery_pq.tenant"
REDELIVERED = "messaging.celery_pq.redelivered"
#: Attributes of the run span alone.
WAIT_MS = "messaging.celery_pq.wait_ms"
DELIVERY_COUNT = "messaging.celery_pq.delivery_count"
ENQUEUED_MS = "messaging.celery_pq.enqueued_ms"
DUE_MS = "messaging.celery_pq.due_ms"

#: The wait histogram's buckets (seconds): a few ms to an hour.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

#: Seconds a read of the queues' counters serves the observable counters of one collection.
COUNTERS_FRESH = 1.0


@dataclass(frozen=True)
class Delivered:
    """What the transport told of one delivery (``of_request``)."""

    queue: str
    priority: int | None
    tenant: str | None
    delivery_count: int
    enqueued_ms: int
    due_ms: int | None
    delivered_ms: int

    @property
    def wait_ms(self) -> int:
        """Ms from publish (or, for a delayed message, from its due time) to the delivery; for a
        redelivery, that includes the deliveries before it. The enqueue time is Redis's clock,
        the delivery the worker's: 0 at least."""
        start = self.enqueued_ms if self.due_ms is None else max(self.enqueued_ms, self.due_ms)
        return max(0, self.delivered_ms - start)

    @classmethod
    def of_request(cls, request: Any) -> Delivered | None:
        """The delivery of a Celery task's ``request``, or None (not delivered by celery-pq)."""
        props = getattr(request, "properties", None)
        if not isinstance(props, dict) or not isinstance(props.get("delivery_info"), dict):
            return None
        info = props["delivery_info"]
        entry = info.get(DELIVERED_ENTRY)
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            return None
        queue, head, delivered_ms = entry
        parsed = split_entry(bytes(head if isinstance(head, bytes) else str(head).encode()) + b"|")
        if parsed is None:
            return None
        header = parsed[0]
        eta = getattr(request, "eta", None)
        if isinstance(eta, datetime):
            eta = eta.isoformat()
        priority = props.get("priority")
        return cls(
            queue=str(queue),
            priority=priority if isinstance(priority, int) else None,
            tenant=unescape_tenant(header.tenant.decode()) if header.tenant else None,
            delivery_count=int(info.get("delivery_count") or 1),
            enqueued_ms=header.enqueued_ms,
            due_ms=unix_ms(eta, strict=False),
            delivered_ms=int(delivered_ms),
        )


class CeleryPQInstrumentor:
    """The ``task_prerun`` handler that records each delivery (``instrument`` makes one)."""

    def __init__(self, *, tenant_attribute: bool = False, meter_provider=None):
        self.tenant_attribute = tenant_attribute
        meter = metrics.get_meter("celery_pq", meter_provider=meter_provider)
        self.meter = meter
        self.wait = meter.create_histogram(
            WAIT,
            unit="s",
            description="Time a message waited in the broker: from its publish (a delayed one: its due time) "
            "to its delivery.",
            explicit_bucket_boundaries_advisory=list(WAIT_BUCKETS),
        )
        self.deliveries = meter.create_counter(
            DELIVERIES, unit="{delivery}", description="Deliveries that started a task in this process."
        )
        self._queue_counters: _QueueCounters | None = None

    def instrument(self) -> CeleryPQInstrumentor:
        signals.task_prerun.connect(self._on_prerun, weak=False)
        return self

    def uninstrument(self) -> None:
        signals.task_prerun.disconnect(self._on_prerun)

    def observe_queues(self, app, queues: Iterable[str] | None = None) -> None:
        """Observable counters of the lease expiries and dead letters the scripts counted per
        queue (read from Redis at each collection): turn on in one process per broker."""
        counters = self._queue_counters = _QueueCounters(app, queues)
        self.meter.create_observable_counter(
            LEASE_EXPIRIES,
            [counters.observer("lease_expired")],
            unit="{lease}",
            description="Leases that expired and were reclaimed (the message waits again).",
        )
        self.meter.create_observable_counter(
            DEAD_LETTERS,
            [counters.observer("dead_lettered")],
            unit="{message}",
            description="Messages moved to the dead-letter queue.",
        )

    def _on_prerun(self, task=None, **_) -> None:
        delivered = Delivered.of_request(getattr(task, "request", None))
        if delivered is None:
            return
        attrs: dict[str, Any] = {QUEUE: delivered.queue}
        if delivered.priority is not None:
            attrs[PRIORITY] = delivered.priority
        if self.tenant_attribute and delivered.tenant is not None:
            attrs[TENANT] = delivered.tenant
        wait_ms = delivered.wait_ms
        self.wait.record(wait_ms / 1000, attrs)
        redelivered = delivered.delivery_count > 1
        counted = {k: v for k, v in attrs.items() if k != PRIORITY}
        self.deliveries.add(1, {**counted, REDELIVERED: redelivered})
        span = trace.get_current_span()  # the run span opentelemetry-instrumentation-celery started
        if span.is_recording():
            span.set_attributes({**attrs, WAIT_MS: wait_ms, DELIVERY_COUNT: delivered.delivery_count})
            span.set_attributes({REDELIVERED: redelivered, ENQUEUED_MS: delivered.enqueued_ms})
            if delivered.tenant is not None:
                span.set_attribute(TENANT, delivered.tenant)
            if delivered.due_ms is not None:
                span.set_attribute(DUE_MS, delivered.due_ms)


class _QueueCounters:
    """The scripts' counters of each queue, read at most once per ``COUNTERS_FRESH`` seconds."""

    def __init__(self, app, queues: Iterable[str] | None):
        self.broker = Broker.of(app)
        self.queues = list(queues) if queues else None
        self._read: tuple[float, dict[str, dict[str, int]]] = (-COUNTERS_FRESH, {})

    def counts(self) -> dict[str, dict[str, int]]:
        at, counts = self._read
        if time.monotonic() - at < COUNTERS_FRESH:
            return counts
        with self.broker.channel() as channel:
            counts = {name: queue_and_view(channel, name)[0].counters() for name in queue_names(channel, self.queues)}
        self._read = (time.monotonic(), counts)
        return counts

    def observer(self, field: str):
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(c.get(field, 0), {QUEUE: q}) for q, c in self.counts().items()]

        return observe


def instrument(
    app=None,
    *,
    tenant_attribute: bool = False,
    queue_counters: bool = False,
    queues: Iterable[str] | None = None,
    tracer_provider=None,
    meter_provider=None,
) -> CeleryPQInstrumentor:
    """Trace and measure Celery tasks on celery-pq: turns on opentelemetry-instrumentation-celery
    (unless on already; ``tracer_provider``, ``meter_provider`` go to it) and records each
    delivery (``WAIT``, ``DELIVERIES``, the run span's attributes). ``tenant_attribute``: the
    tenant as a metric attribute too (one series per tenant). ``queue_counters``: also the
    observable ``LEASE_EXPIRIES`` and ``DEAD_LETTERS`` of ``app``'s broker (``queues``, or
    every declared queue), read from Redis; turn them on in one process per broker (each process
    would report the same totals). Call it where the worker (and the publisher) starts, after
    the providers are set."""
    celery = CeleryInstrumentor()
    if not celery.is_instrumented_by_opentelemetry:
        celery.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    pq = CeleryPQInstrumentor(tenant_attribute=tenant_attribute, meter_provider=meter_provider).instrument()
    if queue_counters:
        if app is None:
            raise ValueError("queue_counters=True reads the broker's queues: pass the Celery app")
        pq.observe_queues(app, queues)
    return pq
