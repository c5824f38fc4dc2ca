"""A simulator of the relaxed priority queue: one queue split into N subqueues, inserts spread
over them, and each pop peeking k subqueues and popping the best (docs/relaxed.md).

    from celery_pq.sim import Params, simulate, predict

    simulate(Params(nodes=20, peeks=2, lag=10_000)).stats   # {'mean': ..., 'p50': ..., ...}
    predict(16, 2, consumers=4, lag=1_000)                  # what a sharded queue should show

``python -m celery_pq.sim --help`` runs single simulations, the check against the MultiQueue's
closed form, and the parameter sweep (locally or as a Spark job) that writes the tables and
figures of docs/relaxed.md. Needs numpy and sortedcontainers (the ``[sim]`` extra); the sweep's
Spark mode and figures need the ``[spark]`` extra. ``import celery_pq`` never imports this.

Modules: ``policies`` (the strategies by name), ``model`` (the simulation), ``theory`` (closed
forms it is checked against), ``sweep`` (the grid, run locally or on Spark, and its outputs),
``plots`` (the figures), ``cli``.
"""

from __future__ import annotations

from .model import Params, Result, simulate
from .policies import POLICIES
from .theory import multiqueue_mean_rank_error, p_zero_fresh_peek

__all__ = ["POLICIES", "Params", "Result", "multiqueue_mean_rank_error", "p_zero_fresh_peek", "predict", "simulate"]


def predict(
    nodes: int,
    peeks: int = 2,
    consumers: int = 1,
    lag: int = 1_000,
    *,
    second_best: bool = True,
    priorities: str = "ranks:256",
    rank_only: bool = False,
    pops: int = 20_000,
    seed: int = 0,
) -> dict:
    """The rank error a sharded queue should show: ``nodes`` shards, ``peeks`` shards peeked per
    pop, ``consumers`` clients popping at once, ``lag`` entries waiting before each publish.

    Returns ``{"mean", "p50", "p90", "p99", "max", "p_zero"}`` from one peek-before-pop
    simulation of ``pops`` deliveries. ``peeks`` above ``nodes`` peek every shard. Priorities
    default to celery-pq's 256 ranks drawn uniformly, publish order breaking ties, and the error
    counts every waiting entry ahead in that order, as benchmarks/relaxed.py does
    (``rank_only=True``: only strictly better ranks, as the event log's analysis counts;
    ``priorities="uniform"``: distinct priorities, as in the paper). The consumers are taken to
    be desynchronised, a peek ``consumers - 1`` pops old when its pop lands (docs/relaxed.md says
    what the model leaves out).
    """
    return simulate(
        Params(
            nodes=nodes,
            peeks=min(peeks, nodes),
            lag=lag,
            consumers=consumers,
            policy="peek-before-pop",
            second_best=second_best,
            priorities=priorities,
            rank_only=rank_only,
            pops=pops,
            seed=seed,
        )
    ).stats
