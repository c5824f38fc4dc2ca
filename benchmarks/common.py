"""Shared pieces of the benchmarks: a private redis-server, transports to compare, stats."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import redis

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server():
    """A redis-server of our own on a free port, no persistence; yields its port."""
    binary = os.environ.get("PQ_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise SystemExit("redis-server not found: install it (apt-get install redis-server) or set PQ_REDIS_SERVER")
    tmp = tempfile.mkdtemp(prefix="pq-bench-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def transports(port: int) -> dict:
    """name -> (broker URL, kombu connection kwargs)."""
    return {
        "celery-pq": (f"pq://127.0.0.1:{port}/0", {"transport_options": {"key_prefix": "bench"}}),
        "kombu-redis": (f"redis://127.0.0.1:{port}/0", {}),
    }


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


def now_ns() -> int:
    """System-wide monotonic clock (comparable across processes on one Linux machine)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def cli(argv, doc: str, name: str, run, markdown, *, options=(), smoke=None, run_gets_out=False):
    """The command line of one benchmark: parse ``options`` (``(flag, type, default)``) plus
    ``--smoke`` and ``--out``, call ``run(**values)``, write ``results/<name>.json`` and ``.md``.
    ``smoke`` maps option names to the values of a tiny run; with ``run_gets_out`` the results
    directory is passed to ``run`` as ``out`` too (for files beside the JSON and Markdown)."""
    ap = argparse.ArgumentParser(description=doc)
    for flag, kind, default in options:
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
    md = markdown(data)
    path = write_results(name, data, md, out)
    print(md)
    print(f"written: {path}")
    return data
