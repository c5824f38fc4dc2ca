"""The verdict of ``make contract`` (tests/peers/contract.py) on made-up outcomes of its two legs,
and the outcome plugin on a real pytest run (reruns count by their last run)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.peers import contract
from tests.peers.contract import Leg, compare, regressions

ROOT = Path(__file__).resolve().parents[2]
T = "t/integration/test_tasks.py::test_tasks::"


def leg(broker: str, outcomes: dict[str, str]) -> Leg:
    out = Leg(broker, Path(f"{broker}.log"), Path(f"{broker}.json"))
    out.tests = {T + name: {"outcome": o, "seconds": 1.0, "message": "boom"} for name, o in outcomes.items()}
    return out


def test_a_test_passing_with_redis_and_not_with_pq_fails_the_contract(capsys):
    redis = leg("redis", {"a": "passed", "b": "passed", "c": "failed", "d": "xpassed", "e": "skipped"})
    pq = leg("pq", {"a": "passed", "b": "failed", "c": "failed", "d": "passed", "e": "skipped"})
    assert compare(redis, pq, {}) == ["test_tasks.py::test_tasks::b passes with redis:// but is failed with pq://"]
    out = capsys.readouterr().out
    assert (
        "redis://" in out and "test_tasks.py::test_tasks::b: redis:// passed, pq:// failed  (NOT LISTED: boom)" in out
    )
    assert "::a:" not in out  # the same outcome on both: not a difference


def test_a_listed_test_is_allowed_and_a_stale_line_fails():
    redis = leg("redis", {"a": "passed", "b": "passed"})
    listed = {"test_tasks.py::test_tasks::a": "by design"}
    assert compare(redis, leg("pq", {"a": "failed", "b": "passed"}), listed) == []
    assert compare(redis, leg("pq", {"a": "error", "b": "passed"}), listed) == []
    [stale] = compare(redis, leg("pq", {"a": "passed", "b": "passed"}), listed)
    assert "is listed in contract_expected.txt but passes with pq://" in stale


def test_a_test_listed_as_a_race_may_pass_or_fail_with_pq(capsys):
    redis = leg("redis", {"a": "passed", "b": "passed"})
    listed = {"test_tasks.py::test_tasks::a": "race: the test sets its flag after the worker may have"}
    assert compare(redis, leg("pq", {"a": "failed", "b": "passed"}), listed) == []
    assert "(listed race test_tasks.py::test_tasks::a: failed with pq:// this run" in capsys.readouterr().out
    assert compare(redis, leg("pq", {"a": "passed", "b": "passed"}), listed) == []
    assert "(listed race test_tasks.py::test_tasks::a: passed with pq:// this run" in capsys.readouterr().out
    assert compare(redis, leg("pq", {"a": "passed", "b": "failed"}), listed) == [
        "test_tasks.py::test_tasks::b passes with redis:// but is failed with pq://"
    ]


def test_regressions_are_the_unlisted_tests_passing_only_with_redis_and_one_passing_again_counts(capsys):
    redis = leg("redis", {"a": "passed", "b": "passed", "c": "passed", "d": "failed"})
    pq = leg("pq", {"a": "failed", "b": "error", "c": "passed", "d": "failed"})
    assert regressions(redis, pq, {"test_tasks.py::test_tasks::b": "why"}) == [T + "a"]
    pq.tests[T + "a"] = {"outcome": "passed", "seconds": 1.0, "message": "", "again": "failed"}  # run_again's mark
    assert compare(redis, pq, {"test_tasks.py::test_tasks::b": "why"}) == []
    assert (
        "test_tasks.py::test_tasks::a: pq:// failed in its leg, passed when run again alone" in capsys.readouterr().out
    )


def test_a_test_missing_from_the_pq_leg_and_an_empty_leg_fail():
    redis = leg("redis", {"a": "passed"})
    assert compare(redis, leg("pq", {}), {}) == [
        "the pq:// leg ran no test (see pq.log)",
        "test_tasks.py::test_tasks::a passes with redis:// but is not run with pq://",
    ]


def test_the_list_of_allowed_failures_parses_and_gives_reasons():
    listed = contract.expected_failures(contract.LISTED)
    assert listed and all(name.count("::") >= 1 and reason for name, reason in listed.items())


def test_the_outcome_plugin_records_final_outcomes(tmp_path):
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent(
            """
            import pytest
            tries = []
            def test_ok(): pass
            def test_bad(): assert False, "nope"
            @pytest.mark.flaky(reruns=2)
            def test_second_try():
                tries.append(1)
                assert len(tries) > 1
            @pytest.mark.skip
            def test_skip(): pass
            @pytest.mark.xfail
            def test_xfail(): assert False
            @pytest.fixture
            def broken(): raise RuntimeError("setup")
            def test_error(broken): pass
            """
        )
    )
    out = tmp_path / "out.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.peers.outcomes", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PQ_PEER_OUTCOMES": str(out), "PATH": "/usr/bin:/bin"},
        check=False,
        capture_output=True,
    )
    got = {k.split("::")[1]: v for k, v in json.loads(out.read_text())["tests"].items()}
    assert {k: v["outcome"] for k, v in got.items()} == {
        "test_ok": "passed",
        "test_bad": "failed",
        "test_second_try": "passed",
        "test_skip": "skipped",
        "test_xfail": "xfailed",
        "test_error": "error",
    }
    assert got["test_second_try"]["reruns"] == 1 and "nope" in got["test_bad"]["message"]
