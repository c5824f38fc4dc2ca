"""The cost table (``explain``): the Redis commands each queue operation runs on its steady path, per
technique; checked against INFO commandstats by tests/queue/test_explain.py; docs/priorities.md."""

from __future__ import annotations

from collections import Counter


def explain(stale: int = 0) -> dict:
    """{operation: {technique: {"reads": n, "writes": n, "commands": {command: n}}}}: one entry,
    a new id, a wake token waiting, no dead-lettering, and (technique S) ``stale`` pointers of
    removed entries in front of the one retrieved."""
    return {op: {t: _cost(cmds) for t, cmds in by_t.items()} for op, by_t in _commands(stale).items()}


#: The commands of the cost table that read, and those that write.
READ_COMMANDS = frozenset(
    {"hget", "hexists", "hkeys", "hlen"}
    | {"llen", "lrange", "lindex"}
    | {"zcard", "zrange", "zrangebyscore", "zrangebylex", "zscore"}
    | {"get", "exists", "mget"}
)
WRITE_COMMANDS = frozenset(
    {"hset", "hsetnx", "hdel", "hincrby"}
    | {"rpush", "lpop", "linsert", "lrem"}
    | {"zadd", "zrem", "zpopmin"}
    | {"incr", "set", "del"}
)


def _cost(cmds: list[str]) -> dict:
    c = Counter(cmds)
    return {
        "reads": sum(n for cmd, n in c.items() if cmd in READ_COMMANDS),
        "writes": sum(n for cmd, n in c.items() if cmd in WRITE_COMMANDS),
        "commands": dict(sorted(c.items())),
    }


def _commands(k: int) -> dict:
    """The Redis commands each script runs on the steady path, ``k`` stale pointers ahead (``explain``)."""
    both = lambda cmds: {"T": cmds, "S": cmds}  # noqa: E731
    lead = ["zrem"] if k else []  # the stale pointers' own priority list runs empty
    # HSETNX: the lease check and write in one; SET NX: the sweep record (skipped by a pop that acked)
    grant = ["time", "hsetnx", "zadd", "set"]
    md = ["get"]  # every script but extend first reads the queue's mode record
    passing = ["zscore"]  # is a compaction pass of the rank under way (a pop reads it with the rank)
    ct = ["hincrby"]  # the counter of what the call did (hash ct), once per call
    due = ["zrange"]  # a pop's look at its queue's first delayed entry (lua/includes/delays.lua)
    moved = [*md, "hexists", "hget", "incr", "hset", "zscore", "rpush", "zadd", "hkeys"]
    # An insert's first send with a client-made publish id: one MGET (mode, views version, window
    # start), the id only recorded (answered ones forgotten every FORGET_BATCH: two commands).
    # Sent again: two HGETs first; a caller's publish id without a length limit: "hget",
    # "hsetnx" for "hset".
    return {
        # the entry stored with HSETNX (an id in use takes free_id's way)
        "insert": both(["mget", "time", "incr", "hsetnx", "rpush", "hset", "llen", *ct]),
        # more waits behind it (the last rank list taken from is not empty): no ZCARD; the first
        # delayed entry looked at (ZRANGE of dz, empty here: no clock read for it)
        "pop": {
            "T": [*md, *due, "zrange", "lpop", "exists", "hget", *grant, "llen", *ct],
            "S": md + due + ["zrange", "lpop", "exists", "hget"] * (k + 1) + lead + [*grant, "llen", *ct],
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
        # the entry pointed at its new rank (T drops the old pointer too)
        "change_priority": {"T": [*moved, *passing, "lrem", "exists"], "S": moved},
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
