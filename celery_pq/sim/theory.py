"""The closed forms the simulator is checked against (docs/relaxed.md, "The simulator against the
theory" and "Where ours differ, and why")."""

from __future__ import annotations


def multiqueue_mean_rank_error(n: int) -> float:
    """The MultiQueue's long-run expected rank error on a deep queue of ``n`` subqueues,
    ``(5/6) n - 1 + 1/(6 n)`` (Walzer and Williams, ESA 2025; arXiv:2410.08714)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n!r}")
    return 5 * n / 6 - 1 + 1 / (6 * n)


def p_zero_fresh_peek(n: int, k: int) -> float:
    """P(rank error = 0) for k distinct fresh peeks among n non-empty subqueues, with distinct
    priorities: k / n, whatever the lag."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, not k={k!r}, n={n!r}")
    return k / n
