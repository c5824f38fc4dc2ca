"""The client strategies the simulator compares, by name, and how each one places an entry and
chooses a subqueue to pop.

- ``peek-before-pop``  insert into a random subqueue; pop peeks ``k`` distinct random subqueues
                       and pops the one whose top is best (the relaxed queue's strategy)
- ``peek-before-add``  insert into the subqueue whose top is *worst* among ``k`` distinct random
                       ones (an empty one first); pop a random non-empty subqueue
- ``peek-before-add-best``  the same, into the subqueue whose top is *best* (an empty one last)

The paper describes peek-before-add as "adding new element to the peeked queue with the highest
top priority"; with lower numbers meaning higher priority that phrase reads both ways. The
worst-top reading is the one whose results keep the paper's order (it beats no peek), so it
carries the name; the best-top reading is kept to show that it does not (docs/relaxed.md).
- ``no-peek``          insert into a random subqueue; pop a random non-empty subqueue
- ``multiqueue``       insert into a random subqueue; pop the better of ``k`` (2 in the
                       theory) subqueues drawn independently, so possibly the same one twice

Only a peek before the pop can be stale (``consumers`` > 1): inserts and random pops read no
state that another consumer could change in between.
"""

from __future__ import annotations

from dataclasses import dataclass


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


def policy(name: str) -> Policy:
    """The policy called ``name``, or a ValueError listing the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
