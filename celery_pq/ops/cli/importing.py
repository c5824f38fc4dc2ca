"""``pq import-kombu``: move what kombu's Redis transport holds for some queues into celery-pq
(``kombu_import``; docs/migrating.md)."""

from __future__ import annotations

import click
import redis

from ...transport.kombu_import import (
    BATCH,
    KOMBU_PRIORITY_STEPS,
    KOMBU_VISIBILITY_TIMEOUT,
    KombuImport,
    KombuLayout,
    parse_priority_map,
)
from .. import render
from .base import broker_of, choice_option, command, json_option, output


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise click.BadParameter(f"integers separated by commas, got {text!r}") from None
    if not steps or steps[0] != 0:
        raise click.BadParameter("kombu's priority steps start at 0")
    return steps


@command(name="import-kombu")
@click.argument("queues", nargs=-1, required=True)
@click.option(
    "--from",
    "source",
    required=True,
    envvar="PQ_IMPORT_FROM",
    metavar="URL",
    help="The Redis of kombu's transport: redis://[:PASSWORD@]HOST[:PORT][/DB] (or $PQ_IMPORT_FROM).",
)
@click.option("--dry-run", is_flag=True, help="Count what would move, per queue and priority; change nothing.")
@choice_option(
    "--unacked",
    ["stale", "all", "none"],
    "Unacked messages to move (ETA tasks are among them): 'stale' those delivered longer than "
    "--visibility-timeout ago, which it then needs (their worker is gone or late; kombu would restore them), 'all' "
    "every one (only once no worker of kombu's transport runs: one still running runs its "
    "messages too), 'none' none.",
)
@click.option("--include-unacked", is_flag=True, help="The same as --unacked all (read its warning in --help first).")
@click.option(
    "--visibility-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="The visibility_timeout (seconds) of the old workers' transport: required with --unacked stale "
    f"(kombu's default, when their broker_transport_options do not set it, is {KOMBU_VISIBILITY_TIMEOUT:g}).",
)
@click.option(
    "--priority-map",
    default=None,
    metavar="K=P,...",
    help="celery-pq priority of some kombu priorities (0..9), e.g. '0=255,9=0'; the others keep kombu's "
    "order under the queue's priority_order (lower_first: the same number; higher_first: 9 - number).",
)
@click.option("--global-keyprefix", default="", help="kombu's global_keyprefix transport option.")
@click.option(
    "--priority-steps",
    default=",".join(map(str, KOMBU_PRIORITY_STEPS)),
    show_default=True,
    help="kombu's priority_steps transport option.",
)
@choice_option(
    "--staged",
    ["refuse", "insert", "drop"],
    "Messages an interrupted import left staged longer ago than the queue's dedupe_seconds and not "
    "in the queue now (inserted and run, or never inserted): stop and name them, insert them (they may "
    "run twice), or drop them (they may be lost).",
)
@click.option(
    "--batch", type=click.IntRange(1, 10_000), default=BATCH, show_default=True, help="Messages per round trip."
)
@json_option
def import_kombu(
    ctx, queues, source, dry_run, include_unacked, priority_map, global_keyprefix, priority_steps, as_json, **job
):
    """Move the messages kombu's Redis transport holds for QUEUES (every priority list, and the
    unacked ones as --unacked says) into the celery-pq queues of the same names, each exactly
    once: rerun it after a crash, it finishes the job without storing a message twice."""
    if include_unacked:
        job["unacked"] = "all"
    if job["unacked"] == "stale" and job["visibility_timeout"] is None:
        raise click.UsageError(
            "--unacked stale (the default) moves the unacked messages delivered longer ago than the old "
            "workers' visibility_timeout: give it with --visibility-timeout SECONDS (kombu's default, when "
            f"their broker_transport_options do not set it, is {KOMBU_VISIBILITY_TIMEOUT:g}), or choose "
            "--unacked all or none"
        )
    layout = KombuLayout(global_keyprefix=global_keyprefix, priority_steps=_steps(priority_steps))
    client = redis.Redis.from_url(source)
    try:
        with broker_of(ctx).channel() as channel:
            importer = KombuImport(
                client, channel, queues, layout=layout, priorities=parse_priority_map(priority_map), **job
            )
            reports = [r.as_dict() for r in importer.run(dry_run=dry_run)]
    finally:
        client.close()
    verb = "would move" if dry_run else "moved"
    title = f"import-kombu{' (dry run: nothing changed)' if dry_run else ''}: {verb}"
    rows = [{"queue": r["queue"], **row} for r in reports for row in r["rows"]]
    moves = ["queue", ("from", "source"), ("kombu priority", "kombu_priority"), "priority", "messages"]
    totals = ["queue", (verb, "moved"), ("with eta", "eta"), ("unacked left (held)", "unacked_held")]
    totals += [("found staged", "staged"), ("repeats (stored before)", "repeats")]
    totals += ["dropped"] if job["staged"] == "drop" else []
    moved = render.table(title, moves, rows, empty="(nothing to move)")
    output(as_json, {"dry_run": dry_run, "queues": reports}, moved, render.table(None, totals, reports))
