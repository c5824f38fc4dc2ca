"""``make bench``: every benchmark, each side by side with kombu's Redis transport.

    python -m benchmarks.run [--smoke] [--out DIR]

``--smoke`` runs each benchmark tiny (CI checks that they run and write their files; the
figures of a smoke run mean nothing).
"""

from __future__ import annotations

import argparse

from . import celery_e2e, fairness, latency, queue_api, throughput


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = ["--out", args.out] if args.out else []
    small = ["--messages", "5", "--repeat", "1"] if args.smoke else []
    latency.main(small + out)
    throughput.main((["--smoke"] if args.smoke else []) + out)
    fairness.main((["--smoke"] if args.smoke else []) + out)
    celery_e2e.main((["--smoke"] if args.smoke else []) + out)
    queue_api.main((["--smoke"] if args.smoke else []) + out)


if __name__ == "__main__":
    main()
