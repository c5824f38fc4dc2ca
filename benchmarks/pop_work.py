"""The work of consuming, counted rather than timed: what a Celery worker's pops cost inside Redis
(INFO commandstats: script calls, the Redis commands they run, microseconds) and in the worker's
main process (its CPU time per task), for N no-op tasks through a real worker.

Counts do not depend on how busy the machine is (the microseconds and CPU time do, less than a
wall clock rate): two trees are compared by running this once with each on PYTHONPATH (the
worker imports the tree given by --root).

    python benchmarks/pop_work.py [--root DIR] [--tasks 3000] [--pool prefork-2] [--json]
    python benchmarks/pop_work.py --pattern [--tasks 3000] [--take 2] [--callgrind]

``--pattern`` runs no worker: N entries are popped ``--take`` at a time through the queue API,
each pop acking the leases of the one before (a fixed pattern: the script's cost per call, in
commands and microseconds, alone on the machine's CPU with this process). ``--callgrind`` runs
that redis-server under valgrind's callgrind and gives the instructions of one call inside FCALL
(the run minus one without the pops): a count no other load on the machine moves.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import redis
from celery import Celery

import celery_pq  # noqa: F401  (pq://)
from celery_pq import Item
from celery_pq.testing import celery_env, start_worker
from celery_pq.testing.server import RedisServer

POOLS = {"solo": ("solo", 1), "prefork-2": ("prefork", 2)}
SCRIPT_CALLS = ("fcall", "evalsha")
#: Commands of the benchmark itself, not of the consumer's scripts (the task's INCRBY, our INFO);
#: our GETs of the task counter are counted and taken off the scripts' GETs.
OURS = ("incrby", "info", "config")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def callgrind_server() -> RedisServer:
    """A redis-server under valgrind's callgrind counting the instructions of FCALL alone (the
    scripts' work: not the network, not the event loop), written when it stops."""
    out = Path(tempfile.mkdtemp(prefix="pop-work-"))
    wrapper = out / "redis-server"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version|-v) exec {_redis_binary()} "$@";; esac\n'
        "exec valgrind --tool=callgrind --collect-atstart=no --toggle-collect=fcallCommand "
        f'--callgrind-out-file={out}/cg.%p.out {_redis_binary()} "$@"\n'
    )
    wrapper.chmod(0o755)
    server = RedisServer(binary=str(wrapper))
    server.callgrind_dir = out  # type: ignore[attr-defined]
    return server


def _redis_binary() -> str:
    from celery_pq.testing.server import find_redis_server

    return find_redis_server()


def callgrind_total(server) -> int:
    """The instructions a callgrind_server counted (after it stopped)."""
    for _ in range(100):
        for f in server.callgrind_dir.glob("cg.*.out"):
            for line in f.read_text().splitlines():
                if line.startswith("totals:"):
                    return int(line.split()[1])
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no totals")


def commandstats(client) -> dict:
    return {k.removeprefix("cmdstat_"): v for k, v in client.info("commandstats").items()}


def run(root: Path, tasks: int, pool: str, callgrind: bool = False, consume: bool = True) -> dict:
    server = callgrind_server() if callgrind else RedisServer()
    with server:
        url = f"pq://127.0.0.1:{server.port}/0"
        options = {"key_prefix": "bench"}
        rec = redis.Redis(port=server.port)
        app = Celery("pop-work-fill", broker=url)
        app.conf.broker_transport_options = options
        with app.connection_for_write() as conn:
            producer = conn.Producer()
            for _ in range(tasks):
                app.send_task("bench.noop", queue="bench", producer=producer)
        app.close()
        if not consume:  # (the baseline of --callgrind: the fill alone)
            rec.close()
            server.stop()
            return {"instructions": callgrind_total(server)}
        env = celery_env(
            root,
            BENCH_BROKER=url,
            BENCH_OPTIONS=json.dumps(options),
            BENCH_RECORD=f"redis://127.0.0.1:{server.port}/0",
        )
        worker = start_worker(
            "benchmarks.celery_app",
            cwd=root,
            env=env,
            queues="bench",
            pool=POOLS[pool][0],
            concurrency=POOLS[pool][1],
            loglevel="warning",
        )
        gets = [0]
        redis_pid = server.process.pid

        def done_now() -> int:
            gets[0] += 1
            return int(rec.get("bench:done") or 0)

        try:
            deadline = time.monotonic() + 300
            while done_now() < 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            cpu0, stats0, rcpu0 = cpu_seconds(worker.pid), commandstats(rec), cpu_seconds(redis_pid)
            gets[0] = 0
            first = done_now()
            while done_now() < tasks and time.monotonic() < deadline:
                time.sleep(0.005)
            cpu1, stats1, rcpu1 = cpu_seconds(worker.pid), commandstats(rec), cpu_seconds(redis_pid)
            last = done_now()
            gets[0] -= 1  # (that last GET came after the statistics were read)
        finally:
            worker.stop()
            rec.close()
    done = last - first
    diff = _diff(stats0, stats1, gets[0])
    pops = sum(diff.get(c, {}).get("calls", 0) for c in SCRIPT_CALLS)
    script_usec = sum(diff.get(c, {}).get("usec", 0) for c in SCRIPT_CALLS)
    inner = {n: d for n, d in diff.items() if n not in SCRIPT_CALLS}
    if callgrind:  # every script call of the run (fill, start-up, consuming) less the fill's
        base = run(root, tasks, pool, callgrind=True, consume=False)["instructions"]
        cost = (callgrind_total(server) - base) / done
        return {"tasks": done, "script_calls": pops, "instructions_per_task": round(cost)}
    return {
        "tasks": done,
        "script_calls": pops,
        "script_usec_per_call": script_usec / pops if pops else 0.0,
        "script_usec_per_task": script_usec / done if done else 0.0,
        "commands_per_call": sum(d["calls"] for d in inner.values()) / pops if pops else 0.0,
        "commands_per_task": sum(d["calls"] for d in inner.values()) / done if done else 0.0,
        "per_call": {n: round(d["calls"] / pops, 2) for n, d in sorted(inner.items())} if pops else {},
        "main_cpu_us_per_task": 1e6 * (cpu1 - cpu0) / done if done else 0.0,
        "redis_cpu_us_per_task": 1e6 * (rcpu1 - rcpu0) / done if done else 0.0,
    }


def run_pattern(tasks: int, take: int, callgrind: bool = False, pop: bool = True) -> dict:
    from celery_pq.queue import QueueSettings, open_queue

    server = callgrind_server() if callgrind else RedisServer()
    with server:
        client = redis.Redis(port=server.port)
        q = open_queue(client, "work", QueueSettings(key_prefix="bench"))
        for start in range(0, tasks, 500):
            q.insert_many([Item(b"x" * 200, 0) for _ in range(min(500, tasks - start))])
        q.pop(1, acks=[])  # (the functions loaded, the queue's first leases made)
        acks: list = []
        stats0, rcpu0, cpu0 = commandstats(client), cpu_seconds(server.process.pid), time.process_time()
        pops = 0
        while pop:
            got = q.pop(take, acks=acks)
            pops += 1
            acks = [(lease.id, lease.token) for lease in got]
            if not got:
                break
        stats1, rcpu1, cpu1 = commandstats(client), cpu_seconds(server.process.pid), time.process_time()
        client.close()
    if not pop:
        return {"instructions": callgrind_total(server)}
    diff = _diff(stats0, stats1, 0)
    calls = sum(diff.get(c, {}).get("calls", 0) for c in SCRIPT_CALLS)
    usec = sum(diff.get(c, {}).get("usec", 0) for c in SCRIPT_CALLS)
    inner = {n: d for n, d in diff.items() if n not in SCRIPT_CALLS}
    data = {
        "pops": pops,
        "take": take,
        "script_usec_per_call": usec / calls,
        "commands_per_call": sum(d["calls"] for d in inner.values()) / calls,
        "per_call": {n: round(d["calls"] / calls, 2) for n, d in sorted(inner.items())},
        "redis_cpu_us_per_call": 1e6 * (rcpu1 - rcpu0) / calls,
        "client_cpu_us_per_call": 1e6 * (cpu1 - cpu0) / calls,
    }
    if callgrind:  # the same run without the pops: what the inserts and the first pop cost
        base = run_pattern(tasks, take, callgrind=True, pop=False)["instructions"]
        data["instructions_per_call"] = round((callgrind_total(server) - base) / calls)
        data["usec_note"] = "under valgrind: the microseconds mean nothing"
    return data


def _diff(stats0: dict, stats1: dict, own_gets: int) -> dict:
    diff = {}
    for name, s in stats1.items():
        calls = s["calls"] - stats0.get(name, {}).get("calls", 0)
        usec = s["usec"] - stats0.get(name, {}).get("usec", 0)
        if name == "get":
            calls -= own_gets
        if calls and name not in OURS:
            diff[name] = {"calls": calls, "usec": usec}
    return diff


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--pool", choices=sorted(POOLS), default="prefork-2")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--pattern", action="store_true", help="the queue API's fixed pattern, no worker")
    parser.add_argument("--take", type=int, default=2, help="entries per pop in --pattern")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="redis-server under callgrind: the scripts' instructions per call (--pattern) or per task",
    )
    args = parser.parse_args(argv)
    if args.pattern:
        print(json.dumps(run_pattern(args.tasks, args.take, args.callgrind)))
        return
    data = run(args.root.resolve(), args.tasks, args.pool, args.callgrind)
    if args.callgrind:
        print(json.dumps(data))
        return
    if args.json:
        print(json.dumps(data))
        return
    print(f"{data['tasks']} tasks, {data['script_calls']} script calls")
    print(f"script usec per call {data['script_usec_per_call']:.2f}, per task {data['script_usec_per_task']:.2f}")
    print(f"Redis commands per call {data['commands_per_call']:.2f}: {data['per_call']}")
    print(f"worker main process CPU per task {data['main_cpu_us_per_task']:.1f} us")
    print(f"redis-server CPU per task {data['redis_cpu_us_per_task']:.1f} us")


if __name__ == "__main__":
    main()
