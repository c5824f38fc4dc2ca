"""``make bench``: every benchmark, each side by side with kombu's Redis transport.

    python -m benchmarks.run [--smoke] [--out DIR]

``--smoke`` runs each benchmark tiny (CI checks that they run and write their files; the
figures of a smoke run mean nothing).
"""

from __future__ import annotations

import argparse

from . import (bulk, celery_e2e, codec_cpu, events_cost, fairness, faults, latency, memory_tasks, peers, queue_api,
               relaxed, spark_bulk, throughput)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = ["--out", args.out] if args.out else []
    flags = (["--smoke"] if args.smoke else []) + out
    for bench in (latency, throughput, events_cost, fairness, celery_e2e, queue_api, memory_tasks, codec_cpu, bulk,
                  peers, spark_bulk, faults, relaxed):
        bench.main(flags)


if __name__ == "__main__":
    main()
