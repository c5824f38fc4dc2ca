"""Shared pieces of the benchmarks: a private redis-server, transports to compare, stats, the
command line and the Markdown of the results."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

from celery_pq.testing import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def redis_server():
    """A redis-server of our own on a free port, no persistence (celery_pq.testing); yields its port."""
    with RedisServer() as server:
        yield server.port


def transports(port: int) -> dict:
    """name -> (broker URL, kombu connection kwargs)."""
    return {
        "celery-pq": (f"pq://127.0.0.1:{port}/0", {"transport_options": {"key_prefix": "bench"}}),
        "kombu-redis": (f"redis://127.0.0.1:{port}/0", {}),
    }


def data_memory(client) -> int:
    """Redis memory held by the data: INFO's ``used_memory`` less what its clients' buffers hold
    (``mem_clients_normal``). A connection's query or reply buffer (some 20 KB after a burst of
    commands) is freed or kept from one reading to the next whichever transport made it, which
    moved a figure per task by up to half a byte over 50,000 tasks."""
    info = client.info("memory")
    return info["used_memory"] - info.get("mem_clients_normal", 0)


def rabbitmq_url() -> str | None:
    """RabbitMQ on localhost (guest/guest), or None when it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            pass
    except OSError:
        return None
    return "amqp://guest:guest@127.0.0.1:5672//"


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median(values):
    return statistics.median(values)


def write_results(name: str, data: dict, markdown: str, out: Path | None = None) -> Path:
    out = Path(out) if out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    path = out / f"{name}.md"
    path.write_text(markdown)
    return path


class RedisTime:
    """Redis's own time spent in script calls (INFO commandstats of FCALL and EVALSHA), from
    ``start()`` to ``per_call(calls)``: the microseconds the server spent per operation,
    without the client and the loopback. ``start`` resets the server's statistics."""

    COMMANDS = ("cmdstat_fcall", "cmdstat_evalsha")

    def __init__(self, client):
        self.client = client

    def start(self) -> None:
        self.client.config_resetstat()

    def per_call(self, calls: int) -> float:
        stats = self.client.info("commandstats")
        return sum(stats.get(c, {}).get("usec", 0) for c in self.COMMANDS) / calls


def now_ns() -> int:
    """System-wide monotonic clock (comparable across processes on one Linux machine)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def table(head, rows, left: int = 1) -> list[str]:
    """A Markdown table: ``head`` and each of ``rows`` are lists of cells (already formatted);
    the first ``left`` columns align left, the others right (figures)."""

    def line(cells):
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return [line(head), line(["---"] * left + ["---:"] * (len(head) - left)), *map(line, rows)]


def versus_table(first: str, unit: str, results: dict, figures: str, target) -> list[str]:
    """The Markdown table of celery-pq against kombu-redis (and RabbitMQ when it answered): one row
    per item of ``results``, whose ``figures`` field maps each transport to a rate in ``unit``;
    ``target(name)`` is the ratio that row aims at."""
    rows = []
    for name, row in results.items():
        rate = row[figures]
        rows.append(
            [
                name,
                f"{rate['celery-pq']:.0f}",
                f"{rate['kombu-redis']:.0f}",
                f"{row['ratio']:.2f}",
                f">= {target(name)}",
                f"{rate['rabbitmq']:.0f}" if "rabbitmq" in rate else "not reachable",
            ]
        )
    return table(
        [first, f"celery-pq {unit}", f"kombu-redis {unit}", "ratio", "target", f"RabbitMQ (priority queue) {unit}"],
        rows,
    )


def cli(argv, doc: str, name: str, run, markdown, *, options=(), smoke=None, run_gets_out=False):
    """The command line of one benchmark: parse ``options`` (``(flag, type, default)``) plus
    ``--smoke`` and ``--out``; a ``bool`` option is a switch), call ``run(**values)``, write ``results/<name>.json`` and ``.md``
    (``markdown(data)`` gives the lines of the latter).
    ``smoke`` maps option names to the values of a tiny run; with ``run_gets_out`` the results
    directory is passed to ``run`` as ``out`` too (for files beside the JSON and Markdown)."""
    ap = argparse.ArgumentParser(description=doc)
    for flag, kind, default in options:
        if kind is bool:  # a switch: present or not
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--smoke", action="store_true", help="a tiny run: checks it runs, figures mean nothing")
    ap.add_argument("--out", default=None, help="directory for the results (default benchmarks/results)")
    args = vars(ap.parse_args(argv))
    out, is_smoke = args.pop("out"), args.pop("smoke")
    if is_smoke:
        args.update(smoke or {})
    if run_gets_out:
        args["out"] = out
    data = run(**args)
    md = "\n".join(markdown(data)) + "\n"
    path = write_results(name, data, md, out)
    print(md)
    print(f"written: {path}")
    return data
