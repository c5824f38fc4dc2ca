"""A pytest plugin: each test's final outcome, written as JSON to the file named in
``PQ_PEER_OUTCOMES`` when the session ends (``{"tests": {nodeid: {"outcome": ..., "seconds": ...,
"message": ...}}}``). Loaded with ``-p tests.peers.outcomes`` by ``python -m tests.peers.contract``,
which runs one suite against two brokers and compares the two files.

Outcomes: ``passed``, ``failed``, ``error`` (setup or teardown failed), ``skipped``, ``xfailed``,
``xpassed``. A test re-run by pytest-rerunfailures (Celery marks its flaky ones) counts by its
last run (its time is that of all its runs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

_seen: dict[str, dict] = {}


def _message(report) -> str:
    """The exception of a failure (its first line), cut short."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0][:300]
    text = str(getattr(report, "longrepr", "") or "").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def pytest_runtest_logreport(report):
    entry = _seen.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "message": "", "reruns": 0})
    entry["seconds"] = round(entry["seconds"] + report.duration, 2)
    if report.outcome == "rerun":  # pytest-rerunfailures: an earlier attempt; the next one decides
        entry.update(outcome="passed", message="", reruns=entry["reruns"] + 1)
        return
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            entry["outcome"] = "xpassed" if xfail else "passed"
        elif report.skipped:
            entry["outcome"] = "xfailed" if xfail else "skipped"
        else:
            entry["outcome"] = "failed"
            entry["message"] = _message(report)
    elif report.skipped:  # skipped (or xfailed) in setup
        entry["outcome"] = "xfailed" if xfail else "skipped"
    elif report.failed and entry["outcome"] not in ("failed", "error"):
        entry["outcome"] = "error"
        entry["message"] = f"{report.when}: {_message(report)}"


def pytest_sessionfinish(session):
    path = os.environ.get("PQ_PEER_OUTCOMES")
    if path:
        Path(path).write_text(json.dumps({"tests": _seen}, indent=1, sort_keys=True))
