"""The peek-k-pop-one queue, simulated: ``simulate(Params(...)) -> Result``, the rank error (PEI)
of each pop counted exactly against a sorted list of every waiting key; the client strategies
(``POLICIES``) and the closed forms it is checked against. docs/relaxed.md ("The simulator")."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import asdict, dataclass, field
from itertools import repeat

import numpy as np
from sortedcontainers import SortedList

from ..storage.checks import count

RANK_SHIFT = 40  # ranks:R keys are rank << 40 | sequence: FIFO within a rank, 2^40 adds
BLOCK = 4096  # random draws made per numpy call (per kind)
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Policy:
    """How a strategy inserts and pops (the simulator's loop reads these fields)."""

    name: str
    insert: str  # "random", or into the "worst-top" / "best-top" of k peeked subqueues
    pop_peeks: bool  # pop the best-topped of k peeked subqueues (else a random non-empty one)
    distinct: bool  # the k peeked subqueues are distinct (else drawn with replacement)
    summary: str


POLICIES = {
    p.name: p
    for p in (
        Policy("peek-before-pop", "random", True, True, "insert random; pop the best of k distinct peeks"),
        Policy("peek-before-add", "worst-top", False, True, "insert into the worst-topped of k peeks; pop random"),
        Policy("peek-before-add-best", "best-top", False, True, "insert into the best-topped of k peeks; pop random"),
        Policy("no-peek", "random", False, True, "insert random; pop random"),
        Policy("multiqueue", "random", True, False, "insert random; pop the best of k peeks with replacement"),
    )
}


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


@dataclass(frozen=True)
class Params:
    """One simulation. ``pops`` deliveries are measured after ``warmup`` unmeasured ones.
    ``priorities``: ``uniform`` (distinct reals), ``fifo`` (each entry worse than every earlier
    one) or ``ranks:R`` (a random rank, then publish order; ``rank_only``: a tie is no error)."""

    nodes: int = 20
    peeks: int = 2
    lag: int = 10_000
    consumers: int = 1
    policy: str = "peek-before-pop"
    second_best: bool = False
    priorities: str = "uniform"
    rank_only: bool = False
    pops: int = 50_000
    warmup: int | None = None  # None: max(lag, 1,000), for the waiting keys to settle
    seed: int = 0

    def __post_init__(self):
        for name in ("nodes", "peeks", "lag", "consumers", "pops"):
            count(name, getattr(self, name), none=False)
        count("warmup", self.warmup, low=0)
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (known: {', '.join(POLICIES)})")
        pol = POLICIES[self.policy]
        if pol.distinct and self.peeks > self.nodes and (pol.pop_peeks or pol.insert != "random"):
            raise ValueError(
                f"peeks ({self.peeks}) must not exceed nodes ({self.nodes}): {self.policy} peeks distinct subqueues"
            )
        if not parse_priorities(self.priorities) and self.rank_only:
            raise ValueError(f"rank_only needs priorities 'ranks:R', not {self.priorities!r}")

    @property
    def warmup_pops(self) -> int:
        return max(self.lag, 1_000) if self.warmup is None else self.warmup


def multiqueue_params(n: int, pops: int = 400_000, seed: int = 0, warmup: int = 2_000) -> Params:
    """The MultiQueue as its theorem has it: 100 entries a subqueue, inserts that never overtake,
    pops from the better of two subqueues drawn independently."""
    return Params(
        nodes=n, peeks=2, lag=100 * n, policy="multiqueue", priorities="fifo", pops=pops, warmup=warmup, seed=seed
    )


def parse_priorities(text: str) -> int | None:
    """``uniform`` -> None, ``fifo`` -> 0, ``ranks:R`` -> R (R >= 1); else a ValueError."""
    if text == "uniform":
        return None
    if text == "fifo":
        return 0
    head, _, count = str(text).partition(":")
    if head == "ranks" and count.isdigit() and int(count) >= 1:
        return int(count)
    raise ValueError(f"priorities must be 'uniform', 'fifo' or 'ranks:R' with R >= 1, not {text!r}")


@dataclass
class Result:
    params: Params
    pei: np.ndarray  # one rank error per measured pop, in order
    extra_pops: int = 0  # second-best aborts (each one an extra pop and a put-back)
    retries: int = 0  # peeks repeated because the chosen subqueue(s) were empty
    stats: dict = field(init=False)  # mean, p50/p90/p99 (inverted CDF), max, share of pops with no error

    def __post_init__(self):
        pei = self.pei
        self.stats = {"mean": float(pei.mean()), "p_zero": float(np.mean(pei == 0)), "max": int(pei.max())}
        for p, v in zip(PERCENTILES, np.percentile(pei, PERCENTILES, method="inverted_cdf")):
            self.stats[f"p{p}"] = int(v)

    def row(self) -> dict:
        """Parameters and figures as one flat dict (a table row)."""
        return {
            **asdict(self.params),
            "warmup": self.params.warmup_pops,
            **self.stats,
            "extra_pops": self.extra_pops,
            "retries": self.retries,
        }


def _blocks(draw):
    """An endless iterator over the items of successive ``draw()`` lists."""
    while True:
        yield from draw()


def _peek_rows(rng, n: int, k: int, distinct: bool):
    """Endless lists of k subqueue indexes: distinct ones, or drawn with replacement."""
    if distinct and k >= n:
        yield from repeat(list(range(n)))
    if not distinct:
        yield from _blocks(lambda: rng.integers(0, n, (BLOCK, k)).tolist())
    rows = max(64, min(BLOCK, (1 << 20) // n))
    yield from _blocks(lambda: np.argpartition(rng.random((rows, n)), k - 1, axis=1)[:, :k].tolist())


def simulate(params: Params) -> Result:
    """Run one simulation (deterministic for given ``params``, seed included)."""
    p = params
    pol = POLICIES[p.policy]
    n, k, c = p.nodes, p.peeks, p.consumers
    ranks = parse_priorities(p.priorities)
    rng = np.random.default_rng(p.seed)
    heaps: list[list[float]] = [[] for _ in range(n)]  # keys: floats, or ints standing for ranks
    waiting = SortedList()  # every waiting key
    inf = float("inf")
    push, pop = heapq.heappush, heapq.heappop

    rand_queue = _blocks(lambda: rng.integers(0, n, BLOCK).tolist())
    peek_rows = _peek_rows(rng, n, k, pol.distinct)
    if ranks is None:
        keys = _blocks(lambda: rng.random(BLOCK).tolist())
    else:
        seq = iter(range(1 << RANK_SHIFT))
        if ranks == 0:
            keys = seq
        else:
            rank_draws = _blocks(lambda: (rng.integers(0, ranks, BLOCK) << RANK_SHIFT).tolist())
            keys = (r | s for r, s in zip(rank_draws, seq))
    floor_mask = ~((1 << RANK_SHIFT) - 1) if ranks and p.rank_only else None

    def add():
        key = next(keys)
        if pol.insert == "random":
            q = next(rand_queue)
        else:
            # an empty subqueue's top is +inf: first for worst-top, last for best-top
            tops = [(heaps[i][0] if heaps[i] else inf, i) for i in next(peek_rows)]
            q = (max if pol.insert == "worst-top" else min)(tops)[1]
        push(heaps[q], key)
        waiting.add(key)

    def peek():
        """(best queue, its top, second queue, its top) of k peeks; -1 / inf where none."""
        b1 = b2 = inf
        q1 = q2 = -1
        for i in next(peek_rows):
            h = heaps[i]
            if h:
                t = h[0]
                if t < b1:
                    b1, q1, b2, q2 = t, i, b1, q1
                elif t < b2 and i != q1:
                    b2, q2 = t, i
        return q1, b1, q2, b2

    def random_pop():
        while True:
            h = heaps[next(rand_queue)]
            if h:
                return pop(h)

    counts = {"extra": 0, "retries": 0}

    def peeked_pop(seen):
        q1, _, q2, b2 = seen
        while True:
            x = pop(heaps[q1]) if q1 >= 0 and heaps[q1] else None
            if p.second_best and q2 >= 0 and (x is None or x > b2):
                if x is not None:
                    push(heaps[q1], x)  # abort: back where it was
                    counts["extra"] += 1
                x = pop(heaps[q2]) if heaps[q2] else None
            if x is not None:
                return x
            counts["retries"] += 1
            q1, _, q2, b2 = peek()

    def deliver(x) -> int:
        i = waiting.bisect_left(x)
        error = waiting.bisect_left(x & floor_mask) if floor_mask else i
        del waiting[i]
        return error

    for _ in range(p.lag):
        add()
    # peeks not yet acted on: each one is popped on c - 1 ticks after it was made
    pending = deque(peek() for _ in range(c - 1)) if pol.pop_peeks else deque()
    warmup = p.warmup_pops
    pei = np.empty(p.pops, dtype=np.int64)
    for t in range(warmup + p.pops):
        if t == warmup:
            counts["extra"] = counts["retries"] = 0  # count the measured pops only
        add()
        if pol.pop_peeks:
            pending.append(peek())
            x = peeked_pop(pending.popleft())
        else:
            x = random_pop()
        error = deliver(x)
        if t >= warmup:
            pei[t - warmup] = error
    return Result(p, pei, counts["extra"], counts["retries"])
