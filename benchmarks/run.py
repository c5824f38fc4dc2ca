"""``make bench``: every benchmark, each side by side with kombu's Redis transport.

    python -m benchmarks.run [--large] [--smoke] [--out DIR]

``--smoke`` runs each benchmark tiny (CI checks that they run and write their files; the
figures of a smoke run mean nothing). ``--large`` measures the queue API's flat costs at
10,000,000 waiting entries (instead of 1,000,000) and fair pops over 100,000 tenants (instead of
5,000): about 3 GB of Redis memory and several more minutes (``make bench BENCH_ARGS=--large``).
``slowlog`` (the longest script call under the worst cases for work per call, each under 10 ms)
runs at its full size, 120,000 entries and a million publish ids, in every run but ``--smoke``.
"""

from __future__ import annotations

import argparse

from . import (
    bulk,
    celery_e2e,
    codec_cpu,
    events_cost,
    fairness,
    faults,
    latency,
    memory_tasks,
    on_time,
    peers,
    publish_batch,
    queue_api,
    rate_limits,
    relaxed,
    slowlog,
    spark_bulk,
    throughput,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = ["--out", args.out] if args.out else []
    flags = (["--smoke"] if args.smoke else []) + out
    for bench in (
        latency,
        on_time,
        throughput,
        publish_batch,
        events_cost,
        fairness,
        celery_e2e,
        queue_api,
        memory_tasks,
        codec_cpu,
        bulk,
        peers,
        spark_bulk,
        faults,
        relaxed,
        slowlog,
        rate_limits,
    ):
        bench.main(flags + (["--large"] if args.large and bench in (fairness, queue_api) else []))


if __name__ == "__main__":
    main()
