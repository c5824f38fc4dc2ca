"""The parameter sweep: a grid of simulations, each row in a *panel* beside one of the paper's
figures, run here or as a Spark job, written as ``sim.csv``, ``sim.md``, ``sim-histogram.csv`` and
figures (docs/relaxed.md, "How to rerun")."""

from __future__ import annotations

import csv
import math
from dataclasses import fields
from pathlib import Path

import numpy as np

from .model import Params, multiqueue_mean_rank_error, multiqueue_params, p_zero_fresh_peek, simulate

HIST_MAX = 100  # the histogram counts rank errors 0..99 one by one, then ">= 100"
STRATEGIES = ("peek-before-pop", "peek-before-add", "peek-before-add-best", "no-peek")
GRID_COLUMNS = ("panel", *(f.name for f in fields(Params)))
FIGURE_COLUMNS = ("mean", "p50", "p90", "p99", "max", "p_zero", "extra_pops", "retries", "theory_mean", "theory_p_zero")


def grid(quick: bool = False, seed: int = 1) -> list[dict]:
    """The sweep's rows (dicts of ``GRID_COLUMNS``); ``quick``: the same panels small (seconds)."""
    rows: list[dict] = []
    big, pops = (200, 2_000) if quick else (10_000, 50_000)

    def add(panel, params=None, **kw):
        kw.setdefault("pops", pops)
        kw.setdefault("warmup", 500 if quick else None)
        params = params or Params(seed=seed + len(rows), **kw)
        rows.append({"panel": panel, **{f.name: getattr(params, f.name) for f in fields(Params)}})

    add("distribution", nodes=20, peeks=2, lag=big, pops=pops * 4)
    for lag in (10, 100, 300) if quick else (10, 100, 1_000, 10_000):
        for strategy in STRATEGIES:
            add("lag", nodes=20, peeks=2, lag=lag, policy=strategy)
    for k in (2, 4):
        for n in (5, 10, 20) if quick else (5, 10, 20, 50, 100):
            add("nodes", nodes=n, peeks=k, lag=big)
    nodes = 20 if quick else 100
    for k in (1, 2, 5) if quick else (1, 2, 3, 4, 5, 10, 20):
        add("peeks", nodes=nodes, peeks=k, lag=big)
    for c in (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64):
        for second_best in (False, True):
            add("concurrency", nodes=nodes, peeks=5 if quick else 10, lag=big, consumers=c, second_best=second_best)
    for n in (4, 16, 64):
        add("multiqueue", multiqueue_params(n, 5_000 if quick else 400_000, seed + len(rows), 500 if quick else 2_000))
    return rows


def run_row(row: dict) -> dict:
    """Simulate one grid row: the row, its figures, the closed forms that apply, its histogram."""
    p = Params(**{name: row[name] for name in GRID_COLUMNS if name != "panel"})
    result = simulate(p)
    theory_mean = theory_p_zero = math.nan
    if p.policy == "multiqueue" and p.peeks == 2 and p.priorities == "fifo":
        theory_mean = multiqueue_mean_rank_error(p.nodes)
    if p.policy == "peek-before-pop" and p.consumers == 1 and p.priorities == "uniform" and p.lag >= 10 * p.nodes:
        theory_p_zero = p_zero_fresh_peek(p.nodes, p.peeks)
    hist = np.bincount(np.minimum(result.pei, HIST_MAX), minlength=HIST_MAX + 1)
    return {
        **row,
        "warmup": p.warmup_pops,
        **{name: result.row()[name] for name in FIGURE_COLUMNS[:-2]},
        "theory_mean": theory_mean,
        "theory_p_zero": theory_p_zero,
        "histogram": [int(v) for v in hist],
    }


def run_spark(rows: list[dict], spark=None) -> list[dict]:
    """The sweep as a Spark job (each row simulated in ``mapInPandas``), results in grid order.
    ``spark``: default the active session, else a local one made here and stopped at the end."""
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T

    spark = spark or SparkSession.getActiveSession()
    own = spark is None
    if own:
        from ..spark.session import local_spark

        spark = local_spark("celery-pq-sim")
    try:
        grid_schema = T.StructType(
            [T.StructField("row", T.LongType())]
            + [T.StructField(name, _spark_type(T, rows[0][name])) for name in GRID_COLUMNS]
        )
        out_schema = T.StructType(
            grid_schema.fields
            + [T.StructField(name, T.DoubleType()) for name in FIGURE_COLUMNS]
            + [T.StructField("histogram", T.ArrayType(T.LongType()))]
        )
        frame = spark.createDataFrame([{"row": i, **row} for i, row in enumerate(rows)], grid_schema)
        names = out_schema.fieldNames()

        def simulate_frames(frames):
            import pandas as pd

            for frame in frames:
                done = [
                    run_row({k: _plain(v) for k, v in rec.items() if k != "row"}) | {"row": rec["row"]}
                    for rec in frame.to_dict("records")
                ]
                yield pd.DataFrame([{name: d[name] for name in names} for d in done], columns=names)

        partitions = min(len(rows), 4 * spark.sparkContext.defaultParallelism)
        results = frame.repartition(partitions).mapInPandas(simulate_frames, out_schema).orderBy("row").collect()
        # Arrow hands a NaN back as null: the closed-form columns say NaN where none applies
        return [
            {
                k: math.nan if v is None and k in FIGURE_COLUMNS else _plain(v)
                for k, v in r.asDict().items()
                if k != "row"
            }
            for r in results
        ]
    finally:
        if own:
            spark.stop()


def _spark_type(T, value):
    if isinstance(value, bool):
        return T.BooleanType()
    if isinstance(value, int) or value is None:
        return T.LongType()
    return T.StringType()


def _plain(value):
    """numpy and pandas scalars and arrays as plain Python values (ints stay ints)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [int(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and not math.isnan(value):
        return int(value)
    return value


def write(results: list[dict], out_dir: Path, img_dir: Path | None) -> list[Path]:
    """The tables into ``out_dir``, the figures into ``img_dir`` (unless None); the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = [c for c in results[0] if c != "histogram"]
    paths = [out_dir / "sim.csv", out_dir / "sim.md", out_dir / "sim-histogram.csv"]
    with paths[0].open("w", newline="") as f:
        table = csv.DictWriter(f, columns, extrasaction="ignore")
        table.writeheader()
        table.writerows(results)
    paths[1].write_text(markdown(results))
    with paths[2].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["panel", "nodes", "peeks", "lag", "rank_error", "pops"])
        for r in results:
            if r["panel"] == "distribution":
                for value, count in enumerate(r["histogram"]):
                    rank_error = value if value < HIST_MAX else f">={HIST_MAX}"
                    w.writerow([r["panel"], r["nodes"], r["peeks"], r["lag"], rank_error, count])
    if img_dir is not None:
        from .plots import figures

        paths += figures(results, img_dir)
    return paths


MD_PARAMS = ("panel", "policy", "nodes", "peeks", "lag", "consumers", "second_best", "priorities", "pops")
MD_COLUMNS = (*MD_PARAMS, *FIGURE_COLUMNS)


def markdown(results: list[dict]) -> str:
    """The results as one markdown table (``-`` where a closed form does not apply)."""
    lines = ["| " + " | ".join(MD_COLUMNS) + " |", "|" + "---|" * len(MD_COLUMNS)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in MD_COLUMNS) + " |" for r in results]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)
