"""A Celery app traced and measured with OpenTelemetry (``celery_pq.ops.otel.instrument``), for
tests/e2e/test_otel_e2e.py; configured as tests/e2e/app.py is, and:

PQ_TEST_SPANS          file the worker appends its finished spans to, one JSON object a line
PQ_TEST_METRICS        file the task ``otel.metrics`` writes the worker's metrics to (JSON)
PQ_TEST_OTEL_TENANT    "1": the tenant as a metric attribute (``tenant_attribute``)
PQ_TEST_OTEL_COUNTERS  "1": the queues' observable counters (``queue_counters``)

The providers are set at import, before the prefork pool forks: a ``SimpleSpanProcessor``
exports in the thread that ends the span, and an ``InMemoryMetricReader`` is read on demand,
so neither has a thread a fork would lose.
"""

import json
import os
import time

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import celery_pq  # noqa: F401  (registers pq://)
from celery_pq.ops import otel

from .recording import configure, log

app = Celery("e2e-otel")
configure(app, task_acks_late=os.environ.get("PQ_TEST_ACKS_LATE") == "1")


def span_record(span) -> dict:
    """A finished span as the test reads it."""
    ctx, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line."""

    def __init__(self, path: str):
        self.path = path

    def export(self, spans):
        with open(self.path, "a") as f:
            for span in spans:
                f.write(json.dumps(span_record(span), default=str) + "\n")
        return SpanExportResult.SUCCESS


tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["PQ_TEST_SPANS"])))
reader = InMemoryMetricReader()
meter_provider = MeterProvider(metric_readers=[reader])
otel.instrument(
    app,
    tenant_attribute=os.environ.get("PQ_TEST_OTEL_TENANT") == "1",
    queue_counters=os.environ.get("PQ_TEST_OTEL_COUNTERS") == "1",
    queues=["q"],
    tracer_provider=tracer_provider,
    meter_provider=meter_provider,
)


def current_trace_id() -> str:
    return format(trace.get_current_span().get_span_context().trace_id, "032x")


@app.task(name="otel.work", bind=True)
def work(self, tag):
    log("work", [tag, self.request.id, current_trace_id(), self.request.retries])


@app.task(name="otel.retry", bind=True, max_retries=1)
def retry(self, tag):
    log("work", [tag, self.request.id, current_trace_id(), self.request.retries])
    if self.request.retries == 0:
        raise self.retry(countdown=0)


@app.task(name="otel.hang", bind=True)
def hang(self, tag):
    """The first delivery hangs (the test SIGKILLs the worker); a redelivery returns."""
    log("work", [tag, self.request.id, current_trace_id(), self.request.retries])
    if not self.request.get("x-delivery-count"):
        time.sleep(60)


@app.task(name="otel.metrics")
def dump_metrics():
    """This process's metrics, as the SDK's reader collects them, to PQ_TEST_METRICS."""
    data = reader.get_metrics_data()
    path = os.environ["PQ_TEST_METRICS"]
    with open(path + ".tmp", "w") as f:
        f.write(data.to_json() if data is not None else "{}")
    os.replace(path + ".tmp", path)
