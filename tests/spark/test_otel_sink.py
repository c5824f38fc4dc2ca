"""The Spark sink builds its task messages itself, without Celery's publish signal: ``enqueue``
hands the writer the driver's trace context (option ``trace_context``), each message carries it
in its headers, and opentelemetry-instrumentation-celery's run span of each row's task joins the
driver's trace. (The writer's options are read in a Spark Python worker, not the driver: the
context must travel as an option.)"""

from __future__ import annotations

import pytest

from celery_pq.spark import enqueue, trace_context
from celery_pq.spark.sink.settings import WriterSettings
from celery_pq.storage.errors import ConfigError
from tests.e2e.test_otel_e2e import Client, OtelHarness

pytestmark = pytest.mark.spark


def test_rows_enqueued_inside_a_span_run_in_its_trace(spark, redis_server, key_prefix, tmp_path):
    h = OtelHarness(redis_server, key_prefix, tmp_path, {})
    client = Client()
    try:
        df = spark.createDataFrame([("row-1",), ("row-2",)], "tag string")
        with client.tracer.start_as_current_span("driver") as span:
            result = enqueue(
                df, h.url, "otel.work", args=["tag"], queue="q", transport_options={"key_prefix": key_prefix}
            )
        assert result.sent == 2
        ids = [e.id for e in h.queue().peek(10)]
        h.worker("w1")
        for task_id in ids:
            (run,) = h.run_spans(task_id)
            assert run["trace_id"] == format(span.get_span_context().trace_id, "032x")
            assert run["parent_id"] == format(span.get_span_context().span_id, "016x")
    finally:
        client.instrumentor.uninstrument()
        h.close()


def test_the_option_without_a_span_and_when_bad():
    def parse(**options):
        return WriterSettings.parse({"broker": "pq://127.0.0.1:6379/0", "task": "t", **options}, ["a"])

    assert trace_context() == ""  # no span current
    assert parse(trace_context="").trace_context == ()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert parse(trace_context=f'{{"traceparent": "{parent}"}}').trace_context == (("traceparent", parent),)
    with pytest.raises(ConfigError, match="trace_context"):
        parse(trace_context="[1]")
