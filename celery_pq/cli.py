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


# -- the event log to Spark (celery_pq/spark/: export.py, report.py) --------------------------------

@pq.command(name="export-events", cls=CeleryCommand)
@click.argument("queues", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(), help="Parquet directory to append to.")
@click.option("--on-gap", type=click.Choice(["warn", "fail"]), default="warn",
              help="Events trimmed by the stream's cap before export: warn (default) or fail.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_context
def export_events(ctx, queues, out, on_gap, as_json):
    """Append the event log of QUEUES logged since the last export to --out (Parquet)."""
    from .spark.eventlog import EventLogGap
    from .spark.export import ExportBusy
    from .spark.export import export_events as export

    with ctx.obj.app.connection_for_write() as conn:
        channel = broker_channel(conn)
        try:
            result = export(channel.client, list(queues), out, key_prefix=channel.options.key_prefix, on_gap=on_gap)
        except (EventLogGap, ExportBusy, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    for gap in result.gaps:
        click.echo(f"warning: {gap}", err=True)
    if as_json:
        click.echo(json.dumps({"out": str(result.out), "exported": result.exported, "offsets": result.offsets,
                               "files": [str(f) for f in result.files], "gaps": result.gaps}, indent=2))
        return
    for queue, n in result.exported.items():
        click.echo(f"{queue}: {n} new events, last {result.offsets.get(queue, '-')}")


@pq.command(cls=CeleryCommand)
@click.argument("events", type=click.Path(exists=True))
@click.option("--html", "html_path", required=True, type=click.Path(), help="The HTML page to write.")
@click.option("--png", "png_path", type=click.Path(), help="Also save the first queue's plots as a PNG.")
@click.option("--window", "window_seconds", type=float, help="Time window in seconds (default: about 60 windows).")
@click.pass_context
def report(ctx, events, html_path, png_path, window_seconds):
    """Render an exported event log (EVENTS, Parquet) as one self-contained HTML page."""
    from .spark.report import write_report

    if window_seconds is not None and window_seconds <= 0:
        raise click.BadParameter(f"must be a positive number of seconds, got {window_seconds}", param_hint="--window")
    try:
        result = write_report(events, html_path, png_path=png_path, window_seconds=window_seconds)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {html_path} ({len(result.figures)} figures, {len(result.images)} queue(s))")
