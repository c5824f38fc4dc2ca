"""benchmarks/ab.py's pure parts: the figures it reads from each benchmark's JSON (the files the
last full run left in benchmarks/results), the verdict on a ratio, and the table made of the runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import ab

RESULTS = Path(ab.__file__).resolve().parent / "results"


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("throughput", {"publish", "consume_prefetch_1", "consume_prefetch_10"}),
        (
            "celery_e2e",
            {
                *(f"Celery {row}" for row in ("solo", "prefork-2", "solo, late acks", "solo, Celery defaults")),
                *(f"Celery {row}, of memory://" for row in ("solo", "solo, late acks", "solo, Celery defaults")),
            },
        ),
        ("latency", {"p50", "p99", "p50 (Celery worker)", "p99 (Celery worker)"}),
        ("memory_tasks", {"small task", "medium task", "large task"}),
    ],
)
def test_figures_are_read_from_what_each_benchmark_writes(name, labels):
    data = json.loads((RESULTS / f"{name}.json").read_text())
    figures = ab.BENCHMARKS[name][2](data)
    assert set(figures) == labels
    for unit, better, value, reference in figures.values():
        assert unit and better in (ab.HIGHER, ab.LOWER) and value > 0 and reference > 0
    if name in ("throughput", "celery_e2e"):  # the module's own ratio is celery-pq over kombu-redis
        _, _, value, reference = next(iter(figures.values()))
        assert value / reference == pytest.approx(next(iter(data["results"].values()))["ratio"])


def test_fairness_figures_are_its_ratios():
    s = {
        "quiet_p99_flood_ms": 3.0,
        "quiet_p99_calm_ms": 2.0,
        "pop_ack_us_many_tenants": 300.0,
        "pop_ack_us_5_tenants": 250.0,
        "pop_ack_redis_us_many_tenants": 70.0,
        "pop_ack_redis_us_5_tenants": 60.0,
    }
    figures = ab.BENCHMARKS["fairness"][2]({"summary": s})
    assert [v / r for _, _, v, r in figures.values()] == [1.5, 1.2, 70 / 60]


@pytest.mark.parametrize(
    ("after", "better", "expected"),
    [
        ([2.0, 2.1, 2.2], ab.HIGHER, "within"),
        ([1.0, 3.0, 3.0], ab.HIGHER, "better"),  # the median, not each value, is held to the spread
        ([1.0, 1.0, 3.0], ab.HIGHER, "worse"),
        ([3.0], ab.LOWER, "worse"),
        ([1.0], ab.LOWER, "better"),
        ([1.5], ab.LOWER, "within"),  # the spread's ends belong to it
    ],
)
def test_verdict_places_the_after_median_against_the_before_spread(after, better, expected):
    assert ab.verdict([1.5, 2.5, 2.0], after, better) == expected


def _fig(before, after, better=ab.HIGHER):
    """A figure's runs: each side's celery-pq values against a reference of 100 in every run."""
    side = lambda values: {"values": values, "references": [100.0] * len(values)}  # noqa: E731
    return {"unit": "msg/s", "better": better, "before": side(before), "after": side(after)}


def test_summarize_gives_medians_spreads_and_ratios():
    s = ab.summarize(_fig([200.0, 180.0, 220.0], [260.0, 240.0, 250.0]))
    assert s["before"]["value"] == {"median": 200.0, "min": 180.0, "max": 220.0}
    assert s["after"]["ratio"] == {"median": 2.5, "min": 2.4, "max": 2.6}
    assert s["verdict"] == "better"


def test_markdown_has_one_table_per_benchmark_and_a_row_per_figure():
    figs = {"publish": _fig([200.0, 210.0], [206.0, 200.0]), "consume": _fig([1000.0, 1200.0], [900.0, 950.0])}
    for fig in figs.values():
        fig["summary"] = ab.summarize(fig)
    data = {
        "before": {"tree": "50c574e", "celery_pq": "/tmp/x/celery_pq/__init__.py"},
        "after": {"tree": "this worktree", "celery_pq": "/w/celery_pq/__init__.py"},
        "repeat": 2,
        "smoke": False,
        "benchmarks": {
            "throughput": {
                "against": ab.KOMBU,
                "seconds": {"before": [20.0, 22.0], "after": [21.0, 21.0]},
                "figures": figs,
            }
        },
    }
    md = "\n".join(ab.markdown(data))
    assert md.count("## ") == 1 and "Seconds per run: before 21, after 21." in md
    assert (
        "| publish | msg/s | higher | 205 (200..210) | 203 (200..206) | 2.05 (2.00..2.10) | 2.03 (2.00..2.06) |"
        " within |" in md
    )
    assert (
        "| consume | msg/s | higher | 1,100 (1,000..1,200) | 925 (900..950) | 11.00 (10.00..12.00) |"
        " 9.25 (9.00..9.50) | worse |" in md
    )
    assert "Smoke" not in md
