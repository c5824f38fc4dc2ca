"""``python -m celery_pq.sim sweep --spark --quick``: the quick grid as a Spark job (the grid a
DataFrame, each row simulated in mapInPandas) gives, row for row, what the same rows give when
simulated in this process, and writes the table and figures."""

from __future__ import annotations

import csv

from click.testing import CliRunner

from celery_pq.sim.cli import main
from celery_pq.sim.sweep import grid, run_row


def test_quick_sweep_on_spark_matches_local_rows_and_writes_outputs(spark, tmp_path):
    # Given the test session's SparkSession (the sweep uses the active session and leaves it up)
    out, img = tmp_path / "out", tmp_path / "img"
    # When the quick sweep runs as a Spark job
    result = CliRunner().invoke(main, ["sweep", "--spark", "--quick", "--out", str(out), "--img", str(img)])
    # Then every grid row is in the table, in grid order, with the figures beside it
    assert result.exit_code == 0, result.output
    assert "(Spark, local mode)" in result.output
    rows = grid(quick=True)
    with (out / "sim.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [(r["panel"], r["policy"], r["nodes"], r["peeks"], r["lag"], r["consumers"]) for r in table] == [
        (r["panel"], r["policy"], str(r["nodes"]), str(r["peeks"]), str(r["lag"]), str(r["consumers"])) for r in rows
    ]
    assert {p.name for p in img.iterdir()} == {
        f"relaxed-{panel}.png" for panel in ("distribution", "lag", "nodes", "peeks", "concurrency", "multiqueue")
    }
    # And a row simulated on Spark is exactly the row simulated here (same seed, same figures)
    for i in (1, 13, len(rows) - 3):
        here = run_row(rows[i])
        for name in ("mean", "p50", "p90", "p99", "max", "p_zero", "extra_pops", "retries"):
            assert float(table[i][name]) == float(here[name]), (i, name)
    assert spark.sparkContext._jsc is not None  # the shared session is still up
