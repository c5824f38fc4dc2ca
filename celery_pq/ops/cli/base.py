"""The ``pq`` command group and what its commands share: the invocation's broker, one-line errors,
a queue named on the command line, ``--yes``."""

from __future__ import annotations

import functools
import json
import sys
from contextlib import contextmanager

import click
import redis
from celery.bin.base import CeleryCommand

from ...storage.errors import PQError
from ...transport.broker import Broker, known, queue_and_view, queue_names
from .. import render


@click.group(name="pq")
def pq():
    """celery-pq: inspect and administer the prioritized queues."""


def broker_of(ctx) -> Broker:
    """The broker of this invocation: ``python -m celery_pq``'s (``--broker``) or the Celery app's."""
    return ctx.find_object(Broker) or Broker.of(ctx.find_root().obj.app)


def command(*args, **kwargs):
    """A pq subcommand whose project errors, bad values and Redis errors are one line, exit 1."""

    def wrap(f):
        @functools.wraps(f)
        def run(*a, **kw):
            try:
                return f(*a, **kw)
            except (PQError, ValueError, redis.RedisError) as exc:
                raise click.ClickException(str(exc)) from None

        return pq.command(*args, cls=CeleryCommand, **kwargs)(click.pass_context(run))

    return wrap


def queue_named(channel, name):
    """(queue, view rank range or None) of a name given on the command line, or an error."""
    if not known(channel, name):
        declared = ", ".join(queue_names(channel)) or "none"
        raise click.ClickException(f"unknown queue {name!r} (declared: {declared})")
    return queue_and_view(channel, name)


@contextmanager
def queue_of(ctx, name):
    """(queue, view rank range or None) of a name given on the command line, its channel open."""
    with broker_of(ctx).channel() as channel:
        yield queue_named(channel, name)


#: Of every command that asks before a change that cannot be undone.
yes_option = click.option(
    "--yes", is_flag=True, help="Do not ask for confirmation (needed when stdin is not a terminal)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def choice_option(name: str, choices: list[str], help: str):
    """An option taking one of ``choices``, the first by default."""
    return click.option(name, type=click.Choice(choices), default=choices[0], show_default=True, help=help)


def count_option(default: int, help: str = "Entries to show."):
    """``-n COUNT``: how many entries a command shows."""
    return click.option("-n", "count", type=click.IntRange(min=1), default=default, show_default=True, help=help)


def confirm(question: str, yes: bool) -> None:
    """Go on when ``yes`` (``--yes``) or the person at the terminal answers yes to ``question``; else
    exit 1, having changed nothing. Stdin that is not a terminal is never read as an answer."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(
            f"{question} Not done: this asks for confirmation and stdin is not a terminal; "
            "add --yes to go ahead without asking"
        )
    click.confirm(question, abort=True)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def output(as_json: bool, data, *shown) -> None:
    """``data`` as JSON with --json, else ``shown``: tables or text (``render.show``)."""
    if as_json:
        print_json(data)
    else:
        render.show(*shown)
