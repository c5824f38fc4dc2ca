"""A/B: the benchmarks on the tree before a change and on the tree after, alternately, in one session.

    python -m benchmarks.ab --before REV [--after REV|worktree] [--only NAME,...] [--repeat N] [--smoke] [--out DIR]

``--before REV`` (and ``--after REV``) is checked out in a temporary git worktree, removed at the
end; ``--after worktree`` (the default) is this checkout as it stands, uncommitted changes included.
Each repetition runs each chosen benchmark once on each tree, back to back, the order of the two
trees swapped every repetition so that the machine's noise falls on both alike. A run is a child
process with its tree alone on PYTHONPATH, calling that tree's own benchmark module
(``main([..., "--out", TMP])``: the benchmark code matches the package it measures) with one
repetition inside (``--repeat 1`` where the module has it); the child prints the celery_pq it
imported, and a run that imported another tree's stops the A/B. The child also turns the RabbitMQ
columns off (``common.rabbitmq_url`` answers None, in any tree): the A/B compares our trees alone.

For each figure: celery-pq's median over the repetitions and their spread (min..max) on each tree,
the same of its ratio against the reference measured in the same run (kombu's Redis transport; for
fairness, the queue without the flood and the 5-tenant queue), and whether the after tree's median
ratio lies within the before tree's spread. Written to results/ab.md and ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .common import median, table, write_results

ROOT = Path(__file__).resolve().parent.parent
HIGHER, LOWER = "higher", "lower"
KOMBU = "kombu-redis, same run"

#: label -> (unit, which is better, celery-pq's value, the reference's value)
Figures = dict[str, tuple[str, str, float, float]]


def _pair(row: dict) -> tuple[float, float]:
    return row["celery-pq"], row["kombu-redis"]


def _throughput(d: dict) -> Figures:
    return {fig: ("msg/s", HIGHER, *_pair(r["per_second"])) for fig, r in d["results"].items()}


def _celery_e2e(d: dict) -> Figures:
    rows = d["results"].items()
    figures = {f"Celery {row}": ("tasks/s", HIGHER, *_pair(r["tasks_per_second"])) for row, r in rows}
    for row, r in rows:  # the same rates against the ceiling, kombu's in-process memory:// (not every row)
        rate = r["tasks_per_second"]
        if "memory" in rate:
            figures[f"Celery {row}, of memory://"] = ("tasks/s", HIGHER, rate["celery-pq"], rate["memory"])
    return figures


def _latency(d: dict) -> Figures:
    r = d["results"]
    return {
        f"{p}{via}": ("ms", LOWER, r["celery-pq" + via][f"{p}_ms"], r["kombu-redis" + via][f"{p}_ms"])
        for via in ("", " (Celery worker)")
        for p in ("p50", "p99")
    }


def _fairness(d: dict) -> Figures:
    s = d["summary"]
    return {
        "quiet tenant's p99 wait, flood / none": ("ms", LOWER, s["quiet_p99_flood_ms"], s["quiet_p99_calm_ms"]),
        "pop+ack at the client, many tenants / 5": (
            "us",
            LOWER,
            s["pop_ack_us_many_tenants"],
            s["pop_ack_us_5_tenants"],
        ),
        "pop+ack in Redis, many tenants / 5": (
            "us",
            LOWER,
            s["pop_ack_redis_us_many_tenants"],
            s["pop_ack_redis_us_5_tenants"],
        ),
    }


def _memory(d: dict) -> Figures:
    return {
        f"{size} task": ("bytes/task", LOWER, r["celery-pq"]["bytes_per_task"], r["kombu-redis"]["bytes_per_task"])
        for size, r in d["results"].items()
    }


#: module -> (its arguments for one repetition, what its ratios are against, its figures from its JSON)
BENCHMARKS: dict[str, tuple[list[str], str, Callable[[dict], Figures]]] = {
    "throughput": (["--repeat", "1"], KOMBU, _throughput),
    "celery_e2e": (["--repeat", "1"], KOMBU + " (rows 'of memory://': kombu's memory://, same run)", _celery_e2e),
    "latency": (["--repeat", "1"], KOMBU, _latency),
    "fairness": ([], "the same figure without the flood / with 5 tenants, same run", _fairness),
    "memory_tasks": ([], KOMBU, _memory),
}

#: run in the child: say which celery_pq was imported, no RabbitMQ, then the benchmark's own entry point
CHILD = """
import importlib, sys
import celery_pq, benchmarks.common
print("celery_pq imported from", celery_pq.__file__, flush=True)
benchmarks.common.rabbitmq_url = lambda: None
importlib.import_module("benchmarks." + sys.argv[1]).main(sys.argv[2:])
"""
IMPORTED = "celery_pq imported from "


def git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextmanager
def checkout(rev: str) -> Iterator[tuple[Path, str]]:
    """(directory, description) of ``rev`` in a temporary worktree, or of this checkout for "worktree"."""
    if rev == "worktree":
        dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        yield ROOT, f"this worktree at {git('rev-parse', '--short', 'HEAD')}{dirty}"
        return
    commit = git("rev-parse", "--short", f"{rev}^{{commit}}")
    path = Path(tempfile.mkdtemp(prefix=f"pq-ab-{commit}-"))
    path.rmdir()  # a fresh name: git makes the directory, and nothing is left when it cannot
    git("worktree", "add", "--detach", str(path), commit)
    try:
        yield path, commit if rev.startswith(commit) else f"{rev} ({commit})"
    finally:
        git("worktree", "remove", "--force", str(path))


def run_once(tree: Path, name: str, smoke: bool) -> tuple[dict, float, str]:
    """One run of benchmark ``name`` on ``tree``: (its JSON, wall seconds, the celery_pq it imported)."""
    args = BENCHMARKS[name][0] + (["--smoke"] if smoke else [])
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory(prefix="pq-ab-out-") as out:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, name, *args, "--out", out], cwd=tree, env=env, capture_output=True, text=True
        )
        seconds = time.monotonic() - start
        if proc.returncode:
            sys.exit(f"{name} failed on {tree} (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        imported = next((line[len(IMPORTED) :] for line in proc.stdout.splitlines() if line.startswith(IMPORTED)), "")
        if not Path(imported).resolve().is_relative_to(tree.resolve()):
            sys.exit(f"{name} on {tree} imported celery_pq from {imported or 'nowhere'}")
        # recorded relative to its tree: the results name no machine's paths
        imported = Path(imported).resolve().relative_to(tree.resolve()).as_posix()
        return json.loads((Path(out) / f"{name}.json").read_text()), seconds, imported


def spread(values: list[float]) -> dict:
    return {"median": median(values), "min": min(values), "max": max(values)}


def verdict(before: list[float], after: list[float], better: str) -> str:
    """Where the after tree's median lies against the before tree's spread: within, better or worse."""
    m = median(after)
    if min(before) <= m <= max(before):
        return "within"
    return "better" if (m > max(before)) == (better == HIGHER) else "worse"


def summarize(fig: dict) -> dict:
    """Medians and spreads of one figure's runs (``{side: {"values", "references"}}``) and the verdict."""
    ratios = {
        side: [v / r for v, r in zip(fig[side]["values"], fig[side]["references"])] for side in ("before", "after")
    }
    out: dict = {side: {"value": spread(fig[side]["values"]), "ratio": spread(ratios[side])} for side in ratios}
    out["verdict"] = verdict(ratios["before"], ratios["after"], fig["better"])
    return out


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _cell(s: dict, fmt: Callable[[float], str] = _num) -> str:
    return f"{fmt(s['median'])} ({fmt(s['min'])}..{fmt(s['max'])})"


def markdown(data: dict) -> list[str]:
    ratio = "{:.2f}".format
    lines = [
        f"# A/B of the benchmarks: {data['repeat']} repetition(s), the two trees alternated",
        "",
        f"- before: {data['before']['tree']}, celery_pq from the tree's `{data['before']['celery_pq']}`",
        f"- after: {data['after']['tree']}, celery_pq from the tree's `{data['after']['celery_pq']}`",
        "",
        "Each cell: median (min..max) over the repetitions. Verdict: the after median ratio within the "
        "before spread, or outside it on the better or worse side.",
    ]
    if data["smoke"]:
        lines += ["", "**Smoke run: tiny sizes, the figures mean nothing.**"]
    for name, bench in data["benchmarks"].items():
        rows = [
            [
                label,
                f["unit"],
                f["better"],
                _cell(f["summary"]["before"]["value"]),
                _cell(f["summary"]["after"]["value"]),
                _cell(f["summary"]["before"]["ratio"], ratio),
                _cell(f["summary"]["after"]["ratio"], ratio),
                f["summary"]["verdict"],
            ]
            for label, f in bench["figures"].items()
        ]
        secs = {side: median(s) for side, s in bench["seconds"].items()}
        lines += [
            "",
            f"## {name}",
            "",
            f"Ratio: celery-pq against {bench['against']}. Seconds per run: before {secs['before']:.0f}, "
            f"after {secs['after']:.0f}.",
            "",
            *table(
                ["figure", "unit", "better", "before", "after", "ratio before", "ratio after", "verdict"], rows, left=3
            ),
        ]
    return lines


def ab(before: str, after: str, names: list[str], repeat: int, smoke: bool) -> dict:
    benchmarks: dict = {
        n: {"against": BENCHMARKS[n][1], "seconds": {"before": [], "after": []}, "figures": {}} for n in names
    }
    with checkout(before) as (before_dir, before_tree), checkout(after) as (after_dir, after_tree):
        trees = {"before": before_dir, "after": after_dir}
        imported = {}
        for rep in range(repeat):
            for name in names:
                for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                    data, seconds, imported[side] = run_once(trees[side], name, smoke)
                    print(f"repetition {rep + 1}/{repeat}: {name} on {side} in {seconds:.0f} s", flush=True)
                    bench = benchmarks[name]
                    bench["seconds"][side].append(seconds)
                    for label, (unit, better, value, ref) in BENCHMARKS[name][2](data).items():
                        fig = bench["figures"].setdefault(
                            label,
                            {
                                "unit": unit,
                                "better": better,
                                "before": {"values": [], "references": []},
                                "after": {"values": [], "references": []},
                            },
                        )
                        fig[side]["values"].append(value)
                        fig[side]["references"].append(ref)
    for bench in benchmarks.values():
        for fig in bench["figures"].values():
            fig["summary"] = summarize(fig)
    return {
        "before": {"rev": before, "tree": before_tree, "celery_pq": imported["before"]},
        "after": {"rev": after, "tree": after_tree, "celery_pq": imported["after"]},
        "repeat": repeat,
        "smoke": smoke,
        "benchmarks": benchmarks,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the tree before")
    ap.add_argument("--after", default="worktree", help="git revision, or 'worktree' (default): this checkout")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated, of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each benchmark on each tree (default 5)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the A/B runs, figures mean nothing")
    ap.add_argument("--out", default=None, help="directory for ab.md and ab.json (default benchmarks/results)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(BENCHMARKS)
    if unknown or not names or args.repeat < 1:
        ap.error(f"--only takes some of {', '.join(BENCHMARKS)} (unknown: {', '.join(sorted(unknown))}); --repeat >= 1")
    data = ab(args.before, args.after, names, args.repeat, args.smoke)
    md = "\n".join(markdown(data)) + "\n"
    path = write_results("ab", data, md, args.out)
    print(md)
    print(f"written: {path}")
    return data


if __name__ == "__main__":
    main()
