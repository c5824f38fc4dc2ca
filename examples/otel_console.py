"""Tracing and metrics with OpenTelemetry, printed to the console (docs/operations.md, "Tracing
and metrics with OpenTelemetry"). Needs ``pip install 'celery-pq[otel]' opentelemetry-sdk``.

The publisher sends three tasks (one plain, one with a priority, one with a 2 s countdown) inside
one span of its own; each task's run span, in the worker, is in that span's trace and carries
what the broker knows (``messaging.celery_pq.wait_ms``, ``...delivery_count``, ``...priority``).
The worker prints its spans as they end and its metrics (``celery_pq.queue.wait``,
``celery_pq.deliveries``, and the queue's ``celery_pq.lease_expiries`` and ``celery_pq.dead_letters``)
every 5 seconds and when it stops. A worker in one shell, the publishes in another::

    celery -A examples.otel_console worker -Q otel_demo -P solo
    python -m examples.otel_console

or in one go (it starts a worker of its own, stops it at the end and prints what it printed)::

    python -m examples.otel_console --with-worker

PQ_EXAMPLE_BROKER  the broker URL (default ``pq://127.0.0.1:6379/0``).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from celery_pq.ops import otel

BROKER = os.environ.get("PQ_EXAMPLE_BROKER", "pq://127.0.0.1:6379/0")
QUEUE = "otel_demo"

app = Celery("otel_console")
app.conf.update(broker_url=BROKER, task_default_queue=QUEUE, broker_connection_retry_on_startup=True)

# The SDK, exporters and processors are the application's choice; these print to stdout. (In a
# prefork worker, set them up in a worker_process_init handler: a batch processor's thread does
# not survive the fork.)
resource = Resource.create({"service.name": "otel-console-demo"})
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(tracer_provider)
meter_provider = MeterProvider(
    resource=resource,
    metric_readers=[PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=5000)],
)

# The one call: opentelemetry-instrumentation-celery's spans, and celery-pq's figures of each
# delivery; queue_counters in one process per broker (here the worker's).
otel.instrument(app, meter_provider=meter_provider, queue_counters="worker" in sys.argv, queues=[QUEUE])


@app.task(name="otel_demo.work")
def work(n):
    return n * 2


def publish():
    tracer = trace.get_tracer("otel_console")
    with tracer.start_as_current_span("publish three tasks") as span:
        work.delay(1)
        work.apply_async((2,), priority=9)
        work.apply_async((3,), countdown=2)
    print(f"published 3 tasks in trace {span.get_span_context().trace_id:032x}", flush=True)


def main(argv):
    if "--with-worker" not in argv:
        publish()
        return
    from celery_pq.testing import start_worker

    log = Path(tempfile.mkdtemp(prefix="otel-demo-")) / "worker.log"
    worker = start_worker("examples.otel_console", cwd=Path(__file__).resolve().parents[1], queues=QUEUE, log=log)
    try:
        worker.wait_ready(60)
        publish()
        time.sleep(6)  # the countdown, and one metrics export
    finally:
        worker.stop()  # SIGTERM, a warm shutdown: the meter provider exports once more as it exits
    print("--- the worker printed ---")
    print(log.read_text(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
