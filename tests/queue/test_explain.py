"""explain() is checked against Redis's own command statistics (INFO commandstats)."""

from collections import Counter

import pytest

from celery_pq import Item
from celery_pq.storage.costs import READ_COMMANDS, WRITE_COMMANDS, explain

COUNTED = READ_COMMANDS | WRITE_COMMANDS | {"time"}


def commandstats(client) -> Counter:
    stats = client.info("commandstats")
    out = Counter()
    for name, row in stats.items():
        cmd = name.removeprefix("cmdstat_").lower()
        if cmd in COUNTED:
            out[cmd] = row["calls"]
    return out


def measured(client, fn) -> Counter:
    before = commandstats(client)
    fn()
    after = commandstats(client)
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k]})


def stale_in_front(q, k, priority):
    """k entries ahead of the rest, removed by id (technique S leaves their index members)."""
    for i in range(k):
        q.insert(b"s", priority, id=f"stale{i}")
        q.remove(f"stale{i}")


SCENARIOS = {
    # op: (setup(q, k) -> state, action(q, state))
    "insert": (lambda q, k: q.insert(b"x", 1, id="first"), lambda q, s: q.insert(b"y", 1, id="second")),
    "pop": (
        lambda q, k: (stale_in_front(q, k, 9), q.insert_many([Item(b"x", 1, f"e{i}") for i in range(3)])),
        lambda q, s: q.pop(1),
    ),
    "ack": (lambda q, k: (q.insert_many([Item(b"x", 1), Item(b"y", 1)]), q.pop(1)[0])[1], lambda q, s: q.ack(s)),
    "extend": (lambda q, k: (q.insert(b"x", 1), q.pop(1)[0])[1], lambda q, s: q.extend([s])),
    "requeue": (
        lambda q, k: (q.insert_many([Item(b"x", 1), Item(b"y", 1)]), q.pop(1)[0])[1],
        lambda q, s: q.requeue(s),
    ),
    "remove_by_id": (lambda q, k: q.insert_many([Item(b"x", 1, "a"), Item(b"y", 1, "b")]), lambda q, s: q.remove("a")),
    "change_priority": (
        lambda q, k: q.insert_many([Item(b"x", 1, "a"), Item(b"y", 1, "b")]),
        lambda q, s: q.change_priority("a", 200),
    ),
    "retrieve_highest_priority": (
        lambda q, k: (stale_in_front(q, k, 9), q.insert(b"x", 1, id="a")),
        lambda q, s: q.peek(1),
    ),
    "retrieve_by_priority": (
        lambda q, k: (stale_in_front(q, k, 1), q.insert(b"x", 1, id="a")),
        lambda q, s: q.retrieve_by_priority(1),
    ),
    "remove_highest_priority": (
        lambda q, k: (stale_in_front(q, k, 9), q.insert_many([Item(b"x", 1), Item(b"y", 1)])),
        lambda q, s: q.remove_highest_priority(),
    ),
}


def test_every_operation_has_a_scenario():
    assert set(explain()) == set(SCENARIOS)


@pytest.mark.parametrize("op", sorted(SCENARIOS))
@pytest.mark.parametrize("technique,stale", [("T", 0), ("S", 0), ("S", 3)])
def test_explain_matches_commandstats(redis_client, make_pq, op, technique, stale):
    q = make_pq(f"x-{op}", technique=technique)
    setup, action = SCENARIOS[op]
    state = setup(q, stale)
    seen = measured(redis_client, lambda: action(q, state))
    cost = explain(stale=stale)[op][technique]
    assert dict(seen) == cost["commands"]
    assert sum(seen[c] for c in READ_COMMANDS) == cost["reads"]
    assert sum(seen[c] for c in WRITE_COMMANDS) == cost["writes"]


def test_technique_s_trades_a_cheaper_remove_for_lazy_work_later():
    e0, e3 = explain(0), explain(3)
    s, t = e0["remove_by_id"]["S"], e0["remove_by_id"]["T"]
    # (one write of each is the counter of removed entries)
    assert s["writes"] == 2 and t["writes"] == 4 and s["reads"] < t["reads"]
    assert e0["pop"]["S"] == e0["pop"]["T"]
    # each stale pointer in front costs the pop a look at the ranks, an entry read and a check
    # that its list still exists (3 reads) and its own LPOP (1 write)
    assert e3["pop"]["S"]["reads"] == e0["pop"]["T"]["reads"] + 3 * 3
