"""No password in an error or log line: ``celery_pq.storage.redact`` and the errors that show a broker URL
or connection arguments (no Redis: each is refused before a connection is made)."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner
from kombu import Connection

import celery_pq  # noqa: F401  (pq://)
from celery_pq import ConfigError
from celery_pq.storage.redact import redact
from celery_pq.transport.options import Options

SECRET = "s3cr@t-pw"
# two hosts, the second with a port that is not a number: kombu splits the URL at ";"
TWO_HOSTS = f"pq://:{SECRET}@127.0.0.1:1;pq://admin:{SECRET}@127.0.0.1:notaport/0"


@pytest.mark.parametrize(
    "value, shown",
    [
        (TWO_HOSTS, "'pq://:***@127.0.0.1:1;pq://admin:***@127.0.0.1:notaport/0'"),
        ("redis://user@host:6379", "'redis://user@host:6379'"),  # a user name alone is no password
        (
            {"password": SECRET, "ssl": {"ssl_password": SECRET}, "db": 1},
            "{'password': '***', 'ssl': {'ssl_password': '***'}, 'db': 1}",
        ),
        ([f"pq://:{SECRET}@h"], "['pq://:***@h']"),
    ],
)
def test_redact_is_the_repr_without_passwords(value, shown):
    assert redact(value) == shown


@pytest.mark.parametrize("options", [{"master_name": "mymaster"}, {"cluster": True}])
def test_the_error_of_a_bad_host_among_several_shows_no_password(options, caplog):
    # Given a broker URL of several hosts (sentinels, or cluster seeds), one of them malformed
    with caplog.at_level(logging.DEBUG):
        with Connection(TWO_HOSTS, transport_options=options) as conn:
            with pytest.raises(ConfigError) as err:
                conn.channel()
    # Then the error names the address with its password masked, and no log line holds it
    assert "address 'pq://admin:***@127.0.0.1:notaport/0' in the broker URL" in str(err.value), str(err.value)
    assert SECRET not in str(err.value)
    assert not [r for r in caplog.records if SECRET in r.getMessage()]


def test_the_command_line_shows_no_password():
    from celery_pq.__main__ import main

    result = CliRunner().invoke(main, ["--broker", TWO_HOSTS, "--transport-options", '{"master_name": "m"}', "stats"])
    assert result.exit_code != 0 and "notaport" in result.output, result.output
    assert SECRET not in result.output


def test_connection_arguments_are_shown_without_their_password():
    with pytest.raises(ConfigError) as err:
        Options(master_name="m", sentinel_kwargs={"password": SECRET, 1: "x"})
    assert "'password': '***'" in str(err.value) and SECRET not in str(err.value)


def test_the_reprs_of_options_and_event_reader_settings_show_no_password():
    from celery_pq.spark.events.log import Settings

    options = Options(master_name="m", sentinel_kwargs={"password": SECRET})
    assert "sentinel_kwargs={'password': '***'}" in repr(options) and SECRET not in repr(options)
    settings = Settings.parse({"broker": f"pq://:{SECRET}@127.0.0.1:6379/0", "queue": "q"})
    assert SECRET in settings.url and SECRET not in repr(settings)
