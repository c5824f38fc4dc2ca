"""The longest single script call under the worst cases for work per call (issue: bounded work).

No script call may do work that grows with a queue: Redis runs one script at a time, so one long
call stalls every client of the server. Each case below builds its worst case on a redis-server
of its own, then runs the operations that meet it with Redis's SLOWLOG recording every call
(``slowlog-log-slower-than 0``); the figure is the longest script call of that phase (SLOWLOG's
duration, Redis's own clock), by script. Goal: under 10 ms each.

Cases (N = ``--entries``, 120,000 by default):

- fair_paused_head: a fair queue; a paused tenant's entry heads its priority's list, N entries of
  other tenants behind it are popped (their pointers go stale behind the head that cannot be
  served), then N/10 more are inserted and popped (pushes compact the list).
- fair_capped_head: the same with a tenant held at its concurrency cap (one entry leased and kept).
- fair_control: as many fair pops of 100, acks and inserts on a queue of 1,200 entries at a time:
  the cost of a call's own batch, whatever the queue's size (the yardstick of the two above).
- plain_removed_backlog: a plain queue (technique S) of N entries, all but every 100th removed by
  id (lazy deletion leaves their pointers), then N/10 inserts and pops.
- publish_window_expiry: ``--window-ids`` publish ids (1,000,000) remembered in each of the two
  windows, the window lapses: the next insert drops them (both at once, then one at a time).
- migrate_mode: ``migrate_mode`` of a queue of N waiting (and N/100 leased) entries to fairness.
- purge: ``purge`` of N waiting entries.
- remove_tail_T / change_priority_tail_T: technique T's eager removal of the last entry of an
  N-entry priority (the pointer is found in its list).
- cleanup_deep: ``cleanup`` of an N-entry priority whose last half was removed (technique S).
- replay_tail: replay of the 1,000 newest dead letters of an N-entry dead-letter queue.
- recover_consumer: a consumer's leases returned (``reclaim(consumer=...)``) with N/10 leases of
  other consumers outstanding.
- one_task_id_resent: N/6 publishes of one task id (each a message: duplicate ids), half of them
  popped and acked one by one, then the rest removed by the id.
- unique_replace_throttle: ``replace`` of keyed entries at the head, in the middle and at the tail
  of a backlog of 2.5 N (300,000 at the default N) while 200 new throttle keys a second come
  (period 1 s) for 3 s: a replace looks for the old place near the ends of its rank only, each
  throttled insert drops a few records whose period is over (docs/unique.md).

    python -m benchmarks.slowlog [--entries 120000] [--window-ids 1000000] [--nice -10] [--only CASE,..]
                                 [--smoke] [--out DIR]

``--entries 20000 --window-ids 100000`` is the bounded run (about a minute); ``--smoke`` is tinier.
``--nice -10`` runs the redis-server ahead of the machine's other processes (as root), so that
other load preempts a call less often (the figures are Redis's wall-clock durations).
"""

from __future__ import annotations

import os
import time

import redis

from celery_pq import Item, PriorityQueue
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.queue.unique import UniqueKey
from celery_pq.scripts import SCRIPT_NAMES, library, source
from celery_pq.storage import constants as C
from celery_pq.testing import RedisServer

from .common import cli, table

#: A script call longer than this fails the goal (ms).
GOAL_MS = 10.0
#: Client operations between two readings of the SLOWLOG (it holds SLOWLOG_LEN entries at most,
#: and Redis 7 logs the commands a script runs as well as the script call: a fair pop of 100
#: entries adds about 2,000).
DRAIN_EVERY = 10
SLOWLOG_LEN = 1_000_000


class Slowlog:
    """Every script call's duration on one server, by script: the SLOWLOG read and emptied now and
    then (``take``), so that no entry is pushed out before it is read."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.names = {}
        for name in SCRIPT_NAMES:
            self.names[library().functions[name].encode()] = name
            self.names[client.script_load(source(name)).encode()] = name
        client.config_set("slowlog-max-len", SLOWLOG_LEN)
        client.config_set("slowlog-log-slower-than", 0)
        self.reset()

    def reset(self) -> None:
        self.client.slowlog_reset()
        self.max_us: dict[str, int] = {}
        self.durations: list[int] = []  # every script call's (µs)
        self._ops = 0

    def tick(self) -> None:
        self._ops += 1
        if self._ops % DRAIN_EVERY == 0:
            self.take()

    def take(self) -> dict[str, float]:
        """The longest call of each script so far in this phase (ms)."""
        with self.client.pipeline(transaction=True) as p:  # (nothing is logged in between)
            p.execute_command("SLOWLOG", "GET", -1)
            p.slowlog_reset()
            raw = p.execute()[0]
        assert len(raw) < SLOWLOG_LEN, "the SLOWLOG was full: entries were lost before they were read"
        for entry in raw:
            args = entry[3]
            if len(args) < 2 or args[0].upper() not in (b"FCALL", b"EVALSHA"):
                continue
            name = self.names.get(args[1], args[1].decode(errors="replace"))
            self.max_us[name] = max(self.max_us.get(name, 0), int(entry[2]))
            self.durations.append(int(entry[2]))
        return {name: us / 1000 for name, us in self.max_us.items()}

    def spread(self) -> dict:
        """Calls, their 99th and 99.9th percentile (ms), and how many took GOAL_MS or more."""
        d = sorted(self.durations)
        if not d:
            return {"calls": 0, "p99_ms": 0.0, "p999_ms": 0.0, "over_goal": 0}
        return {
            "calls": len(d),
            "p99_ms": d[int(0.99 * (len(d) - 1))] / 1000,
            "p999_ms": d[int(0.999 * (len(d) - 1))] / 1000,
            "over_goal": sum(1 for us in d if us >= GOAL_MS * 1000),
        }


def _fill(
    q: PriorityQueue, n: int, *, priority: int = 5, tenants: int = 0, prefix: str = "e", chunk: int = 1000
) -> None:
    """n entries; ``chunk`` a call (the measured phases insert 100 a call: the case is what the
    pushes meet, not the size of the caller's chunk)."""
    items = []
    for i in range(n):
        t = f"t{i % tenants}" if tenants else None
        items.append(Item(b"x" * 32, priority, f"{prefix}{i}", tenant=t or None))
        if len(items) == 10_000:
            q.insert_many(items, chunk=chunk)
            items = []
    if items:
        q.insert_many(items, chunk=chunk)


def _drain(q: PriorityQueue, log: Slowlog, *, keep: int = 0) -> int:
    """Pop and ack (100 a call) until a pop gets nothing; returns how many."""
    got = 0
    while True:
        leases = q.pop(100)
        log.tick()
        if not leases:
            return got
        q.ack(leases)
        log.tick()
        got += len(leases)


def case_fair_head(client, log, n, *, capped: bool) -> dict:
    q = open_queue(client, "fairhead", QueueSettings(fair=True, tenant_concurrency=None))
    q.insert(b"held", 5, id="held-0", tenant="held")
    if capped:
        q.insert(b"held", 5, id="held-1", tenant="held")
        q.configure_tenants(concurrency={"held": 1})
        kept = q.pop(1)  # the held tenant's first entry, never acked: it stays at its cap
        assert kept and kept[0].id == "held-0"
    else:
        q.pause("held")
    _fill(q, n, tenants=100)
    log.reset()
    served = _drain(q, log)
    for round_ in range(10):
        _fill(q, n // 100, tenants=100, prefix=f"r{round_}-", chunk=100)
        served += _drain(q, log)
    assert served == n + 10 * (n // 100), served
    return log.take()


def case_fair_control(client, log, n) -> dict:
    """The same pops, acks and inserts as the head cases on a small queue (1,200 entries at a
    time, no tenant held): what a call of 100 fair deliveries costs whatever the queue's size."""
    q = open_queue(client, "control", QueueSettings(fair=True))
    log.reset()
    served = 0
    for round_ in range((n + 10 * (n // 100)) // 1200):
        _fill(q, 1200, tenants=100, prefix=f"c{round_}-", chunk=100)
        served += _drain(q, log)
    return log.take()


def case_plain_removed(client, log, n) -> dict:
    q = open_queue(client, "removed", QueueSettings(technique="S"))
    _fill(q, n)
    log.reset()
    for i in range(n):
        if i % 100:
            q.remove(f"e{i}")
            log.tick()
    for round_ in range(10):
        _fill(q, n // 100, prefix=f"r{round_}-", chunk=100)
    served = _drain(q, log)
    assert served == n // 100 + 10 * (n // 100), served
    return log.take()


def case_publish_window(client, log, ids) -> dict:
    q = open_queue(client, "window", QueueSettings(dedupe_seconds=5))
    q.insert(b"first", 1)
    out = {}
    for label, age_windows in (("both windows at once", 2), ("the older window", 1)):
        with client.pipeline(transaction=False) as p:
            for key in (q.keys.publish_ids, q.keys.publish_ids_before):
                for start in range(0, ids, 10_000):
                    p.hset(key, mapping={f"p{key[-2:]}{i}": "" for i in range(start, min(start + 10_000, ids))})
                    if len(p) >= 20:
                        p.execute()
            p.execute()
        assert client.hlen(q.keys.publish_ids) >= ids
        now_ms = int(time.time() * 1000)
        client.set(q.keys.publish_window, now_ms - age_windows * 5000 - 100)
        log.take()
        durations = list(log.durations)
        log.reset()
        q.insert(b"after", 1)
        out[label] = log.take().get("insert", 0.0)
        log.durations = durations + log.durations
    log.max_us = {"insert": int(max(out.values()) * 1000)}
    return {"insert": max(out.values()), **{f"insert ({k})": v for k, v in out.items()}}


def case_migrate(client, log, n) -> dict:
    q = open_queue(client, "migrate")
    _fill(q, n, tenants=100)
    q.pop(n // 100)
    log.reset()
    fair = PriorityQueue(client, "migrate", fair=True)
    waiting = done = 0
    while not done:  # migrate_mode's own loop, one step at a time (the SLOWLOG read in between)
        step = fair._scripts.run("migrate", step=C.MIGRATE_STEP)
        waiting, done = waiting + step[0], step[3]
        log.tick()
    assert waiting == n - n // 100, waiting
    return log.take()


def case_purge(client, log, n) -> dict:
    q = open_queue(client, "purge")
    _fill(q, n)
    log.reset()
    assert q.purge() == n
    return log.take()


def case_remove_tail(client, log, n) -> dict:
    q = open_queue(client, "tail")
    _fill(q, n)
    log.reset()
    assert q.remove(f"e{n - 1}") == 1
    q.change_priority(f"e{n - 2}", 9)
    return log.take()


def case_cleanup(client, log, n) -> dict:
    q = open_queue(client, "cleanup", QueueSettings(technique="S"))
    _fill(q, n)
    for i in range(n // 2, n):
        q.remove(f"e{i}")
    log.reset()
    q.cleanup(count=n)
    return log.take()


def case_replay(client, log, n) -> dict:
    q = open_queue(client, "replay")
    _fill(q.dead, n)
    log.reset()
    got = q.replay([f"e{i}" for i in range(n - 1000, n)])
    assert len(got["replayed"]) == 1000, {k: len(v) for k, v in got.items()}
    return log.take()


def case_one_task_id(client, log, n) -> dict:
    """N/6 publishes of one task id (deliberate re-sends: each is a message of its own, stored
    under a duplicate id), then each popped and acked, then a remove by that id."""
    q = open_queue(client, "sameid")
    log.reset()
    for _ in range(n // 6):
        q.insert(b"x", 1, id="same")
        log.tick()
    for _ in range(n // 12):
        lease = q.pop(1)
        log.tick()
        q.ack(lease[0])
        log.tick()
    q.remove("same")
    return log.take()


def case_recover(client, log, n) -> dict:
    q = open_queue(client, "recover")
    _fill(q, n // 10 + 10)
    for _ in range(n // 1000):
        q.pop(100, consumer="others")
    q.pop(10, consumer="leaving")
    log.reset()
    q.reclaim(consumer="leaving")
    return log.take()


def case_unique(client, log, n, seconds: float = 3.0) -> dict:
    """Replace on a long backlog, and 200 new throttle keys a second (see the module's list)."""
    q = open_queue(client, "unique")
    backlog = n * 5 // 2
    places = {"head": 0, "middle": backlog // 2, "tail": backlog}
    filled = 0
    for place, at in places.items():  # one keyed entry at each place, the backlog's entries between
        _fill(q, at - filled, prefix=f"b{filled}-")
        filled = at
        q.insert(Item(b"v0", 5, id=f"{place}-0"), unique=UniqueKey(place, "replace"))
    log.reset()
    tick, per_tick = 0.05, 10  # 200 new throttle keys a second
    start, i = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        i += 1
        for j in range(per_tick):
            q.insert(Item(b"t", 5), unique=UniqueKey(f"user-{i}-{j}", "throttle", 1.0))
            log.tick()
        for place in places:
            out = q.insert(Item(b"v", 5, id=f"{place}-{i}"), unique=UniqueKey(place, "replace"))
            assert out.kind == "replaced", out
            log.tick()
        time.sleep(max(0.0, start + i * tick - time.monotonic()))
    # the key table holds the throttle records of the last period or so, not every key seen
    held = client.hlen(q.keys.unique_keys)
    assert held <= 3 + 2 * per_tick / tick, held
    return log.take()


CASES = {
    "fair_paused_head": lambda c, log, n, ids: case_fair_head(c, log, n, capped=False),
    "fair_capped_head": lambda c, log, n, ids: case_fair_head(c, log, n, capped=True),
    "fair_control": lambda c, log, n, ids: case_fair_control(c, log, n),
    "plain_removed_backlog": lambda c, log, n, ids: case_plain_removed(c, log, n),
    "publish_window_expiry": lambda c, log, n, ids: case_publish_window(c, log, ids),
    "migrate_mode": lambda c, log, n, ids: case_migrate(c, log, n),
    "purge": lambda c, log, n, ids: case_purge(c, log, n),
    "remove_change_priority_tail_T": lambda c, log, n, ids: case_remove_tail(c, log, n),
    "cleanup_deep": lambda c, log, n, ids: case_cleanup(c, log, n),
    "replay_tail": lambda c, log, n, ids: case_replay(c, log, n),
    "recover_consumer": lambda c, log, n, ids: case_recover(c, log, n),
    "one_task_id_resent": lambda c, log, n, ids: case_one_task_id(c, log, n),
    "unique_replace_throttle": lambda c, log, n, ids: case_unique(c, log, n),
}


def _raise_priority(pid: int, nice: int) -> int:
    """Give our own redis-server the scheduling priority ``nice`` (needs root for < 0), so that a
    busy machine's other processes take the CPU from it less often while a call runs; the
    priority it got."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, pid)


def run(entries=120_000, window_ids=1_000_000, only="", nice=0) -> dict:
    results = {}
    niceness = None
    for name, case in CASES.items():
        if only and name not in only.split(","):
            continue
        with RedisServer() as server:
            if nice:
                niceness = _raise_priority(server.pid, nice)
            client = redis.Redis(port=server.port)
            log = Slowlog(client)
            start = time.perf_counter()
            by_script = case(client, log, entries, window_ids)
            results[name] = {
                "max_ms": max(by_script.values(), default=0.0),
                "by_script": by_script,
                **log.spread(),
                "seconds": round(time.perf_counter() - start, 1),
            }
            client.close()
        print(f"{name}: {results[name]['max_ms']:.2f} ms", flush=True)
    return {
        "entries": entries,
        "window_ids": window_ids,
        "goal_ms": GOAL_MS,
        "redis_nice": niceness,
        "results": results,
    }


def markdown(data) -> list[str]:
    rows = []
    for name, r in data["results"].items():
        worst = max(r["by_script"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        rows.append(
            [
                name,
                f"{r['max_ms']:.2f}",
                worst[0],
                "yes" if r["max_ms"] < data["goal_ms"] else "NO",
                f"{r['calls']:,}",
                f"{r['p99_ms']:.2f}",
                f"{r['p999_ms']:.2f}",
                str(r["over_goal"]),
                ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["by_script"].items())),
            ]
        )
    return [
        f"# Longest script call per worst case (SLOWLOG, {data['entries']:,} entries, "
        f"{data['window_ids']:,} publish ids per window)",
        "",
        *table(
            [
                "case",
                "max ms",
                "script",
                f"under {data['goal_ms']:.0f} ms",
                "script calls",
                "p99 ms",
                "p99.9 ms",
                f"calls >= {data['goal_ms']:.0f} ms",
                "max ms by script",
            ],
            rows,
        ),
        "",
        "Each case on a redis-server of its own; the durations are Redis's (SLOWLOG), of the phase "
        "that meets the worst case (the build is not counted). On a busy machine a call can be "
        "descheduled while it runs: a lone maximum far above the 99.9th percentile is that, not work"
        + (f"; the redis-server ran at nice {data['redis_nice']}." if data.get("redis_nice") is not None else "."),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "slowlog",
        run,
        markdown,
        options=(
            ("--entries", int, 120_000),
            ("--window-ids", int, 1_000_000),
            ("--only", str, ""),
            ("--nice", int, 0),
        ),
        smoke={"entries": 2_000, "window_ids": 20_000},
    )


if __name__ == "__main__":
    main()
