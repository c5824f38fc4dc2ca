"""celery_pq.testing's wait_for and celery_env: the one polling loop and a subprocess's environment."""

import os

import pytest

from celery_pq.testing import WaitTimeout, celery_env, wait_for


def test_wait_for_returns_the_first_true_value_of_the_predicate():
    calls = iter([0, None, "", "found"])
    assert wait_for(lambda: next(calls), 5, interval=0) == "found"


def test_wait_for_names_what_it_waited_for_at_the_timeout_and_is_an_assertion_error():
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for the thing") as raised:
        wait_for(lambda: False, 0.05, "the thing", interval=0.01)
    assert isinstance(raised.value, AssertionError)


def test_wait_for_makes_its_message_at_the_timeout_from_a_function():
    seen = []
    with pytest.raises(WaitTimeout, match="the log: 3 lines"):
        wait_for(lambda: seen.append(1), 0.05, lambda: f"the log: {len(seen[:3])} lines", interval=0.01)


def test_an_exception_of_the_predicate_goes_through_at_once():
    def boom():
        raise KeyError("gone")

    with pytest.raises(KeyError):
        wait_for(boom, 60)


def test_celery_env_puts_the_root_first_on_pythonpath_and_sets_the_variables(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = celery_env("/repo", PQ_X="1")
    assert env["PYTHONPATH"] == os.pathsep.join(["/repo", "/elsewhere"]) and env["PQ_X"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert celery_env("/repo")["PYTHONPATH"] == "/repo"
