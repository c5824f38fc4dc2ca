"""Bulk insert: entries/s through ``PriorityQueue.insert_many`` (batched insert scripts, sent as
pipelined EVALSHA) against the ceiling ``redis-benchmark`` reaches with the same script and the
same batch on the same server (many connections, pipelined: the client is not the limit).

    python -m benchmarks.bulk [--entries 200000] [--batch 100] [--smoke] [--out DIR]
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time

import redis

from celery_pq import Item
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.scripts import get_scripts, library

from .common import cli, median, redis_server, table

PAYLOAD = b"x" * 256


def ours(client, entries, batch) -> float:
    q = open_queue(client, "bulk-ours", QueueSettings(key_prefix="bulk"))
    q.delete()
    items = [Item(PAYLOAD, i % 256) for i in range(entries)]
    start = time.perf_counter()
    for i in range(0, entries, 50 * batch):  # 50 script calls per round trip
        q.insert_many(items[i : i + 50 * batch], chunk=batch)
    rate = entries / (time.perf_counter() - start)
    q.delete()
    return rate


def ceiling(port, client, entries, batch) -> float | None:
    binary = shutil.which("redis-benchmark")
    if not binary:
        return None
    q = open_queue(client, "bulk-ceiling", QueueSettings(key_prefix="bulk"))
    q.delete()
    # the same form our calls take: a function of the library (Redis 7+), else the script by sha
    try:
        client.function_load(library().text, replace=True)
        call = ["FCALL", library().functions["insert"]]
    except redis.ResponseError:
        client.script_load(get_scripts(client).insert.script)
        call = ["EVALSHA", get_scripts(client).insert.sha]
    # "0": due now, "": no expiry; no publish ids (every call sends the same arguments, and a publish id would
    # make each repeat store nothing), so the ceiling does less work per entry than insert_many
    _, keys, args = q._scripts.insert_call([(Item(PAYLOAD.decode(), 5), None)] * batch)  # the raw call
    calls = max(1, entries // batch)
    out = subprocess.run(
        [
            binary,
            "-p",
            str(port),
            "-n",
            str(calls),
            "-c",
            "8",
            "-P",
            "16",
            "--csv",
            *call,
            str(len(keys)),
            *keys,
            *[str(a) for a in args],
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = [r for r in csv.reader(io.StringIO(out.stdout)) if len(r) > 1 and r[0] != "test"]
    q.delete()
    return float(rows[-1][1]) * batch if rows else None


def run(entries=200_000, batch=100, repeat=3) -> dict:
    got = {"ours": [], "ceiling": []}
    with redis_server() as port:
        client = redis.Redis(port=port)
        for _ in range(repeat):
            got["ours"].append(ours(client, entries, batch))
            c = ceiling(port, client, entries, batch)
            if c:
                got["ceiling"].append(c)
    result = {"entries": entries, "batch": batch, "repeat": repeat, "runs": got, "ours_per_second": median(got["ours"])}
    if got["ceiling"]:
        result["ceiling_per_second"] = median(got["ceiling"])
        result["share_of_ceiling"] = result["ours_per_second"] / result["ceiling_per_second"]
    return result


def markdown(d) -> list[str]:
    ours = f"{d['ours_per_second']:.0f}"
    if "ceiling_per_second" in d:
        row = [ours, f"{d['ceiling_per_second']:.0f}", f"{100 * d['share_of_ceiling']:.0f}%"]
    else:
        row = [ours, "redis-benchmark not found", "-"]
    return [
        f"# Bulk insert ({d['entries']:,} entries of 256 bytes, {d['batch']} per script call)",
        "",
        *table(["insert_many entries/s", "redis-benchmark ceiling entries/s", "share (target >= 50%)"], [row], left=0),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "bulk",
        run,
        markdown,
        options=[("--entries", int, 200_000), ("--batch", int, 100), ("--repeat", int, 3)],
        smoke={"entries": 2_000, "repeat": 1},
    )


if __name__ == "__main__":
    main()
