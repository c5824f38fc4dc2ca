"""The fault suite, long: each scenario on celery-pq and on kombu's Redis transport, side by side.

    python -m benchmarks.faults [--smoke] [--out DIR] [--only NAME ...] [--pools POOL ...]

A full run takes about 8 minutes on a 2-core machine; ``make soak`` runs it too, with more rounds of
``aof_kill_rounds`` (``--aof-rounds``).

Each scenario (one function here, also run bounded by tests/faults/) returns the harness's
classification (benchmarks/fault_harness.py): lost, recovered, duplicated, unexpected, throughput.
Results go to benchmarks/results/faults.{json,md}; ``--smoke`` runs two of them tiny.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

from celery_pq.testing import RedisServer, wait_for

from .common import RESULTS
from .fault_harness import TRANSPORTS, FaultRun, summary


def worker_kills(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 600,
    rate: float = 60.0,
    workers: int = 3,
    lease: float = 2.0,
    task_seconds: float = 0.1,
    drain: float = 60.0,
    seed: int = 1,
    pool: str = "prefork",
    concurrency: int = 2,
) -> dict:
    """Producers publish ``tasks`` at ``rate`` per second while a random worker's process group
    is SIGKILLed and restarted every 1-2 s; the workers run ``pool`` with ``concurrency``."""
    rng = random.Random(seed)
    with RedisServer() as server:
        run = FaultRun(
            transport, server, workdir, lease=lease, task_seconds=task_seconds, pool=pool, concurrency=concurrency
        )
        try:
            run.start_workers(workers)
            run.start_producers(tasks, rate=rate)
            while run.producing():
                time.sleep(rng.uniform(1.0, 2.0))
                run.kill_and_restart(f"w{rng.randrange(workers)}")
            run.join_producers()
            run.wait_all_done(drain)
            # a worker killed after a task ended and before its ack reached Redis leaves a lease
            # that runs out and is delivered again: the end state is the one after that
            run.wait_empty(3 * lease + 5)
            result = run.classify()
            result["residue"] = run.residue()
            result["workers_alive"] = sum(p.poll() is None for p in run.workers.values())
            return result
        finally:
            run.close()


def stalled_worker(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 200,
    lease: float = 2.0,
    stall: float = 5.0,
    task_seconds: float = 0.5,
    drain: float = 60.0,
) -> dict:
    """One of two workers is SIGSTOPped with tasks under way for longer than its lease, then
    SIGCONTinued: its tasks run elsewhere, its late acks are refused, nothing runs a third time."""
    with RedisServer() as server:
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=task_seconds)
        try:
            run.start_workers(2)
            run.start_producers(tasks, threads=1, rate=tasks / 4)
            # stop w0 once each of its pool processes has started a task
            pgid = run.workers["w0"].pid
            wait_for(
                lambda: (
                    sum(1 for rows in run.runs().values() for r in rows if r[0] == "start" and r[1] == pgid)
                    >= run.concurrency
                ),
                30,
                "w0 busy",
            )
            run.signal_worker("w0", signal.SIGSTOP)
            time.sleep(stall)
            run.signal_worker("w0", signal.SIGCONT)
            run.join_producers()
            result = run.finish(drain)
            logs = run.worker_logs()
            result["late_acks_logged"] = logs.count("came after its lease expired")
            return result
        finally:
            run.close()


def redis_kills(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 600,
    rate: float = 60.0,
    workers: int = 2,
    kills: int = 3,
    down: float = 0.5,
    fsync: str = "always",
    lease: float = 3.0,
    drain: float = 60.0,
    seed: int = 2,
) -> dict:
    """The broker redis-server (AOF, ``appendfsync`` = ``fsync``) is SIGKILLed and restarted on
    the same port and directory ``kills`` times while producers (Celery's publish retry) and
    workers go on; the workers are never restarted."""
    rng = random.Random(seed)
    with RedisServer(config={"appendonly": "yes", "appendfsync": fsync}) as server:
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=0.02)
        try:
            run.start_workers(workers)
            pids = {name: p.pid for name, p in run.workers.items()}
            run.start_producers(tasks, rate=rate)
            period = tasks / rate / (kills + 1)
            for _ in range(kills):
                time.sleep(period * rng.uniform(0.7, 1.3))
                run.kills.append((0, time.time()))
                server.kill()
                time.sleep(down)
                server.start()
            run.join_producers()
            result = run.finish(drain)
            result["workers_restarted"] = sum(pids[n] != p.pid for n, p in run.workers.items())
            result["fsync"] = fsync
            result["loss_window_s"] = run.loss_window(result["lost"])
            return result
        finally:
            run.close()


def aof_loss_window(
    transport: str,
    workdir: Path,
    *,
    fsync: str = "everysec",
    rate: float = 300.0,
    seconds: float = 3.0,
    drain: float = 60.0,
) -> dict:
    """Producers publish at ``rate`` for ``seconds`` into a backlog (no worker yet); the broker
    (AOF, ``appendfsync`` = ``fsync``) is SIGKILLed then restarted; then workers drain it. Lost
    publishes are those the AOF had not written; ``loss_window_s`` is how long before the kill
    the earliest of them returned."""
    tasks = int(rate * (seconds + 2))
    with RedisServer(config={"appendonly": "yes", "appendfsync": fsync}) as server:
        run = FaultRun(transport, server, workdir, lease=3.0, task_seconds=0.0)
        try:
            run.start_producers(tasks, rate=rate)
            time.sleep(seconds)
            run.kills.append((0, time.time()))
            server.kill()
            time.sleep(0.3)
            server.start()
            run.join_producers()
            run.start_workers(2)
            run.wait_all_done(drain)
            result = run.classify()
            result["fsync"] = fsync
            result["loss_window_s"] = run.loss_window(result["lost"])
            return result
        finally:
            run.close()


def _write_and_fsync(path: Path, stop: threading.Event, chunk: int = 8 << 20) -> None:
    """Keep a disk busy until ``stop``: write ``chunk`` bytes and fsync, again and again (the
    file is removed at the end)."""
    data = b"\0" * chunk
    try:
        with open(path, "wb") as f:
            while not stop.is_set():
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                if f.tell() > 64 * chunk:
                    f.seek(0)
    finally:
        path.unlink(missing_ok=True)


def aof_kill_rounds(
    *,
    fsync: str = "everysec",
    rounds: int = 10,
    rate: float = 1000.0,
    threads: int = 2,
    kill_after: tuple[float, float] = (0.5, 1.5),
    busy_disk: bool = False,
    seed: int = 4,
) -> dict:
    """The loss window of a redis-server process crash under an ``appendfsync`` policy, over many
    rounds. Each round: a fresh broker with AOF; ``threads`` insert into a celery-pq queue at a
    steady ``rate`` in all (the queue API: the insert script a publish runs); the server is
    SIGKILLed at a random moment in ``kill_after`` seconds and started again from its AOF; every
    insert that returned and is not stored is lost. ``delayed_fsyncs`` is Redis's
    ``aof_delayed_fsync`` before the kill: how often a write of the AOF buffer was put off
    because a background fsync was slow (replies then go out before the write). ``busy_disk``: a
    thread writes and fsyncs 8 MB chunks beside the AOF meanwhile (a disk shared with other
    writers), which is what makes an fsync slow."""
    from celery_pq.queue import QueueSettings, open_queue
    from celery_pq.storage.ids import encode_id

    rng = random.Random(seed)
    out = {
        "fsync": fsync,
        "rounds": rounds,
        "rate": rate,
        "returned": 0,
        "lost": 0,
        "lost_per_round": [],
        "loss_window_s": 0.0,
        "delayed_fsyncs": [],
    }
    for _ in range(rounds):
        with RedisServer(config={"appendonly": "yes", "appendfsync": fsync}) as server:
            stop = threading.Event()
            returned: list[tuple[str, float]] = []
            lock = threading.Lock()

            def insert(index: int) -> None:
                q = open_queue(server.client(socket_timeout=5), "aof", QueueSettings(key_prefix="pqa"))
                begin = time.monotonic()
                n = 0
                while not stop.is_set():
                    delay = begin + n * threads / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    eid = f"t{index}-{n}"
                    n += 1
                    try:
                        q.insert(b"x", rng.randint(0, 9), id=eid)
                    except Exception:
                        return
                    with lock:
                        returned.append((eid, time.time()))

            workers = [threading.Thread(target=insert, args=(i,), daemon=True) for i in range(threads)]
            if busy_disk:
                workers.append(threading.Thread(target=_write_and_fsync, args=(server.dir / "busy", stop), daemon=True))
            for t in workers:
                t.start()
            time.sleep(rng.uniform(*kill_after))
            info = server.client().info("persistence")
            killed = time.time()
            server.kill()
            stop.set()
            for t in workers:
                t.join(10)
            server.start()
            r = server.client()
            ii = open_queue(r, "aof", QueueSettings(key_prefix="pqa")).keys.entries
            with r.pipeline(transaction=False) as p:
                for eid, _ in returned:
                    p.hexists(ii, encode_id(eid))
                stored = p.execute()
            lost = [(eid, at) for (eid, at), ok in zip(returned, stored) if not ok]
            out["returned"] += len(returned)
            out["lost"] += len(lost)
            out["lost_per_round"].append(len(lost))
            out["delayed_fsyncs"].append(int(info.get("aof_delayed_fsync", 0)))
            if lost:
                out["loss_window_s"] = max(out["loss_window_s"], round(killed - min(at for _, at in lost), 3))
    return out


def redis_pause(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 40,
    lease: float = 2.0,
    pause: float = 5.0,
    task_seconds: float = 1.0,
    how: str = "sigstop",
    drain: float = 60.0,
) -> dict:
    """Two workers run tasks of ``task_seconds``; the broker is paused (SIGSTOP, or a
    ``DEBUG SLEEP`` from a client) for ``pause`` seconds, longer than the lease, with tasks under
    way, then goes on. Its clock has moved on by the pause: were every lease taken as expired
    at once, each task under way would run twice."""
    with RedisServer(config={"enable-debug-command": "yes"}) as server:
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=task_seconds)
        try:
            run.start_workers(2)
            run.start_producers(tasks, threads=1)
            run.join_producers()
            # pause the moment tasks are under way (started, not done): their leases then run
            # out during the pause, which is longer than a lease
            wait_for(lambda: run.under_way() >= 2, 30, "tasks under way")
            run.kills.append((0, time.time()))
            if how == "sigstop":
                server.process.send_signal(signal.SIGSTOP)
                time.sleep(pause)
                server.process.send_signal(signal.SIGCONT)
            else:
                admin = server.client(socket_timeout=pause + 30)
                sleeper = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", str(pause)))
                sleeper.start()
                sleeper.join()
                admin.close()
            result = run.finish(drain)
            result["how"] = how
            result["under_way_at_pause"] = sum(
                1
                for rows in run.runs().values()
                if any(r[0] == "start" and r[3] <= run.kills[0][1] for r in rows)
                and not any(r[0] == "done" and r[3] <= run.kills[0][1] for r in rows)
            )
            return result
        finally:
            if server.process is not None:
                try:
                    server.process.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
            run.close()


def worker_partition(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 40,
    lease: float = 2.0,
    partition: float = 6.0,
    task_seconds: float = 1.0,
    drain: float = 60.0,
) -> dict:
    """Two workers, one reaching Redis through a proxy (celery_pq/testing/proxy.py) that partitions
    it for ``partition`` seconds (longer than its lease) with tasks under way, then heals: its
    tasks run on the other worker, its late acks and renewals are refused by their token, and
    it takes work again once the network is back."""
    from celery_pq.testing.proxy import FaultProxy

    with RedisServer() as server:
        proxy = FaultProxy(server.port)
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=task_seconds)
        try:
            cut_off = run.worker("w0", broker_port=proxy.port)
            run.worker("w1")
            run.start_producers(tasks, threads=1)
            run.join_producers()
            pgid = cut_off.pid
            wait_for(
                lambda: (
                    sum(1 for rows in run.runs().values() for r in rows if r[0] == "start" and r[1] == pgid)
                    >= run.concurrency
                ),
                30,
                "w0 busy",
            )
            run.kills.append((pgid, time.time()))
            proxy.partition()
            time.sleep(partition)
            proxy.heal()
            healed = time.time()
            # more work after the heal: the partitioned worker must take some of it
            run.start_producers(tasks, threads=1)
            run.join_producers()
            result = run.finish(drain)
            logs = run.worker_logs()
            result["late_acks_logged"] = logs.count("came after its lease expired")
            # entries whose lease the partitioned worker was told it had lost: by a renewal or by an
            # ack refused by its token (an ack it had sent into the partition, whose entry it then
            # finds gone, is taken as done by that sending and not reported again)
            result["lost_leases_reported"] = len(
                set(
                    re.findall(
                        r"(?:lease|ack) of (\S+) in '[^']*' (?:was lost before renewal|came after its lease expired)",
                        logs,
                    )
                )
            )
            result["partitioned_worker_ran_after_heal"] = sum(
                1 for rows in run.runs().values() for r in rows if r[0] == "start" and r[1] == pgid and r[3] > healed
            )
            return result
        finally:
            run.close()
            proxy.close()


def connection_cuts(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 300,
    rate: float = 40.0,
    workers: int = 2,
    lease: float = 3.0,
    drain: float = 60.0,
    seed: int = 3,
) -> dict:
    """Producers and workers reach Redis through a proxy that cuts every connection, mid-command
    or not, every 0.5-1.5 s while publishing (Celery's publish retry) and consuming go on."""
    from celery_pq.testing.proxy import FaultProxy

    rng = random.Random(seed)
    with RedisServer() as server:
        proxy = FaultProxy(server.port)
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=0.05, via_port=proxy.port)
        try:
            run.start_workers(workers)
            pids = {name: p.pid for name, p in run.workers.items()}
            run.start_producers(tasks, rate=rate)
            while run.producing():
                time.sleep(rng.uniform(0.5, 1.5))
                run.kills.append((0, time.time()))
                proxy.cut()
            run.join_producers()
            result = run.finish(drain)
            result["workers_restarted"] = sum(pids[n] != p.pid for n, p in run.workers.items())
            return result
        finally:
            run.close()
            proxy.close()


def network_latency(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 200,
    rate: float = 20.0,
    workers: int = 2,
    lease: float = 2.0,
    low: float = 0.05,
    high: float = 0.2,
    drain: float = 90.0,
) -> dict:
    """Producers and workers reach Redis through a proxy that holds every chunk a random
    ``low``..``high`` seconds in each direction (order kept): every command's round trip, the
    renewals' and acks' included, takes two such waits. No fault kills anything, so nothing may
    be lost and nothing may run twice."""
    from celery_pq.testing.proxy import FaultProxy

    with RedisServer() as server:
        proxy = FaultProxy(server.port)
        proxy.latency(low, high)
        run = FaultRun(transport, server, workdir, lease=lease, task_seconds=0.05, via_port=proxy.port)
        try:
            run.start_workers(workers)
            run.start_producers(tasks, rate=rate)
            run.join_producers(timeout=drain)
            result = run.finish(drain)
            result["latency_s"] = f"{low}-{high} each way"
            return result
        finally:
            run.close()
            proxy.close()


def half_open(
    transport: str,
    workdir: Path,
    *,
    tasks: int = 40,
    lease: float = 3.0,
    task_seconds: float = 1.0,
    socket_timeout: float = 1.0,
    drain: float = 60.0,
) -> dict:
    """Producers and two workers reach Redis through a proxy; with tasks under way, every
    connection open at that moment goes half-open for good (what a client writes is taken, no
    reply ever comes, nothing is closed), while new connections go through. With
    ``socket_timeout`` the clients give up on the silent connections and reconnect; then more
    work is published, which the same workers must run."""
    from celery_pq.testing.proxy import FaultProxy

    with RedisServer() as server:
        proxy = FaultProxy(server.port)
        run = FaultRun(
            transport,
            server,
            workdir,
            lease=lease,
            task_seconds=task_seconds,
            via_port=proxy.port,
            options={"socket_timeout": socket_timeout},
        )
        try:
            run.start_workers(2)
            pids = {name: p.pid for name, p in run.workers.items()}
            run.start_producers(tasks, threads=1)
            run.join_producers()
            wait_for(lambda: run.under_way() >= 2, 30, "tasks under way")
            run.kills.append((0, time.time()))
            proxy.silence()
            under_way = run.under_way()
            silenced = time.time()
            run.start_producers(tasks, threads=1)  # new connections: these go through
            run.join_producers()
            result = run.finish(drain)
            result["under_way_at_fault"] = under_way
            result["workers_restarted"] = sum(pids[n] != p.pid for n, p in run.workers.items())
            result["ran_after_fault"] = {
                name: sum(
                    1
                    for rows in run.runs().values()
                    for r in rows
                    if r[0] == "start" and r[1] == p.pid and r[3] > silenced
                )
                for name, p in run.workers.items()
            }
            return result
        finally:
            run.close()
            proxy.close()


SCENARIOS = {  # name -> (function, long arguments, --smoke arguments)
    "worker_kills": (worker_kills, {"tasks": 4000, "rate": 100.0, "drain": 120.0}, {"tasks": 120, "rate": 40.0}),
    "stalled_worker": (stalled_worker, {"tasks": 200}, {"tasks": 40}),
    "redis_kills": (
        redis_kills,
        {"tasks": 3000, "rate": 100.0, "kills": 8, "drain": 120.0},
        {"tasks": 100, "rate": 40.0, "kills": 2},
    ),
    "redis_kills_everysec": (
        redis_kills,
        {"tasks": 3000, "rate": 100.0, "kills": 8, "fsync": "everysec", "drain": 120.0},
        {"tasks": 100, "rate": 40.0, "kills": 2, "fsync": "everysec"},
    ),
    "redis_pause_sigstop": (redis_pause, {"tasks": 100}, {"tasks": 12}),
    "redis_pause_debug_sleep": (redis_pause, {"tasks": 100, "how": "debug_sleep"}, {"tasks": 12, "how": "debug_sleep"}),
    "worker_partition": (worker_partition, {"tasks": 100}, {"tasks": 12}),
    "connection_cuts": (connection_cuts, {"tasks": 2000, "rate": 60.0}, {"tasks": 60}),
    "network_latency": (network_latency, {"tasks": 1000, "rate": 30.0, "drain": 180.0}, {"tasks": 40}),
    "half_open": (half_open, {"tasks": 100}, {"tasks": 12}),
    "aof_loss_always": (aof_loss_window, {"fsync": "always"}, {"fsync": "always", "rate": 50.0, "seconds": 1.0}),
    "aof_loss_everysec": (aof_loss_window, {"fsync": "everysec"}, {"rate": 50.0, "seconds": 1.0}),
}
#: The worker pools ``worker_kills`` takes (``--pools``): each one's arguments, its concurrency
#: as the tests give it (docs/reliability.md, "Worker pools").
POOL_ARGS = {
    "prefork": {"pool": "prefork", "concurrency": 2},
    "solo": {"pool": "solo", "concurrency": 1},
    "threads": {"pool": "threads", "concurrency": 4},
    "gevent": {"pool": "gevent", "concurrency": 20},
    "eventlet": {"pool": "eventlet", "concurrency": 20},
}
#: What ``--smoke`` runs when no ``--only`` is given: one scenario, to show the report is written
#: (CI runs every scenario in tests/faults/).
SMOKE = ("redis_kills",)


def markdown(results: dict) -> str:
    lines = ["# Fault suite", "", "Every task id classified as Jepsen's queue checker does (benchmarks/faults.py).", ""]
    keys = [
        "returned",
        "raised",
        "done",
        "lost",
        "recovered",
        "duplicated",
        "unexpected",
        "unexplained_duplicates",
        "max_runs",
        "kills",
        "per_second",
    ]
    for name, by_transport in results.items():
        if name == "aof_kill_rounds":
            lines += aof_markdown(by_transport)
            continue
        lines += [f"## {name}", "", "| | " + " | ".join(TRANSPORTS) + " |", "| --- |" + " --- |" * len(TRANSPORTS)]
        for key in keys:
            row = [str(by_transport.get(t, {}).get(key, "")) for t in TRANSPORTS]
            lines.append(f"| {key} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def aof_markdown(by_fsync: dict) -> list[str]:
    lines = [
        "## aof_kill_rounds",
        "",
        "redis-server SIGKILLed while inserts go on at a steady rate, restarted from its AOF; "
        "lost: inserts that returned and are not stored.",
        "",
        "| appendfsync | rounds | returned | lost | lost per round | loss window (s) | delayed fsyncs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fsync, r in by_fsync.items():
        lines.append(
            f"| {fsync} | {r['rounds']} | {r['returned']} | {r['lost']} | "
            f"{max(r['lost_per_round'], default=0)} max | {r['loss_window_s']} | {sum(r['delayed_fsyncs'])} |"
        )
    return [*lines, ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument(
        "--aof-rounds",
        type=int,
        default=None,
        help="rounds of aof_kill_rounds per appendfsync policy (default 10, --smoke 1)",
    )
    ap.add_argument(
        "--pools",
        nargs="+",
        default=["prefork"],
        choices=sorted(POOL_ARGS),
        help="the worker pools worker_kills runs with, each in turn (default prefork; "
        "worker_kills_<pool> in the results for the others)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    previous = out / "faults.json"
    if args.only and previous.exists():  # a run of some scenarios keeps the others' last figures
        kept = json.loads(previous.read_text())
        if kept.get("smoke") == args.smoke:
            results.update(kept["results"])
    runs = []  # (result name, function, arguments)
    for name, (fn, long_kw, smoke_kw) in SCENARIOS.items():
        if (args.only and name not in args.only) or (args.smoke and not args.only and name not in SMOKE):
            continue
        kw = smoke_kw if args.smoke else long_kw
        if name != "worker_kills":
            runs.append((name, fn, kw))
            continue
        for pool in args.pools:
            runs.append((name if pool == "prefork" else f"{name}_{pool}", fn, {**kw, **POOL_ARGS[pool]}))
    for name, fn, kw in runs:
        results[name] = {}
        for transport in TRANSPORTS:
            with tempfile.TemporaryDirectory(prefix="pq-faults-") as tmp:
                result = fn(transport, Path(tmp), **kw)
            results[name][transport] = summary(result)
            print(name, transport, json.dumps(results[name][transport]), flush=True)
    if not args.only or "aof_kill_rounds" in args.only:
        rounds = args.aof_rounds or (1 if args.smoke else 10)
        results["aof_kill_rounds"] = {}
        for fsync in ("everysec", "always"):
            result = aof_kill_rounds(fsync=fsync, rounds=rounds)
            results["aof_kill_rounds"][fsync] = result
            print("aof_kill_rounds", fsync, json.dumps(result), flush=True)
    (out / "faults.json").write_text(json.dumps({"smoke": args.smoke, "results": results}, indent=2))
    (out / "faults.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
