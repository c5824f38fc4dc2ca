"""``celery -A proj pq ...``: administration of celery-pq queues."""

from __future__ import annotations

import json

import click
from celery.bin.base import CeleryCommand

from . import broker_channel
from .keys import queues_key


@click.group(name="pq")
def pq():
    """celery-pq: inspect and administer the prioritized queues."""


def _queue_names(channel, names):
    if names:
        return list(names)
    known = sorted(m.decode() for m in channel.client.smembers(queues_key(channel.options.key_prefix)))
    return [n for n in known if not n.endswith(".pidbox") and ".reply." not in n] or known


@pq.command(cls=CeleryCommand)
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_context
def stats(ctx, queues, as_json):
    """Per queue: waiting, delayed, leased, dead-lettered, per-priority and per-tenant counts,
    and the age of the entry that goes next."""
    app = ctx.obj.app
    with app.connection_for_write() as conn:
        channel = broker_channel(conn)
        rows = [channel.queue(name).stats() for name in _queue_names(channel, queues)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        age = row["head_age_seconds"]
        click.echo(
            f"{row['queue']}: waiting={row['waiting']} delayed={row['delayed']} leased={row['leased']} "
            f"dead={row['dead']} oldest_waiting={'-' if age is None else f'{age:.1f}s'}"
        )
        if row["per_priority"]:
            click.echo("  per priority: " + ", ".join(f"{p}={n}" for p, n in row["per_priority"].items()))
        if row["per_tenant"]:
            click.echo("  per tenant: " + ", ".join(f"{t or '(default)'}={c['waiting']}/{c['leased']} leased"
                                                   for t, c in sorted(row["per_tenant"].items())))


@pq.command(cls=CeleryCommand)
@click.argument("queue")
@click.argument("task_id")
@click.pass_context
def remove(ctx, queue, task_id):
    """Remove the waiting messages of TASK_ID from QUEUE (REMOVE BY ID)."""
    from . import remove as remove_

    click.echo(remove_(ctx.obj.app, queue, task_id))


@pq.command(cls=CeleryCommand)
@click.argument("queues", nargs=-1)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8808, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--allow-actions", is_flag=True, help="Show pause/resume buttons (they need the token).")
@click.option("--token", default=None, help="The actions' token (default: a random one, printed).")
@click.option("--window", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds of deliveries the tenants' shares cover.")
@click.pass_context
def dashboard(ctx, queues, host, port, allow_actions, token, window):
    """A live page of the queues (docs/dashboard.md); read-only unless --allow-actions."""
    from .dashboard.server import check_token, run

    try:
        check_token(token, allow_actions)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    run(ctx.obj.app, lambda channel: _queue_names(channel, queues), host=host, port=port,
        allow_actions=allow_actions, token=token, window=window, echo=click.echo)
