"""examples/spark_pipeline.py, bounded: 2,000 rows from Spark through real Celery workers and back
as the event log, into the report."""

from __future__ import annotations

import pytest

from examples import spark_pipeline

pytestmark = pytest.mark.e2e


def test_spark_pipeline_end_to_end(spark, tmp_path):
    # The example makes its own local session: getOrCreate returns the tests' session, which it
    # must not stop, so it is told to leave it running.
    result = spark_pipeline.run(
        rows=2_000, workers=1, concurrency=4, out=tmp_path / "demo", work_ms=0.5, timeout=150, stop_spark=False
    )
    assert result["ok"], result
    assert result["sent"] == 2_000
    # every task's enqueue, deliver and ack came back through the stream, exactly once
    assert result["events"] == result["logged"] >= 6_000
    f = result["figures"]
    shares = {t: float(f[f"pipeline|{t}|share"]) for t, _, _ in spark_pipeline.TENANTS}
    assert shares == pytest.approx({t: s for t, s, _ in spark_pipeline.TENANTS}, abs=0.01)
    assert int(f["pipeline||acked"]) == 2_000 and int(f["pipeline||dead"]) == 0
    assert result["html"].read_text().count("data:image/png;base64,") == 1
