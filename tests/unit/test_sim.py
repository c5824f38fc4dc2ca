"""The relaxed queue's simulator (celery_pq.sim) against what theory fixes exactly, the paper's
orderings, its bad-input errors, and ``predict`` as the sharded queue's benchmark calls it.

The statistical tests run with fixed seeds, so each one is deterministic; the tolerances are
chosen so that a correct simulator would pass with nearly any seed (each test says how sure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from celery_pq.sim import Params, multiqueue_mean_rank_error, predict, simulate
from celery_pq.sim.cli import main, multiqueue_params
from celery_pq.sim.sweep import grid, markdown, run_row, write


@pytest.mark.parametrize("n", [4, 16, 64])
def test_multiqueue_mean_rank_error_matches_the_closed_form_within_2_percent(n):
    # 300,000 pops of a queue 100 entries deep per subqueue. Over 8 seeds at 400,000 pops the
    # estimate's standard deviation was 0.45% (n=4), 0.31% (n=16), 0.40% (n=64) of the closed
    # form, so at most about 0.52% at this length: 2% is more than 3.8 standard deviations, and
    # a correct simulator fails one of the three cases for fewer than 1 seed in 1,000.
    mean = simulate(multiqueue_params(n, pops=300_000, seed=0)).stats["mean"]
    exact = multiqueue_mean_rank_error(n)
    assert abs(mean / exact - 1) < 0.02, (n, mean, exact)


def test_closed_form_values():
    assert multiqueue_mean_rank_error(1) == pytest.approx(0)
    assert multiqueue_mean_rank_error(4) == pytest.approx(5 * 4 / 6 - 1 + 1 / 24)
    with pytest.raises(ValueError, match="n must be >= 1"):
        multiqueue_mean_rank_error(0)


def test_fresh_peeks_find_the_best_entry_k_in_n_times():
    # The pop has no error exactly when the best entry's subqueue is among the k peeked: i.i.d.
    # Bernoulli(k/n) per pop. sd = sqrt(0.1 * 0.9 / 40,000) = 0.0015; 0.006 is 4 sd.
    result = simulate(Params(nodes=20, peeks=2, lag=2_000, pops=40_000, seed=5))
    assert abs(result.stats["p_zero"] - 0.1) < 0.006


@pytest.mark.parametrize(
    "kw",
    [
        {"nodes": 1, "peeks": 1, "consumers": 4},  # one subqueue is a strict queue
        {"nodes": 8, "peeks": 8},  # peeking all of them is strict too
        {"nodes": 8, "peeks": 2, "priorities": "ranks:1", "rank_only": True},  # one rank: no better rank
    ],
)
def test_strict_cases_have_no_rank_error(kw):
    result = simulate(Params(lag=200, pops=2_000, **kw))
    assert result.stats["max"] == 0


def test_peek_before_pop_beats_peek_before_add_which_beats_no_peek():
    # The paper's figure 3 at 20 nodes, 2 peeks, lag 1,000 (means about 13, 39 and 66 here).
    means = {
        policy: simulate(Params(nodes=20, peeks=2, lag=1_000, pops=10_000, policy=policy, seed=2)).stats["mean"]
        for policy in ("peek-before-pop", "peek-before-add", "no-peek")
    }
    assert means["peek-before-pop"] * 2 < means["peek-before-add"] < means["no-peek"]


def test_second_best_check_at_least_halves_the_error_of_stale_peeks():
    # 8 consumers acting on peeks 7 pops old (means about 33 without the check, 15 with it).
    off, on = (
        simulate(Params(nodes=50, peeks=5, lag=2_000, consumers=8, second_best=sb, pops=10_000, seed=3))
        for sb in (False, True)
    )
    assert on.stats["mean"] < 0.6 * off.stats["mean"]
    assert on.stats["p99"] < off.stats["p99"]
    assert on.extra_pops > 0 and off.extra_pops == 0


def test_stale_peeks_cost_rank_error():
    one, many = (simulate(Params(nodes=20, peeks=2, lag=1_000, consumers=c, pops=10_000, seed=4)) for c in (1, 16))
    assert many.stats["mean"] > 1.5 * one.stats["mean"]


def test_same_params_same_result():
    a, b = (simulate(Params(nodes=10, peeks=2, lag=300, consumers=3, pops=3_000, seed=9)) for _ in range(2))
    assert np.array_equal(a.pei, b.pei)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"nodes": 0}, "nodes must be an integer >= 1"),
        ({"peeks": 1.5}, "peeks must be an integer >= 1"),
        ({"lag": True}, "lag must be an integer >= 1"),
        ({"nodes": 4, "peeks": 5}, r"peeks \(5\) must not exceed nodes \(4\)"),
        ({"policy": "peek-twice"}, "unknown policy 'peek-twice' .known: peek-before-pop"),
        ({"priorities": "ranks:0"}, "priorities must be 'uniform', 'fifo' or 'ranks:R'"),
        ({"priorities": "normal"}, "priorities must be"),
        ({"warmup": -1}, "warmup must be an integer >= 0 or None, got -1"),
        ({"rank_only": True}, "rank_only needs priorities 'ranks:R', not 'uniform'"),
    ],
)
def test_bad_params_say_what_is_wrong(kw, message):
    with pytest.raises(ValueError, match=message):
        Params(**kw)


def test_ranks_count_earlier_ties_unless_rank_only():
    # one rank and publish order: the queue is FIFO, and a pop from the wrong subqueue has
    # earlier entries of its rank ahead of it; rank_only counts none of them
    by_order, by_rank = (
        simulate(Params(nodes=8, peeks=2, lag=200, pops=2_000, priorities="ranks:1", rank_only=r))
        for r in (False, True)
    )
    assert by_order.stats["mean"] > 1 and by_rank.stats["max"] == 0
    # 256 ranks at lag 2,000 (about 8 entries a rank): ties are a small part of the error
    by_order, by_rank = (
        simulate(Params(nodes=8, peeks=2, lag=2_000, pops=5_000, priorities="ranks:256", rank_only=r))
        for r in (False, True)
    )
    assert 0.5 * by_order.stats["mean"] < by_rank.stats["mean"] < by_order.stats["mean"]


def test_multiqueue_may_peek_more_than_there_are_subqueues():
    # drawn with replacement, so k > n is meaningful (and n = 1 is a strict queue)
    assert simulate(Params(nodes=1, peeks=2, lag=100, pops=500, policy="multiqueue")).stats["max"] == 0


def test_predict_gives_ordered_percentiles_that_grow_with_the_shards():
    small, large = predict(4, 2, consumers=2, lag=400), predict(16, 2, consumers=2, lag=1_600)
    for p in (small, large):
        assert set(p) == {"mean", "p50", "p90", "p99", "max", "p_zero"}
        assert 0 <= p["p50"] <= p["p90"] <= p["p99"] <= p["max"]
        assert 0 <= p["p_zero"] <= 1
    assert large["mean"] > 2 * small["mean"]
    assert predict(4, 2, consumers=2, lag=400) == small  # seeded: repeatable
    # one shard is a strict queue whatever the consumers; k above N peeks every shard
    assert predict(1, 2, consumers=8, lag=100)["max"] == 0
    assert predict(2, 4, lag=100)["max"] == 0


def test_predict_second_best_helps_many_consumers():
    on = predict(16, 2, consumers=16, lag=2_000, second_best=True)
    off = predict(16, 2, consumers=16, lag=2_000, second_best=False)
    assert on["mean"] < off["mean"]


def test_cli_run_check_and_predict():
    runner = CliRunner()
    out = runner.invoke(main, ["run", "-n", "8", "-k", "2", "--lag", "200", "--pops", "1000"])
    assert out.exit_code == 0, out.output
    assert "rank error: mean" in out.output and "P(0)" in out.output
    out = runner.invoke(main, ["check", "-n", "4", "--pops", "20000"])
    assert out.exit_code == 0 and "| 4 |" in out.output and "2.375" in out.output
    out = runner.invoke(main, ["predict", "4", "2", "-c", "2", "--lag", "200", "--pops", "1000"])
    assert out.exit_code == 0 and '"p99"' in out.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "-n", "4", "-k", "6"], "peeks (6) must not exceed nodes (4)"),
        (["run", "--priorities", "zipf"], "priorities must be"),
        (["run", "--policy", "random"], "Invalid value for '--policy'"),
        (["predict", "0", "2"], "nodes must be an integer >= 1"),
    ],
)
def test_cli_bad_values_are_one_line_errors(args, message):
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2
    assert message in out.output


def test_sweep_rows_write_a_table_histogram_and_figures(tmp_path):
    rows = [r for r in grid(quick=True) if r["panel"] in ("distribution", "multiqueue")][:2]
    results = [run_row(r) for r in rows]
    paths = write(results, tmp_path / "out", tmp_path / "img")
    names = {p.name for p in paths}
    assert {"sim.csv", "sim.md", "sim-histogram.csv", "relaxed-distribution.png", "relaxed-multiqueue.png"} <= names
    table = (tmp_path / "out" / "sim.md").read_text()
    assert table.count("\n") == 2 + len(results) and "| distribution |" in table
    dist = results[0]
    assert sum(dist["histogram"]) == dist["pops"]
    assert math.isclose(dist["theory_p_zero"], 0.1)
    assert math.isnan(dist["theory_mean"]) and "| - |" in markdown(results)
    assert (tmp_path / "img" / "relaxed-distribution.png").read_bytes()[:4] == b"\x89PNG"
