"""``pq`` commands that look and change nothing: stats, peek, dead, leases, explain, backlog. docs/operations.md."""

from __future__ import annotations

import json
import time

import click

from ...queue.tenants import RECENT_MINUTES
from ...storage import costs
from ...transport.broker import queue_stats
from .. import render
from .base import broker_of, command, count_option, json_option, output, queue_of


@command()
@click.argument("queues", nargs=-1)
@json_option
@click.option(
    "--watch",
    type=float,
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C: in place on a terminal.",
)
def stats(ctx, queues, as_json, watch):
    """Per queue: waiting, delayed, leased, dead-lettered, paused, per-priority and per-tenant
    counts, the age of the entry that goes next, and unique keys held (with how many publishes
    were merged, replaced, debounced or throttled)."""
    broker = broker_of(ctx)

    def rows():
        return queue_stats(broker, queues)

    if watch is not None and watch <= 0:
        raise click.BadParameter(f"must be a number of seconds > 0, got {watch}", param_hint="--watch")
    if watch is None:
        data = rows()
        return output(as_json, data, *stats_tables(data))
    while as_json:  # one JSON document per line and refresh
        click.echo(json.dumps(rows(), default=str))
        time.sleep(watch)
    render.watch(lambda: stats_tables(rows()), watch)


def stats_tables(rows: list[dict]) -> list:
    """The queues' table, then one per queue with a breakdown by priority or tenant."""
    age = lambda key: lambda r: render.age(r.get(key))  # noqa: E731
    states = [("paused", _paused_text), ("oldest waiting", age("head_age_seconds"))]
    out = [render.table("queues", ["queue", "waiting", "delayed", "leased", "dead", *states], rows)]
    kinds = ["keys", "merged", "replaced", "debounced", "throttled"]
    unique = [
        [r["queue"], *(r["unique"].get(k, 0) for k in kinds)] for r in rows if any((r.get("unique") or {}).values())
    ]
    if unique:
        out.append(render.table("unique keys", ["queue", "keys held", *kinds[1:]], unique))
    for r in rows:
        name = r["queue"]
        if r["per_priority"]:
            out.append(
                render.table(f"{name}: waiting per priority", ["priority", "waiting"], list(r["per_priority"].items()))
            )
        if r["per_tenant"]:
            tenants = [{**c, "tenant": t or "(default)"} for t, c in sorted(r["per_tenant"].items())]
            columns = ["tenant", "waiting", "leased", ("next waits", age("next_age_seconds"))]
            if any("worker_ms" in c for c in tenants):  # a queue with fair_cost="time"
                columns.append((f"worker time ({RECENT_MINUTES} min)", _worker_shares(tenants)))
            out.append(render.table(f"{name}: per tenant", columns, tenants))
    return out


def _worker_shares(rows: list[dict]):
    """A tenant row's share of the recent worker time of all ``rows`` (fair_cost="time"), as text."""
    recent = sum(c.get("recent_worker_ms", 0) for c in rows)
    return lambda c: f"{c.get('recent_worker_ms', 0) / recent:.0%}" if recent else "-"


def _paused_text(row) -> str:
    if row.get("paused"):
        return "yes"
    tenants = row.get("paused_tenants") or []
    return f"tenants: {', '.join(tenants)}" if tenants else "no"


@command()
@click.argument("queue")
@count_option(10)
@click.option("--tenant", default=None, help="Only this tenant's entries (a fair queue).")
@click.option(
    "--delayed",
    is_flag=True,
    help="The delayed entries instead (countdown/eta tasks, soonest due first): what Celery's "
    "'inspect scheduled' shows of other brokers. They wait here in Redis, not in a worker.",
)
@json_option
def peek(ctx, queue, count, tenant, delayed, as_json):
    """The next entries of QUEUE in delivery order (not leased): priority, tenant, age, task
    name and an args preview. With --delayed, the entries waiting for their due time."""
    if delayed and tenant is not None:
        raise click.UsageError("--delayed shows every tenant's delayed entries; leave out --tenant")
    with queue_of(ctx, queue) as (q, _):
        if delayed:
            found = q.delayed(count)
        else:
            held = {t: r["held"] for t, r in q.tenants().items() if r["held"]}
            found = [(e, None) for e in q.peek(count, tenant)]
        sec, usec = q.client.time()  # ages on Redis's clock
        now_ms = int(sec) * 1000 + int(usec) // 1000
    if delayed:
        rows = [{**_entry_row(e, now_ms), "due_ms": due, "due_in_seconds": (due - now_ms) / 1000} for e, due in found]
        title = f"{queue}: {len(rows)} delayed, soonest due first (they join the queue when due)"
        when = [
            ("due (UTC)", lambda r: render.when(r["due_ms"])),
            ("due in", lambda r: render.age(max(r["due_in_seconds"], 0))),
        ]
        columns = ["#", "id", *when, "priority", "tenant", "task", "args"]
    else:
        rows = [{**_entry_row(e, now_ms), "held": held.get(e.tenant)} for e, _ in found]
        title = f"{queue}: next {len(rows)}" + (
            " (priority order; 'held' tenants wait for their cap, rate or pause)" if held else ""
        )
        age = ("age", lambda r: render.age(r["age_seconds"]))
        columns = ["#", "id", "priority", "tenant", "held", age, "task", "args"]
    numbered = [{"#": i + 1, **r} for i, r in enumerate(rows)]
    empty = f"(no {'delayed' if delayed else 'waiting'} entries)"
    output(as_json, rows, render.table(title, columns, numbered, empty=empty))


def _entry_row(e, now_ms) -> dict:
    return {
        "id": e.id,
        "priority": e.priority,
        "tenant": e.tenant,
        "age_seconds": (now_ms - e.enqueued_ms) / 1000,
        "deliveries": e.deliveries,
        **render.describe(e.payload),
    }


@command()
@click.argument("queue")
@count_option(20)
@json_option
def dead(ctx, queue, count, as_json):
    """The dead letters of QUEUE (QUEUE.dead): why, when, after how many deliveries."""
    with queue_of(ctx, queue) as (q, _):
        entries = q.dead.peek(count)
        total = q.dead.size()
    rows = [
        {
            "id": e.id,
            "priority": e.priority,
            "tenant": e.tenant,
            "reason": e.dead_reason,
            "dead_ms": e.dead_ms,
            "deliveries": e.dead_deliveries,
            **render.describe(e.payload),
        }
        for e in entries
    ]
    when = ("when (UTC)", lambda r: render.when(r["dead_ms"]))
    columns = ["id", "priority", "tenant", "reason", when, "deliveries", "task", "args"]
    title = f"{queue}.dead: {total} dead letter(s), showing {len(rows)}"
    output(as_json, rows, render.table(title, columns, rows, empty="(no dead letters)"))


@command()
@click.argument("queue")
@count_option(100, "Leases to show, earliest deadline first.")
@json_option
def leases(ctx, queue, count, as_json):
    """Who holds which entries of QUEUE, until when, after how many deliveries (never the lease tokens)."""
    with queue_of(ctx, queue) as (q, _):
        rows = q.leases(count)
    left = ("expires in", lambda r: f"{r['seconds_left']:.1f}s")
    columns = ["id", "consumer", "priority", "tenant", "deliveries", left]
    output(as_json, rows, render.table(f"{queue}: {len(rows)} lease(s)", columns, rows, empty="(no leases)"))


@command()
@click.argument("queue")
@json_option
def explain(ctx, queue, as_json):
    """The cost table of QUEUE's technique (Redis reads and writes per operation), with the
    queue's live figures: its size and the stale pointers a pop may have to skip."""
    with queue_of(ctx, queue) as (q, _):
        s = q.stats()
    stale = max(0, s["index_members"] - s["waiting"]) if not q.settings.fair else 0
    technique = q.mode["technique"]
    data = {
        "queue": queue,
        "technique": technique,
        "fair": q.settings.fair,
        "priority_order": q.settings.priority_order,
        **{k: s[k] for k in ("waiting", "leased", "delayed", "index_members")},
        "stale_pointers": stale,
        "costs": {op: by_t[technique] for op, by_t in costs.explain(stale=min(stale, 64)).items() if technique in by_t},
    }
    head = (
        f"{queue}: technique {technique}, {'fair' if q.settings.fair else 'not fair'}, {q.settings.priority_order}; "
        f"waiting {s['waiting']}, leased {s['leased']}, delayed {s['delayed']}; "
        f"priority index {s['index_members']} pointer(s), {stale} stale"
    )
    commands = ("commands", lambda c: " ".join(f"{k}x{n}" for k, n in c["commands"].items()))
    rows = [{"operation": op, **c} for op, c in data["costs"].items()]
    title = f"Redis commands per operation (technique {technique}, {min(stale, 64)} stale pointer(s) ahead)"
    output(as_json, data, head, render.table(title, ["operation", "reads", "writes", commands], rows))


@command()
@click.argument("queue", metavar="QUEUE[VIEW]")
def backlog(ctx, queue):
    """One number: the due waiting entries a consumer of QUEUE (or of a priority view such as
    'default[>=200]') could take now; delayed entries and tenants held back by a cap, a rate
    or a pause are not counted. For external scalers."""
    with queue_of(ctx, queue) as (q, view):
        click.echo(q.backlog(view))
