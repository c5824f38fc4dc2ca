"""The client strategies the simulator compares, by name (``POLICIES``): how each places an entry
and chooses a subqueue to pop. docs/relaxed.md ("The simulator", "Where ours differ, and why")
has the table and why peek-before-add means the worst-topped subqueue.
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
