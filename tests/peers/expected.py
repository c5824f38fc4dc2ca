"""A pytest plugin: the peer tests listed in ``expected_failures.txt`` are strict expected
failures, with the reason given there. Loaded by ``tests/peers/conftest.py`` for the suites run
through our own files (kombu's), and by ``-p tests.peers.expected`` for a suite run from its own
tree with its own conftest (Celery's)."""

from __future__ import annotations

from pathlib import Path

import pytest

EXPECTED = Path(__file__).with_name("expected_failures.txt")


def expected_failures(path: Path = EXPECTED) -> dict[str, str]:
    """{test id as ``file::Class::test``: reason} of the list."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test, bar, reason = line.partition(" | ")
        if not bar or not reason.strip():
            raise ValueError(f"{path}:{n}: a line is 'file::Class::test | reason', not {line!r}")
        out[test.strip()] = reason.strip()
    return out


def pytest_collection_modifyitems(config, items):
    listed = expected_failures()
    for item in items:
        path, sep, rest = item.nodeid.partition("::")
        reason = listed.get(Path(path).name + sep + rest)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
