"""The transport options: README.md's table and ``celery_pq.transport.options.Options`` agree (no Redis)."""

import ast
import logging
import re
from dataclasses import fields
from pathlib import Path

import pytest

from celery_pq import ConfigError
from celery_pq.transport.options import Options

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_options() -> dict[str, str]:
    """{option: default as the table shows it} of README.md's option table."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("| option | default | meaning |") + 2
    out = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names, defaults = (cell.strip() for cell in line.strip("|").split("|")[:2])
        names = re.findall(r"`(\w+)`", names)
        defaults = re.findall(r"`([^`]+)`", defaults)
        assert len(names) == len(defaults), line
        out.update(zip(names, defaults))
    return out


def test_readme_table_names_every_option_once_with_its_default():
    table = readme_options()
    options = {f.name: f for f in fields(Options) if f.init}
    assert sorted(table) == sorted(options)
    for name, shown in table.items():
        f = options[name]
        if f.metadata["shown"] is not None:
            assert shown == f.metadata["shown"], name
        else:
            assert ast.literal_eval(shown) == f.default, name


def test_every_option_says_what_it_means():
    assert all(f.metadata["doc"] for f in fields(Options) if f.init)


def test_options_build_what_a_queue_takes():
    opts = Options.from_transport_options(
        {
            "fair_key": "tenant",
            "tenant_concurrency": {"big": 3, "*": 1},
            "queue_techniques": {"q": "S"},
            "visibility_timeout": 30,
        }
    )
    settings = opts.queue_settings("q")
    assert (settings.technique, settings.fair, settings.tenant_concurrency, settings.lease_seconds) == (
        "S",
        True,
        1,
        30.0,
    )
    dead = opts.queue_settings("q.dead")
    assert (dead.technique, dead.fair, dead.max_deliveries) == ("T", False, 0)
    assert settings.tenant_tables()["concurrency"] == {"big": 3}
    assert opts.renew_interval == 10.0


def test_unknown_names_are_left_to_kombu():
    assert Options.from_transport_options({"fanout_prefix": True}) == Options()


def test_options_are_checked_when_made():
    with pytest.raises(ConfigError, match="block_seconds"):
        Options(block_seconds=0)


@pytest.mark.parametrize("weight, step", [(2_000_001, "0"), (10_001, "100"), (0.001, "1,000,000,000")])
def test_a_fair_weight_whose_step_the_schedule_cannot_hold_is_refused_by_tenant_and_weight(weight, step):
    # the schedule moves a tenant on by round(1,000,000 / weight) whole units per delivery: at 0
    # a tenant would be served without end, and weights outside 0.01..10000 are refused
    with pytest.raises(ConfigError) as err:
        Options(fair_key="tenant", fair_weights={"acme": 2, "bulk": weight})
    text = str(err.value)
    assert "fair_weights for tenant 'bulk'" in text and repr(weight) in text and f"here {step}:" in text, text
    assert Options(fair_key="tenant", fair_weights={"acme": 0.01, "bulk": 10_000}).fair_weights["bulk"] == 10_000


def test_the_shortest_lease_is_its_renewal_interval_and_a_margin():
    assert Options(lease_seconds=0.75).renew_interval == 0.25
    with pytest.raises(ConfigError, match=r"lease_seconds must be at least 0\.75 s, got 0\.7"):
        Options(lease_seconds=0.7)
    assert Options(lease_seconds=3, renew_interval=2.5).renew_interval == 2.5
    with pytest.raises(ConfigError, match=r"at least renew_interval \+ 0\.5 s \(3\.1\), got renew_interval 2\.6"):
        Options(lease_seconds=3, renew_interval=2.6)


def test_socket_timeout_is_at_most_the_lease_less_its_renewal_interval():
    # the default: 30 s, or the lease less its renewal interval when that is shorter
    assert (Options().socket_timeout, Options(lease_seconds=3).socket_timeout) == (30.0, 2.0)
    assert type(Options().socket_timeout) is float
    # given: kept when it fits, refused when longer (None waits forever: refused too)
    assert Options(lease_seconds=3, socket_timeout=2).socket_timeout == 2.0
    for given in (2.5, None):
        with pytest.raises(
            ConfigError,
            match=r"socket_timeout must be at most lease_seconds - renew_interval "
            r"\(3 - 1 = 2 s\), got " + re.escape(repr(given)),
        ):
            Options(lease_seconds=3, socket_timeout=given)


def test_an_unknown_transport_option_is_told_once_with_the_closest_name(caplog):
    caplog.set_level(logging.WARNING, logger="celery_pq")
    for _ in range(3):  # a channel is made many times: told once
        Options.from_transport_options({"lease_second": 30, "polling_interval": 1, "max_retries": 3})
    told = [r.getMessage() for r in caplog.records if r.name == "celery_pq"]
    assert told == [
        "broker_transport_options: 'lease_second' is not an option of celery-pq or kombu and is ignored "
        "(did you mean 'lease_seconds'?)"
    ]


def test_a_weight_of_none_is_refused_by_name():
    # (None means "not limited" in the caps' and rates' tables; a weight has no such meaning)
    with pytest.raises(ConfigError, match=r"fair_weights for tenant 'a' must be a number, got None"):
        Options(fair_key="tenant", fair_weights={"a": None})
