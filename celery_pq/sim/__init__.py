"""A simulator of the relaxed priority queue (N subqueues, each pop peeking k and popping the
best): ``simulate(Params(...)).stats``, ``predict(...)`` for a sharded queue, and ``python -m
celery_pq.sim``. Needs the ``[sim]`` extra (the sweep's Spark mode and figures ``[spark]``);
``import celery_pq`` never imports it. docs/relaxed.md ("The simulator") explains the model.
"""

from __future__ import annotations

from .model import POLICIES, Params, Result, multiqueue_mean_rank_error, p_zero_fresh_peek, simulate

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
    """The rank error a sharded queue of ``nodes`` shards should show, ``peeks`` peeked per pop
    (all when more than ``nodes``), ``consumers`` popping at once, ``lag`` entries waiting:
    ``{"mean", "p50", "p90", "p99", "max", "p_zero"}`` of one seeded peek-before-pop simulation
    of ``pops`` deliveries. The defaults and what the model leaves out: docs/relaxed.md
    ("Predicting a sharded queue").
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
