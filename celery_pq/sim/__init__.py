"""A simulator of the relaxed priority queue (N subqueues, each pop peeking k and popping the best):
``simulate(Params(...)).stats``, ``predict(...)`` for a sharded queue, ``python -m celery_pq.sim``.
Needs the ``[sim]`` extra (the sweep's Spark mode and figures ``[spark]``); docs/relaxed.md."""

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
    """The rank error a sharded queue of ``nodes`` shards should show, ``peeks`` peeked per pop (all
    when more than ``nodes``), ``consumers`` popping at once, ``lag`` entries waiting: ``{"mean", "p50",
    "p90", "p99", "max", "p_zero"}`` of one seeded peek-before-pop simulation of ``pops`` deliveries
    (docs/relaxed.md, "Predicting a sharded queue")."""
    every_argument = dict(locals(), peeks=min(peeks, nodes))  # each is a field of Params
    return simulate(Params(policy="peek-before-pop", **every_argument)).stats
