"""The transport options: README.md's table and ``celery_pq.options.Options`` agree (no Redis)."""

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from celery_pq import ConfigError
from celery_pq.options import Options

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
    opts = Options.from_transport_options({"fair_key": "tenant", "tenant_concurrency": {"big": 3, "*": 1},
                                           "queue_techniques": {"q": "S"}, "visibility_timeout": 30})
    kwargs = opts.queue_kwargs("q")
    assert (kwargs["technique"], kwargs["fair"], kwargs["tenant_concurrency"], kwargs["lease_seconds"]) == \
        ("S", True, 1, 30.0)
    dead = opts.queue_kwargs("q.dead")
    assert (dead["technique"], dead["fair"], dead["max_deliveries"]) == ("T", False, 0)
    assert opts.tenant_tables()["concurrency"] == {"big": 3}
    assert opts.renew_interval == 10.0


def test_unknown_names_are_left_to_kombu():
    assert Options.from_transport_options({"fanout_prefix": True}) == Options()


def test_options_are_checked_when_made():
    with pytest.raises(ConfigError, match="block_seconds"):
        Options(block_seconds=0)
