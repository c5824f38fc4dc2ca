"""The cost table: Redis reads and writes each queue operation runs, per technique.

The patent's cost explanation, on the steady path: one entry, a new id, a wake token already
waiting, no dead-lettering, and (technique S) ``stale`` priority-index members whose entry was
removed by id lying in front of the one retrieved. tests/lua/test_explain.py checks these counts
against Redis's own INFO commandstats; docs/priorities.md shows them.
"""

from __future__ import annotations

from collections import Counter


def explain(stale: int = 0) -> dict:
    """{operation: {technique: {"reads": n, "writes": n, "commands": {command: n}}}} (see above)."""
    return {op: {t: _cost(cmds) for t, cmds in by_t.items()} for op, by_t in _commands(stale).items()}


READ_COMMANDS = frozenset(
    {
        "hget",
        "hexists",
        "hkeys",
        "hlen",
        "llen",
        "lrange",
        "lindex",
        "zcard",
        "zrange",
        "zrangebyscore",
        "zrangebylex",
        "zscore",
        "get",
        "exists",
        "mget",
    }
)
WRITE_COMMANDS = frozenset(
    {
        "hset",
        "hsetnx",
        "hdel",
        "zadd",
        "zrem",
        "zpopmin",
        "incr",
        "rpush",
        "lpop",
        "linsert",
        "lrem",
        "del",
        "set",
        "hincrby",
    }
)


def _cost(cmds: list[str]) -> dict:
    c = Counter(cmds)
    return {
        "reads": sum(n for cmd, n in c.items() if cmd in READ_COMMANDS),
        "writes": sum(n for cmd, n in c.items() if cmd in WRITE_COMMANDS),
        "commands": dict(sorted(c.items())),
    }


def _commands(stale: int) -> dict:
    """The Redis commands each script runs on the steady path (see ``explain``)."""
    k = stale
    both = lambda cmds: {"T": cmds, "S": cmds}  # noqa: E731
    lead = ["zrem"] if k else []  # the stale pointers' own priority list runs empty
    # the pointer is current; the lease is written if the entry has none (HSETNX: the lease
    # check and the write in one), and the sweep record started (SET NX: a pop that acked a
    # lease first skips it)
    grant = ["time", "hsetnx", "zadd", "set"]
    md = ["get"]  # every script but extend first reads the queue's mode record
    # A rank's score in pi says whether a compaction pass of it is under way (its front list
    # comes first): read with the rank by a pop, else with one ZSCORE.
    passing = ["zscore"]
    ct = ["hincrby"]  # the counter of what the call did (hash ct), once per call
    # An insert whose publish id the client made, on its first send: one MGET reads the mode
    # record, the views registry's version and the publish-id window's start; the publish id
    # is only recorded (answered ones are forgotten in batches of FORGET_BATCH: two more
    # commands every 32 inserts). Sent again, it is first looked for in both windows (two
    # HGETs); one with a publish id of the caller's and no length limit looks in the last
    # window and records it in this one with one HSETNX ("hget", "hsetnx" for "hset").
    return {
        # the entry stored with HSETNX (an id in use takes free_id's way)
        "insert": both(["mget", "time", "incr", "hsetnx", "rpush", "hset", "llen", *ct]),
        "pop": {  # more waits behind it (the last rank list taken from is not empty): no ZCARD
            "T": [*md, "zrange", "lpop", "exists", "hget", *grant, "llen", *ct],
            "S": md + ["zrange", "lpop", "exists", "hget"] * (k + 1) + lead + [*grant, "llen", *ct],
        },
        "ack": both([*md, "hget", "hdel", "hdel", "zrem", *ct]),
        "extend": both(["time", "hget", "zadd"]),
        "requeue": both(
            [*md, "hget", "hdel", "zrem", "hget", "hset", *passing, "lrange", "linsert", "llen", "hkeys", *ct]
        ),
        "remove_by_id": {
            # the id's duplicates looked for in dq (one range read)
            "T": [*md, "zrangebylex", "hexists", "hget", "hdel", "zrem", *passing, "lrem", "exists", *ct],
            # S: and the unique key's holder looked up (ue), to free a key the entry held
            "S": [*md, "zrangebylex", "hexists", "zscore", "hdel", "hget", *ct],
        },
        "change_priority": {
            "T": [
                *md,
                "hexists",
                "hget",
                "incr",
                "hset",
                "zscore",
                "rpush",
                "zadd",
                "hkeys",
                *passing,
                "lrem",
                "exists",
            ],
            "S": [*md, "hexists", "hget", "incr", "hset", "zscore", "rpush", "zadd", "hkeys"],
        },
        "retrieve_highest_priority": {
            "T": [*md, "zrange", *passing, "lrange", "hget", "hexists"],
            "S": [*md, "zrange"]
            + (passing + ["lrange"] + ["hget"] * k if k else [])
            + passing
            + ["lrange", "hget", "hexists"],
        },
        "retrieve_by_priority": {
            "T": [*md, *passing, "lindex", "hget", "hexists"],
            "S": md + [*passing, "lindex", "hget", "lpop", "exists"] * k + [*passing, "lindex", "hget", "hexists"],
        },
        "remove_highest_priority": {
            "T": [*md, "zrange", "lpop", "exists", "hget", "hexists", "hdel", *ct],
            "S": md + ["zrange", "lpop", "exists", "hget"] * (k + 1) + lead + ["hexists", "hdel", *ct],
        },
    }
