"""``pq`` commands that serve or export: the Prometheus exporter (docs/operations.md), the dashboard
(docs/dashboard.md), the event log to Parquet and its HTML report (docs/spark.md)."""

from __future__ import annotations

import click

from .base import broker_of, choice_option, command, json_option, print_json


@command()
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface, for a scraper on another machine).",
)
@click.option("--queue", "queues", multiple=True, help="Queues to export (repeat); default: every declared one.")
@click.option(
    "--bands",
    default=None,
    metavar="LO-HI,...",
    help="Priority bands of the _by_priority gauge, e.g. 0-99,100-199,200-255 (default: one per priority).",
)
@click.option(
    "--max-tenants",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Tenants per queue exported by name; the rest are summed as 'other'.",
)
def metrics(ctx, **options):
    """Serve Prometheus metrics (celery_pq_*) over HTTP at /metrics until Ctrl-C."""
    try:
        from ..metrics import serve
    except ImportError as exc:  # the [ops] extra is not installed
        raise click.ClickException(str(exc)) from None
    serve(broker_of(ctx), **options)


@command()
@click.argument("queues", nargs=-1)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8808, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--allow-actions", is_flag=True, help="Show pause/resume/replay buttons (they need the token).")
@click.option(
    "--token",
    default=None,
    envvar="PQ_DASHBOARD_TOKEN",
    help="The token of the actions, and of the state beyond loopback; or $PQ_DASHBOARD_TOKEN "
    "(default: a random one, printed).",
)
@click.option(
    "--window",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds of deliveries the tenants' shares cover.",
)
def dashboard(ctx, queues, **options):
    """A live page of QUEUES (default: every declared one) on http://HOST:PORT/ until Ctrl-C
    (docs/dashboard.md); read-only unless --allow-actions."""
    from ..dashboard.server import check_token, listens_on_loopback, run

    try:
        check_token(options["token"], options["allow_actions"], listens_on_loopback(options["host"]))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    run(broker_of(ctx), queues, echo=click.echo, **options)


@command(name="export-events")
@click.argument("queues", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(), help="Parquet directory to append to.")
@choice_option("--on-gap", ["warn", "fail"], "Events trimmed by the stream's cap before export: warn or fail.")
@json_option
def export_events(ctx, queues, out, on_gap, as_json):
    """Append the event log of QUEUES logged since the last export to --out (Parquet); every
    shard's of a queue split into shards (the transport option shards)."""
    from ...spark.events.export import ExportBusy
    from ...spark.events.export import export_events as export
    from ...spark.events.log import EventLogGap

    with broker_of(ctx).channel() as channel:
        try:
            result = export(
                channel.client,
                list(queues),
                out,
                key_prefix=channel.options.key_prefix,
                on_gap=on_gap,
                shards=channel.options.shards_of,
            )
        except (EventLogGap, ExportBusy, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    for gap in result.gaps:
        click.echo(f"warning: {gap}", err=True)
    if as_json:
        fields = ("out", "exported", "offsets", "files", "gaps")
        return print_json({f: getattr(result, f) for f in fields})
    for queue, n in result.exported.items():
        click.echo(f"{queue}: {n} new events, last {result.offsets.get(queue, '-')}")


@command()
@click.argument("events", type=click.Path(exists=True))
@click.option("--html", "html_path", required=True, type=click.Path(), help="The HTML page to write.")
@click.option("--png", "png_path", type=click.Path(), help="Also save the first queue's plots as a PNG.")
@click.option("--window", "window_seconds", type=float, help="Time window in seconds (default: about 60 windows).")
def report(ctx, events, html_path, png_path, window_seconds):
    """Render an exported event log (EVENTS, Parquet) as one self-contained HTML page."""
    from ...spark.events.report import write_report

    if window_seconds is not None and window_seconds <= 0:
        raise click.BadParameter(f"must be a positive number of seconds, got {window_seconds}", param_hint="--window")
    try:
        result = write_report(events, html_path, png_path=png_path, window_seconds=window_seconds)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {html_path} ({len(result.figures)} figures, {len(result.images)} queue(s))")
