"""Celery's own integration tests, unchanged, against kombu's ``redis://`` and against ``pq://`` in
the same run, compared: every test that passes with ``redis://`` must pass with ``pq://``.

    python -m tests.peers.contract [--tests PATH ...] [--cache DIR] [--out DIR] [--timeout S]
        [--sequential] [--no-again] [--listed FILE] [--compare-only] [-- PYTEST ARGS]

The two legs are ``python -m tests.peers.run celery --broker redis|pq --no-expected`` (each with a
redis-server of its own as broker and result backend, and Celery's prefork session worker), run at
the same time (``--sequential``: one after the other): they spend their time waiting on results,
not on the CPU. Each leg's pytest output goes to ``OUT/<broker>.log`` and each test's outcome to
``OUT/<broker>.json`` (the plugin ``tests/peers/outcomes.py``). Then a table of the counts per
broker, the tests whose outcome differs, and the verdict.

The run fails when a test that passed (or xpassed) with ``redis://`` does not pass with ``pq://``
(nor when run once more alone with ``pq://``, unless ``--no-again``), unless
``contract_expected.txt`` (beside ``expected_failures.txt``, same form) lists it with the reason;
and when a listed test passes with ``pq://`` (its line is stale), or a leg ran no test. A listed
reason that starts with ``race:`` names a race in the test itself, which either outcome may end:
that test is allowed to pass or fail with ``pq://``, and the run says which it did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version as installed_version
from pathlib import Path

from tests.peers.expected import expected_failures
from tests.peers.run import PEERS, ROOT, sdist, unpacked

TESTS = ("t/integration/test_tasks.py", "t/integration/test_canvas.py", "t/integration/test_inspect.py")
LISTED = Path(__file__).with_name("contract_expected.txt")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
#: a listed reason that starts so names a race in the test itself: it may pass or fail with pq://
RACE = "race:"
PASSING = ("passed", "xpassed")


@dataclass
class Leg:
    broker: str
    log: Path
    outcomes: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    tests: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def done(cls, broker: str, out: Path) -> Leg:
        """A leg of an earlier run, read back from ``out`` (``--compare-only``)."""
        leg = cls(broker, out / f"{broker}.log", out / f"{broker}.json")
        if leg.outcomes.exists():
            leg.tests = json.loads(leg.outcomes.read_text())["tests"]
        leg.seconds = sum(t["seconds"] for t in leg.tests.values())
        return leg

    @property
    def url(self) -> str:
        return f"{self.broker}://"

    def start(self, tests: tuple[str, ...], cache: Path, pytest_args: list[str]) -> None:
        self.outcomes.unlink(missing_ok=True)
        env = {**os.environ, "PQ_PEER_OUTCOMES": str(self.outcomes)}
        argv = [sys.executable, "-m", "tests.peers.run", "celery", "--cache", str(cache)]
        argv += ["--broker", self.broker, "--no-expected", "--tests", *tests, "--"]
        argv += ["-p", "tests.peers.outcomes", *pytest_args]
        print(f"contract: {self.url} leg started (log {self.log})", flush=True)
        self.started = time.monotonic()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait(self) -> int:
        assert self.proc is not None
        rc = self.proc.wait()
        self.seconds = time.monotonic() - self.started
        if self.outcomes.exists():
            self.tests = json.loads(self.outcomes.read_text())["tests"]
        closing = [line for line in self.log.read_text(errors="replace").splitlines() if line.startswith("=")]
        print(
            f"contract: {self.url} leg ended in {self.seconds / 60:.1f} min (pytest exit {rc}): "
            f"{closing[-1].strip('= ') if closing else 'no closing line'}",
            flush=True,
        )
        return rc

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests.values() if t["outcome"] == outcome)


def short(nodeid: str) -> str:
    """``t/integration/test_canvas.py::test_chord::test_x`` as ``test_canvas.py::test_chord::test_x``
    (the form of the expected-failure lists)."""
    path, sep, rest = nodeid.partition("::")
    return Path(path).name + sep + rest


def regressions(redis: Leg, pq: Leg, listed: dict[str, str]) -> list[str]:
    """The tests (node ids) that passed with redis:// and not with pq:// and are not listed."""
    return [
        n
        for n, t in sorted(redis.tests.items())
        if t["outcome"] in PASSING and pq.tests.get(n, {}).get("outcome") not in PASSING and short(n) not in listed
    ]


def run_again(pq: Leg, names: list[str], out: Path, cache: Path, pytest_args: list[str]) -> None:
    """Run ``names`` once more with pq://, alone (a fresh session worker); those that pass then
    count as passed, marked ``again``: a test that waits on a timeout can miss it on a loaded
    machine (the legs run beside the rest of CI), as Celery's own reruns of its flaky tests allow."""
    print(f"contract: {len(names)} test(s) passed with redis:// and not with pq://; running them again with pq://")
    again = Leg("pq", out / "pq-again.log", out / "pq-again.json")
    again.start(tuple(names), cache, pytest_args)
    again.wait()
    for name in names:
        if again.tests.get(name, {}).get("outcome") in PASSING:
            pq.tests[name] = {**again.tests[name], "again": pq.tests.get(name, {}).get("outcome", "not run")}


def compare(redis: Leg, pq: Leg, listed: dict[str, str]) -> list[str]:
    """Print the table and the differences; return the problems (empty: the contract holds)."""
    print()
    print(f"{'broker':<10}" + "".join(f"{o:>9}" for o in OUTCOMES) + f"{'minutes':>9}")
    for leg in (redis, pq):
        print(f"{leg.url:<10}" + "".join(f"{leg.count(o):>9}" for o in OUTCOMES) + f"{leg.seconds / 60:>9.1f}")
    problems = []
    for leg in (redis, pq):
        if not leg.tests:
            problems.append(f"the {leg.url} leg ran no test (see {leg.log})")
    names = sorted(set(redis.tests) | set(pq.tests))
    differ = [n for n in names if redis.tests.get(n, {}).get("outcome") != pq.tests.get(n, {}).get("outcome")]
    print(f"\ntests whose outcome differs ({len(differ)}):" if differ else "\nno test's outcome differs")
    for name in differ:
        was = redis.tests.get(name, {}).get("outcome", "not run")
        now = pq.tests.get(name, {}).get("outcome", "not run")
        reason = listed.get(short(name))
        if was in PASSING and now not in PASSING:
            note = f"listed: {reason}" if reason else "NOT LISTED: " + (pq.tests.get(name, {}).get("message") or "")
            if not reason:
                problems.append(f"{short(name)} passes with redis:// but is {now} with pq://")
        else:
            note = ""
        print(f"  {short(name)}: redis:// {was}, pq:// {now}" + (f"  ({note})" if note else ""))
    for name, t in sorted(pq.tests.items()):
        if "again" in t:
            print(f"  {short(name)}: pq:// {t['again']} in its leg, {t['outcome']} when run again alone")
    for name, reason in sorted(listed.items()):
        runs = [n for n in pq.tests if short(n) == name]
        if reason.startswith(RACE):
            outcomes = ", ".join(sorted({pq.tests[n]["outcome"] for n in runs})) or "not run"
            print(f"  (listed race {name}: {outcomes} with pq:// this run; either outcome is allowed)")
        elif any(pq.tests[n]["outcome"] in PASSING for n in runs):
            problems.append(f"{name} is listed in {LISTED.name} but passes with pq://: remove its line")
        elif runs and not any(redis.tests.get(n, {}).get("outcome") in PASSING for n in runs):
            print(f"  (listed {name} did not pass with redis:// either this run)")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m tests.peers.contract", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", nargs="+", metavar="PATH", default=list(TESTS), help="Celery's test files")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("PQ_PEER_CACHE") or ROOT / ".venv" / "peers"),
        help="where source distributions are kept (default: $PQ_PEER_CACHE or .venv/peers)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".venv" / "contract", help="logs and outcomes")
    parser.add_argument("--timeout", type=int, default=300, help="pytest-timeout's limit per test (seconds)")
    parser.add_argument("--sequential", action="store_true", help="run the legs one after the other")
    parser.add_argument(
        "--no-again", action="store_true", help="do not run the tests that failed only with pq:// once more"
    )
    parser.add_argument("--listed", type=Path, default=LISTED, help="the allowed failures (contract_expected.txt)")
    parser.add_argument(
        "--compare-only", action="store_true", help="run nothing: compare the outcomes of the last run in --out"
    )
    args = parser.parse_args(argv)
    if args.compare_only:
        return verdict(*[Leg.done(b, args.out.resolve()) for b in ("redis", "pq")], expected_failures(args.listed))
    peer = PEERS["celery"]
    cache = args.cache.resolve()
    version = installed_version(peer.dist)
    tree = unpacked(peer, sdist(peer, version, cache))  # once, before the legs start
    print(f"contract: Celery {version}'s {' '.join(args.tests)} from {tree}, redis:// and pq://", flush=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    legs = [Leg(b, out / f"{b}.log", out / f"{b}.json") for b in ("redis", "pq")]
    pytest_args = ["--timeout", str(args.timeout), "-rfE", "--durations=10", *extra]
    if args.sequential:
        for leg in legs:
            leg.start(tuple(args.tests), cache, pytest_args)
            leg.wait()
    else:
        for leg in legs:
            leg.start(tuple(args.tests), cache, pytest_args)
        for leg in legs:
            leg.wait()
    listed = expected_failures(args.listed)
    failing = regressions(*legs, listed)
    if failing and not args.no_again:
        run_again(legs[1], failing, out, cache, pytest_args)
    return verdict(*legs, listed)


def verdict(redis: Leg, pq: Leg, listed: dict[str, str]) -> int:
    problems = compare(redis, pq, listed)
    print()
    for problem in problems:
        print(f"contract FAILED: {problem}")
    kept = sum(1 for n, t in redis.tests.items() if t["outcome"] in PASSING)
    held = sum(
        1 for n in redis.tests if redis.tests[n]["outcome"] in PASSING and pq.tests.get(n, {}).get("outcome") in PASSING
    )
    print(
        f"contract: {held} of the {kept} tests that pass with redis:// pass with pq://; "
        f"{len(problems)} problem(s); logs in {pq.log.parent}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
