"""What theory says the simulator must find.

- The MultiQueue (insert into a random subqueue; pop the better top of two subqueues drawn
  independently, possibly the same one), with a deep queue: the long-run expected rank error is
  exactly ``(5/6) n - 1 + 1/(6 n)`` for n subqueues (Walzer and Williams, "A Simple yet Exact
  Analysis of the MultiQueue", ESA 2025; arXiv:2410.08714).
- Peek-before-pop with k distinct peeks and a fresh peek: a pop has no error exactly when the
  subqueue holding the best waiting entry is among the k peeked, so P(rank error = 0) = k / n
  (with distinct priorities and no empty subqueue), whatever the lag.
"""

from __future__ import annotations


def multiqueue_mean_rank_error(n: int) -> float:
    """The MultiQueue's expected long-run rank error for ``n`` subqueues."""
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n!r}")
    return 5 * n / 6 - 1 + 1 / (6 * n)


def p_zero_fresh_peek(n: int, k: int) -> float:
    """P(rank error = 0) for k distinct fresh peeks among n non-empty subqueues."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, not k={k!r}, n={n!r}")
    return k / n
