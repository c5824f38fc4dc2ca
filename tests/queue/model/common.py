"""What every model machine shares: the hypothesis profiles, the names PQ_MODEL_SKIP takes, the
session's redis-server, and the constants of the model."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

from celery_pq.queue import QueueSettings, open_queue

SOAK_MINUTES = float(os.environ.get("PQ_SOAK_MINUTES") or 0)
#: Rules and checks PQ_MODEL_SKIP may leave out, to look past a known failure. Each new name
#: says which defect it hides (see the report of the run that added it).
SKIPPABLE = {
    "corrupt",
    "mode",
    "publish_id",
    "dead_of_dead",
    "wake",
    "stale_bound",
    "fair_state_bound",
    # unique keys (UniqueMachine)
    "unique_fixed_id",  # a fresh publish that reuses a fixed task id is taken as a retry
    "unique_prune",  # a key record outlives its entry or window by more than one sweep
    "unique_remove_s",  # a remove by technique S leaves the key record
    "unique_replay",  # a replayed dead letter loses its key
    "unique_clock",  # throttle or debounce deadlines after a clock step back
    # rates (RateMachine)
    "rate_sharded",  # task_rate on a sharded queue delivers rate / shards
    "rate_clock",  # the token bucket after a clock step back
    # publishes (PublishMachine)
    "publish_routed",  # one publish routed to several queues, doubled by a retry
    "second_process",  # a second process with other options changes the queue silently
}
#: Defects the model finds whose fixes have not landed yet: skipped unless PQ_MODEL_SKIP is set
#: (``PQ_MODEL_SKIP=`` runs everything). Temporary: each name goes when its fix lands.
KNOWN_DEFECTS: set[str] = set()
_given = os.environ.get("PQ_MODEL_SKIP")
SKIP = KNOWN_DEFECTS if _given is None else {s for s in _given.split(",") if s}
assert SKIP <= SKIPPABLE, f"PQ_MODEL_SKIP names unknown rules or checks: {sorted(SKIP - SKIPPABLE)}"

_common = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=80, stateful_step_count=40, **_common)
settings.register_profile("soak", max_examples=60, stateful_step_count=120, **_common)

#: Pointers the rank lists may hold beyond twice the waiting entries (stale ones not yet passed).
STALE_SLACK = 128
#: A delayed entry is due after this many ms ("short") or after an hour ("long").
SHORT_MS, LONG_MS = 30, 3_600_000
#: The event log's cap: more than a run logs (the teardown compares the whole log with the counters).
EVENT_CAP = 1_000_000
#: Lease length of every pop: only the expiry rule makes a lease run out.
LEASE_SECONDS = 60
#: ms a lease is made to have been held before it ends (fair_cost "time"): none, a few (the
#: rounding at weights 2 and 3), seconds, and more than the day a lease is charged at most.
HELD = [0, 1, 2, 5, 40, 700, 5_000, 86_400_000 + 5_000]

IDS = [None, None, None, "a", "a", "b", "a~3", "a~5", "7", "9", "0b8f5c9e-3a1d-4f6e-9c2b-7d4e5f6a8b9c", "\x01x"]
PRIORITIES = [0, 1, 5, 128, 254, 255]
TENANTS = ["", "a", "b", "c,d"]
VIEWS = [(0, 50), (0, 0), (100, 255), (250, 255), (1, 254)]
GARBAGE = [b"nobar", b"", b"1,2|x", b"0,abc,,,,1|x", b"x,1,,,,1|p", b"\xff\x00garbage"]


class Session:
    """The session's RedisServer, set by the test functions before a machine runs."""

    server = None


def redis_now_ms(client) -> int:
    sec, usec = client.time()
    return sec * 1000 + usec // 1000


@dataclass
class MEntry:
    eid: str
    given: str | None
    payload: bytes
    rank: int
    seq: int  # the model's insertion order (Redis's own counter moves in the same order)
    tenant: str  # escaped, "" for none
    state: str  # waiting, delayed, leased, dead, gone, corrupt
    d: int = 0  # deliveries counted so far
    token: str | None = None
    due: int = 0  # ms on the Redis clock, delayed entries only
    short: bool = False
    was: str = ""  # a corrupt entry's state when it was corrupted


def open_model_queue(client, name: str, prefix: str, **settings):
    """A machine's queue: under its key prefix, with the machines' lease and event-log cap."""
    return open_queue(
        client, name, QueueSettings(key_prefix=prefix, lease_seconds=LEASE_SECONDS, event_log=EVENT_CAP, **settings)
    )


def forget_keys(client, prefix: str) -> None:
    """A machine's teardown: its keys deleted (its own prefix only), its client closed."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
