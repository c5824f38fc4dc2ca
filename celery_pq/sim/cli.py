"""``python -m celery_pq.sim COMMAND``: ``run``, ``check``, ``predict``, ``sweep`` (docs/relaxed.md,
"How to rerun"). Bad values are one line, exit 2 (click's usage errors)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from .model import POLICIES, Params, multiqueue_mean_rank_error, multiqueue_params, simulate

CHECK_NODES = (4, 16, 64)
CHECK_POPS = 400_000


def _usage(make, *args, **kw):
    """``make(*args, **kw)``, its ValueError a usage error."""
    try:
        return make(*args, **kw)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(name="celery_pq.sim")
def main():
    """Simulate the relaxed priority queue: N subqueues, pops that peek k of them (docs/relaxed.md)."""


@main.command()
@click.option("--nodes", "-n", default=20, show_default=True, help="Subqueues.")
@click.option("--peeks", "-k", default=2, show_default=True, help="Subqueues peeked per pop (or add).")
@click.option("--lag", default=10_000, show_default=True, help="Entries waiting before each add.")
@click.option(
    "--consumers",
    "-c",
    default=1,
    show_default=True,
    help="Clients popping at once (a peek is consumers-1 pops old when its pop lands).",
)
@click.option("--policy", type=click.Choice(list(POLICIES)), default="peek-before-pop", show_default=True)
@click.option(
    "--second-best/--best-only",
    default=False,
    show_default=True,
    help="Keep a stale pop only if no worse than the second-best peek, else pop that.",
)
@click.option(
    "--priorities", default="uniform", show_default=True, help="uniform | fifo | ranks:R (celery-pq's ranks: R=256)."
)
@click.option(
    "--rank-only",
    is_flag=True,
    help="ranks:R: count strictly better ranks only (not earlier entries of the same rank).",
)
@click.option("--pops", default=50_000, show_default=True, help="Measured pops.")
@click.option("--warmup", type=int, default=None, help="Unmeasured pops first [max(lag, 1000)].")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the row as JSON.")
def run(as_json, **kw):
    """One simulation: the rank error's mean, percentiles, max and share of zeros."""
    started = time.perf_counter()
    result = simulate(_usage(Params, **kw))
    row = result.row() | {"seconds": round(time.perf_counter() - started, 2)}
    if as_json:
        click.echo(json.dumps(row))
        return
    s = result.stats
    click.echo(
        f"{kw['policy']}: {kw['nodes']} nodes, {kw['peeks']} peeks, lag {kw['lag']}, "
        f"{kw['consumers']} consumer(s), second-best {'on' if kw['second_best'] else 'off'}, "
        f"{kw['priorities']} priorities, {kw['pops']} pops"
    )
    click.echo(
        f"rank error: mean {s['mean']:.2f}  p50 {s['p50']}  p90 {s['p90']}  p99 {s['p99']}  "
        f"max {s['max']}  P(0) {s['p_zero']:.2%}"
    )
    click.echo(f"extra pops (second-best) {result.extra_pops}, retries {result.retries}, {row['seconds']} s")


@main.command()
@click.option("--nodes", "-n", "nodes", multiple=True, type=int, default=CHECK_NODES, show_default=True)
@click.option("--pops", default=CHECK_POPS, show_default=True)
@click.option("--seed", default=0, show_default=True)
def check(nodes, pops, seed):
    """The MultiQueue's mean rank error against (5/6)n - 1 + 1/(6n) (a markdown table)."""
    click.echo("| n | simulated mean | closed form | difference |\n|---|---|---|---|")
    for n in nodes:
        mean = simulate(_usage(multiqueue_params, n, pops, seed)).stats["mean"]
        exact = multiqueue_mean_rank_error(n)
        click.echo(f"| {n} | {mean:.3f} | {exact:.3f} | {100 * (mean / exact - 1):+.2f}% |")


@main.command()
@click.argument("nodes", type=int)
@click.argument("peeks", type=int)
@click.option("--consumers", "-c", default=1, show_default=True)
@click.option("--lag", default=1_000, show_default=True)
@click.option("--priorities", default="ranks:256", show_default=True)
@click.option("--rank-only", is_flag=True, help="Count strictly better ranks only.")
@click.option("--second-best/--best-only", default=True, show_default=True)
@click.option("--pops", default=20_000, show_default=True)
def predict(nodes, peeks, **kw):
    """What a sharded queue of NODES shards peeking PEEKS should show (JSON)."""
    from . import predict as predicted

    click.echo(json.dumps(_usage(predicted, nodes, peeks, **kw)))


def _directory(flag: str, name: str, default: str, what: str):
    kind = click.Path(file_okay=False, path_type=Path)
    return click.option(flag, name, type=kind, default=Path(default), show_default=True, help=f"Where {what} go.")


@main.command()
@click.option("--spark", is_flag=True, help="Run the grid as a Spark job (local mode).")
@click.option("--quick", is_flag=True, help="A small grid (seconds), for tests and a first look.")
@_directory("--out", "out_dir", "benchmarks/results", "sim.csv, sim.md and sim-histogram.csv")
@_directory("--img", "img_dir", "docs/img", "the relaxed-*.png")
@click.option("--no-plots", is_flag=True, help="Write the tables only.")
@click.option("--seed", default=1, show_default=True)
def sweep(spark, quick, out_dir, img_dir, no_plots, seed):
    """The parameter sweep (nodes, peeks, lag, consumers, strategy, second-best): table and figures."""
    from .sweep import grid, run_row, run_spark, write

    rows = grid(quick=quick, seed=seed)
    started = time.perf_counter()
    results = run_spark(rows) if spark else [run_row(row) for row in rows]
    paths = write(results, out_dir, None if no_plots else img_dir)
    click.echo(
        f"{len(rows)} simulations in {time.perf_counter() - started:.0f} s "
        f"({'Spark, local mode' if spark else 'this process'})"
    )
    for path in paths:
        click.echo(f"wrote {path}")
