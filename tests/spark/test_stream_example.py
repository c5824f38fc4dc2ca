"""examples/spark_stream.py, bounded: files arriving in a folder streamed into a queue drained by
a real Celery worker, the sink stopped and restarted halfway, the event log streamed back."""

from __future__ import annotations

import pytest

from examples import spark_stream

pytestmark = pytest.mark.e2e


def test_spark_stream_example_end_to_end(spark, tmp_path):
    # The example makes its own local session: getOrCreate returns the tests' session, which it
    # must not stop, so it is told to leave it running.
    result = spark_stream.run(files=6, rows=20, out=tmp_path / "demo", timeout=120, stop_spark=False)
    assert result["ok"], result
    assert result["once"] == 120
    assert result["events"]["enqueue"] == result["events"]["ack"] == 120
