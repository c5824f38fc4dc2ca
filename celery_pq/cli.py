"""``celery -A proj pq ...`` and ``python -m celery_pq --broker URL ...``: administration of
celery-pq queues. Each command is a thin click wrapper: the queue does the work
(``queue/``), ``broker.py`` opens the broker, ``render.py`` shows rows, ``messages.py``
describes a stored message, ``metrics.py`` serves Prometheus. Errors are one line and exit 1
(``click.ClickException``)."""

from __future__ import annotations

import functools
import json
import time

import click
import redis
from celery.bin.base import CeleryCommand

from . import render
from .broker import Broker, known, queue_and_view, queue_names
from .errors import PQError
from .messages import describe


@click.group(name="pq")
def pq():
    """celery-pq: inspect and administer the prioritized queues."""


def broker_of(ctx) -> Broker:
    """The broker of this invocation: ``python -m celery_pq``'s (``--broker``) or the Celery app's."""
    obj = ctx.find_object(Broker)
    if obj is not None:
        return obj
    return Broker.of(ctx.find_root().obj.app)


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


def _queue(channel, name):
    """(queue, view rank range or None) of a name given on the command line, or an error."""
    if not known(channel, name):
        declared = ", ".join(queue_names(channel)) or "none"
        raise click.ClickException(f"unknown queue {name!r} (declared: {declared})")
    return queue_and_view(channel, name)


def _json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# -- looking ----------------------------------------------------------------------------------
@command()
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--watch", type=float, is_flag=False, flag_value=2.0, default=None, metavar="[SECONDS]",
              help="Refresh every SECONDS (default 2) until Ctrl-C: in place on a terminal.")
def stats(ctx, queues, as_json, watch):
    """Per queue: waiting, delayed, leased, dead-lettered, paused, per-priority and per-tenant
    counts, and the age of the entry that goes next."""
    broker = broker_of(ctx)

    def rows():
        with broker.channel() as channel:
            return [queue_and_view(channel, name)[0].stats() for name in queue_names(channel, queues)]

    if watch is not None and watch <= 0:
        raise click.BadParameter(f"must be a number of seconds > 0, got {watch}", param_hint="--watch")
    if as_json:
        if watch is None:
            return _json(rows())
        while True:  # one JSON document per line and refresh
            click.echo(json.dumps(rows(), default=str))
            time.sleep(watch)
    if watch is not None:
        return render.watch(lambda: stats_tables(rows()), watch)
    render.show(*stats_tables(rows()))


def stats_tables(rows: list[dict]) -> list:
    """The queues' table, then one per queue with a breakdown by priority or tenant."""
    main = render.table("queues", ["queue", "waiting", "delayed", "leased", "dead", "paused", "oldest waiting"], [
        [r["queue"], r["waiting"], r["delayed"], r["leased"], r["dead"], _paused_text(r),
         render.age(r["head_age_seconds"])] for r in rows])
    out = [main]
    for r in rows:
        if r["per_priority"]:
            out.append(render.table(f"{r['queue']}: waiting per priority", ["priority", "waiting"],
                                    [[p, n] for p, n in r["per_priority"].items()]))
        if r["per_tenant"]:
            out.append(render.table(f"{r['queue']}: per tenant", ["tenant", "waiting", "leased", "next waits"], [
                [t or "(default)", c["waiting"], c["leased"], render.age(c.get("next_age_seconds"))]
                for t, c in sorted(r["per_tenant"].items())]))
    return out


def _paused_text(row) -> str:
    if row.get("paused"):
        return "yes"
    tenants = row.get("paused_tenants") or []
    return f"tenants: {', '.join(tenants)}" if tenants else "no"


@command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=10, show_default=True, help="Entries to show.")
@click.option("--tenant", default=None, help="Only this tenant's entries (a fair queue).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def peek(ctx, queue, count, tenant, as_json):
    """The next entries of QUEUE in delivery order (not leased): priority, tenant, age, task
    name and an args preview."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        entries = q.peek(count) if tenant is None else q.peek_tenant(tenant, count)
        held = q.held_tenants()
        now_ms = _now_ms(channel)
    rows = [{**_entry_row(e, now_ms), "held": held.get(e.tenant)} for e in entries]
    if as_json:
        return _json(rows)
    title = f"{queue}: next {len(rows)}" + (" (priority order; 'held' tenants wait for their cap, rate or pause)"
                                            if held else "")
    render.show(render.table(title, ["#", "id", "priority", "tenant", "held", "age", "task", "args"], [
        [i + 1, r["id"], r["priority"], r["tenant"], r["held"], render.age(r["age_seconds"]), r["task"], r["args"]]
        for i, r in enumerate(rows)], empty="(no waiting entries)"))


def _now_ms(channel) -> int:
    sec, usec = channel.client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _entry_row(e, now_ms) -> dict:
    d = describe(e.payload)
    return {"id": e.id, "priority": e.priority, "tenant": e.tenant, "age_seconds": (now_ms - e.enqueued_ms) / 1000,
            "deliveries": e.deliveries, "task": d["task"], "args": d["args"]}


@command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=20, show_default=True, help="Entries to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def dead(ctx, queue, count, as_json):
    """The dead letters of QUEUE (``QUEUE.dead``): why, when, after how many deliveries."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        entries = q.dead.peek(count)
        total = q.dead.size()
    rows = [{"id": e.id, "priority": e.priority, "tenant": e.tenant, "reason": e.dead_reason,
             "dead_ms": e.dead_ms, "deliveries": e.dead_deliveries, **describe(e.payload)} for e in entries]
    if as_json:
        return _json(rows)
    render.show(render.table(f"{queue}.dead: {total} dead letter(s), showing {len(rows)}",
                             ["id", "priority", "tenant", "reason", "when (UTC)", "deliveries", "task", "args"], [
        [r["id"], r["priority"], r["tenant"], r["reason"], render.when(r["dead_ms"]), r["deliveries"], r["task"],
         r["args"]] for r in rows], empty="(no dead letters)"))


@command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=100, show_default=True,
              help="Leases to show, earliest deadline first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def leases(ctx, queue, count, as_json):
    """Who holds which entries of QUEUE, until when, after how many deliveries (never the
    lease tokens)."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        rows = q.leases(count)
    if as_json:
        return _json(rows)
    render.show(render.table(f"{queue}: {len(rows)} lease(s)",
                             ["id", "consumer", "priority", "tenant", "deliveries", "expires in"], [
        [r["id"], r["consumer"], r["priority"], r["tenant"], r["deliveries"], f"{r['seconds_left']:.1f}s"]
        for r in rows], empty="(no leases)"))


@command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def explain(ctx, queue, as_json):
    """The cost table of QUEUE's technique (Redis reads and writes per operation), with the
    queue's live figures: its size and the stale pointers a pop may have to skip."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        s = q.stats()
    stale = max(0, s["index_members"] - s["waiting"]) if not q.fair else 0
    costs = q.explain(stale=min(stale, 64))
    data = {"queue": queue, "technique": q.technique, "fair": q.fair, "priority_order": q.priority_order,
            "waiting": s["waiting"], "leased": s["leased"], "delayed": s["delayed"],
            "index_members": s["index_members"], "stale_pointers": stale,
            "costs": {op: by_t[q.technique] for op, by_t in costs.items() if q.technique in by_t}}
    if as_json:
        return _json(data)
    head = (f"{queue}: technique {q.technique}, {'fair' if q.fair else 'not fair'}, {q.priority_order}; "
            f"waiting {s['waiting']}, leased {s['leased']}, delayed {s['delayed']}; "
            f"priority index {s['index_members']} pointer(s), {stale} stale")
    render.show(head, render.table(f"Redis commands per operation (technique {q.technique}, "
                                   f"{min(stale, 64)} stale pointer(s) ahead)", ["operation", "reads", "writes",
                                                                                "commands"], [
        [op, c["reads"], c["writes"], " ".join(f"{k}x{n}" for k, n in c["commands"].items())]
        for op, c in data["costs"].items()]))


@command()
@click.argument("queue", metavar="QUEUE[VIEW]")
def backlog(ctx, queue):
    """One number: the due waiting entries a consumer of QUEUE (or of a priority view such as
    'default[>=200]') could take now; delayed entries and tenants held back by a cap, a rate
    or a pause are not counted. For external scalers."""
    with broker_of(ctx).channel() as channel:
        q, view = _queue(channel, queue)
        click.echo(q.backlog(view))


# -- changing ---------------------------------------------------------------------------------
@command()
@click.argument("queue")
@click.argument("task_ids", nargs=-1, required=True)
def remove(ctx, queue, task_ids):
    """Remove the waiting messages of TASK_IDs from QUEUE (REMOVE BY ID); prints how many."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        counts = {t: q.remove(t) for t in task_ids}
    if len(counts) == 1:
        click.echo(sum(counts.values()))
    else:
        for t, n in counts.items():
            click.echo(f"{t}\t{n}")
    if not any(counts.values()):
        raise click.ClickException(f"no waiting message of {', '.join(task_ids)} in queue {queue!r}")


@command()
@click.argument("queue")
@click.argument("task_id")
@click.argument("priority", type=int)
def reprioritize(ctx, queue, task_id, priority):
    """Move the waiting message TASK_ID of QUEUE to PRIORITY (0..255), behind the messages
    already waiting there."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        q.change_priority(task_id, priority)
    click.echo(f"{task_id}: priority {priority}")


@command()
@click.argument("queue")
@click.argument("task_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter of QUEUE.")
def replay(ctx, queue, task_ids, everything):
    """Dead letters of QUEUE back to QUEUE (each atomically), keeping priority and tenant, with
    the delivery count reset. Give TASK_IDs (as ``pq dead`` shows them) or --all."""
    if everything == bool(task_ids):
        raise click.UsageError("give TASK_IDs or --all (not both)")
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        if task_ids:
            result = q.replay(task_ids)
        else:
            result = {"replayed": {}, "missing": [], "leased": [], "refused": []}
            while True:  # a chunk at a time, in the dead-letter queue's order
                ids = [e.id for e in q.dead.peek(500)]
                got = q.replay(ids) if ids else None
                if got is None:
                    break
                for k in ("missing", "leased", "refused"):
                    result[k] += got[k]
                result["replayed"].update(got["replayed"])
                if not got["replayed"]:
                    break
    n = len(result["replayed"])
    click.echo(f"replayed {n} dead letter(s) to {queue}")
    for why, label in (("missing", "not in the dead-letter queue"), ("leased", "leased by a consumer of "
                                                                             f"{queue}.dead"),
                       ("refused", f"left dead: {queue} is full (max_length)")):
        if result[why]:
            click.echo(f"{label}: {', '.join(result[why])}", err=True)
    if task_ids and n == 0:
        raise click.ClickException(f"nothing replayed to {queue!r}")


@command()
@click.option("--consumer", required=True, help="The consumer id (host:pid:random, as `pq leases` shows).")
@click.argument("queues", nargs=-1)
def recover(ctx, consumer, queues):
    """Return every lease CONSUMER holds (a crashed worker's) at once, without waiting for the
    leases to run out; in QUEUES, or in every declared queue."""
    if not consumer.strip():
        raise click.BadParameter("must name a consumer", param_hint="--consumer")
    total = {"returned": 0, "dead": 0}
    with broker_of(ctx).channel() as channel:
        names = queue_names(channel, queues)
        for name in names:
            if queues:
                _queue(channel, name)
            r = queue_and_view(channel, name)[0].reclaim(consumer=consumer)
            total["returned"] += int(r["returned"])
            total["dead"] += int(r["dead"])
            if r["returned"] or r["dead"]:
                click.echo(f"{name}: {r['returned']} returned to waiting, {r['dead']} dead-lettered")
    click.echo(f"consumer {consumer}: {total['returned']} lease(s) returned, {total['dead']} dead-lettered "
               f"(in {len(names)} queue(s))")


@command()
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask.")
def purge(ctx, queue, yes):
    """Delete every waiting and delayed message of QUEUE (leased ones stay leased)."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        if not yes:
            s = q.stats()
            click.confirm(f"Delete the {s['waiting']} waiting and {s['delayed']} delayed message(s) of {queue!r}?",
                          abort=True)
        click.echo(f"purged {q.purge()} message(s) from {queue}")


def _pause_or_resume(ctx, queue, tenant, pause: bool) -> tuple[dict, str]:
    """Pause or resume QUEUE (or one tenant of it); the paused tenants after it, as text."""
    with broker_of(ctx).channel() as channel:
        q, _ = _queue(channel, queue)
        (q.pause if pause else q.resume)(tenant=tenant)
        state = q.paused()
    return state, f" (paused tenants: {', '.join(state['tenants']) or 'none'})"


@command(name="pause")
@click.argument("queue")
@click.option("--tenant", default=None, help="Pause only this tenant (a fair queue).")
def pause_(ctx, queue, tenant):
    """Consumers stop receiving QUEUE (or one tenant of it); publishing goes on."""
    _, tenants = _pause_or_resume(ctx, queue, tenant, True)
    click.echo(f"{queue}: paused" + ("" if tenant is None else f" for tenant {tenant}") + tenants)


@command(name="resume")
@click.argument("queue")
@click.option("--tenant", default=None, help="Resume only this tenant (a fair queue).")
def resume_(ctx, queue, tenant):
    """Consumers receive QUEUE (or the tenant) again."""
    state, tenants = _pause_or_resume(ctx, queue, tenant, False)
    click.echo(f"{queue}: {'still paused' if state['queue'] else 'running'}" +
               ("" if tenant is None else f"; tenant {tenant} resumed") + tenants)


# -- serving ----------------------------------------------------------------------------------
@command()
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface, for a scraper on another machine).")
@click.option("--queue", "queues", multiple=True, help="Queues to export (repeat); default: every declared one.")
@click.option("--bands", default=None, metavar="LO-HI,...",
              help="Priority bands of the _by_priority gauge, e.g. 0-99,100-199,200-255 (default: one per priority).")
@click.option("--max-tenants", type=click.IntRange(min=0), default=20, show_default=True,
              help="Tenants per queue exported by name; the rest are summed as 'other'.")
def metrics(ctx, port, address, queues, bands, max_tenants):
    """Serve Prometheus metrics (celery_pq_*) over HTTP at /metrics until Ctrl-C."""
    from .metrics import parse_bands, serve

    serve(broker_of(ctx), port=port, address=address, queues=list(queues) or None,
          bands=parse_bands(bands), max_tenants=max_tenants)


@command()
@click.argument("queues", nargs=-1)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8808, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--allow-actions", is_flag=True, help="Show pause/resume/replay buttons (they need the token).")
@click.option("--token", default=None, envvar="PQ_DASHBOARD_TOKEN",
              help="The token of the actions, and of the state beyond loopback; or $PQ_DASHBOARD_TOKEN "
                   "(default: a random one, printed).")
@click.option("--window", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds of deliveries the tenants' shares cover.")
def dashboard(ctx, queues, host, port, allow_actions, token, window):
    """A live page of QUEUES (default: every declared one) on http://HOST:PORT/ until Ctrl-C
    (docs/dashboard.md); read-only unless --allow-actions."""
    from .dashboard.server import check_token, listens_on_loopback, run

    try:
        check_token(token, allow_actions, listens_on_loopback(host))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    run(broker_of(ctx), queues, host=host, port=port, allow_actions=allow_actions, token=token, window=window,
        echo=click.echo)

# -- the event log to Spark (celery_pq/spark/: export.py, report.py) --------------------------------

@command(name="export-events")
@click.argument("queues", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(), help="Parquet directory to append to.")
@click.option("--on-gap", type=click.Choice(["warn", "fail"]), default="warn",
              help="Events trimmed by the stream's cap before export: warn (default) or fail.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def export_events(ctx, queues, out, on_gap, as_json):
    """Append the event log of QUEUES logged since the last export to --out (Parquet); every
    shard's of a queue split into shards (the transport option shards)."""
    from .spark.eventlog import EventLogGap
    from .spark.export import ExportBusy
    from .spark.export import export_events as export

    with broker_of(ctx).channel() as channel:
        try:
            result = export(channel.client, list(queues), out, key_prefix=channel.options.key_prefix, on_gap=on_gap,
                            shards=channel.options.shards_of)
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


@command()
@click.argument("events", type=click.Path(exists=True))
@click.option("--html", "html_path", required=True, type=click.Path(), help="The HTML page to write.")
@click.option("--png", "png_path", type=click.Path(), help="Also save the first queue's plots as a PNG.")
@click.option("--window", "window_seconds", type=float, help="Time window in seconds (default: about 60 windows).")
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
