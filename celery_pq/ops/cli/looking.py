"""``pq`` commands that look and change nothing: stats, peek, dead, leases, explain, backlog.
docs/operations.md."""

from __future__ import annotations

import json
import time

import click

from ...storage import costs
from ...transport.broker import queue_and_view, queue_names
from ...transport.messages import describe
from .. import render
from .base import broker_of, command, print_json, queue_named


@command()
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
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
        with broker.channel() as channel:
            return [queue_and_view(channel, name)[0].stats() for name in queue_names(channel, queues)]

    if watch is not None and watch <= 0:
        raise click.BadParameter(f"must be a number of seconds > 0, got {watch}", param_hint="--watch")
    if as_json:
        if watch is None:
            return print_json(rows())
        while True:  # one JSON document per line and refresh
            click.echo(json.dumps(rows(), default=str))
            time.sleep(watch)
    if watch is not None:
        return render.watch(lambda: stats_tables(rows()), watch)
    render.show(*stats_tables(rows()))


def stats_tables(rows: list[dict]) -> list:
    """The queues' table, then one per queue with a breakdown by priority or tenant."""
    main = render.table(
        "queues",
        ["queue", "waiting", "delayed", "leased", "dead", "paused", "oldest waiting"],
        [
            [
                r["queue"],
                r["waiting"],
                r["delayed"],
                r["leased"],
                r["dead"],
                _paused_text(r),
                render.age(r["head_age_seconds"]),
            ]
            for r in rows
        ],
    )
    out = [main]
    unique = [r for r in rows if any((r.get("unique") or {}).values())]
    if unique:
        kinds = ["keys", "merged", "replaced", "debounced", "throttled"]
        out.append(
            render.table(
                "unique keys",
                ["queue", "keys held", *kinds[1:]],
                [[r["queue"], *(r["unique"].get(k, 0) for k in kinds)] for r in unique],
            )
        )
    for r in rows:
        if r["per_priority"]:
            out.append(
                render.table(
                    f"{r['queue']}: waiting per priority",
                    ["priority", "waiting"],
                    [[p, n] for p, n in r["per_priority"].items()],
                )
            )
        if r["per_tenant"]:
            out.append(
                render.table(
                    f"{r['queue']}: per tenant",
                    ["tenant", "waiting", "leased", "next waits"],
                    [
                        [t or "(default)", c["waiting"], c["leased"], render.age(c.get("next_age_seconds"))]
                        for t, c in sorted(r["per_tenant"].items())
                    ],
                )
            )
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
@click.option(
    "--delayed",
    is_flag=True,
    help="The delayed entries instead (countdown/eta tasks, soonest due first): what Celery's "
    "'inspect scheduled' shows of other brokers. They wait here in Redis, not in a worker.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def peek(ctx, queue, count, tenant, delayed, as_json):
    """The next entries of QUEUE in delivery order (not leased): priority, tenant, age, task
    name and an args preview. With --delayed, the entries waiting for their due time."""
    if delayed:
        return _peek_delayed(ctx, queue, count, tenant, as_json)
    with broker_of(ctx).channel() as channel:
        q, _ = queue_named(channel, queue)
        entries = q.peek(count, tenant)
        held = q.held_tenants()
        now_ms = _now_ms(channel)
    rows = [{**_entry_row(e, now_ms), "held": held.get(e.tenant)} for e in entries]
    if as_json:
        return print_json(rows)
    title = f"{queue}: next {len(rows)}" + (
        " (priority order; 'held' tenants wait for their cap, rate or pause)" if held else ""
    )
    render.show(
        render.table(
            title,
            ["#", "id", "priority", "tenant", "held", "age", "task", "args"],
            [
                [
                    i + 1,
                    r["id"],
                    r["priority"],
                    r["tenant"],
                    r["held"],
                    render.age(r["age_seconds"]),
                    r["task"],
                    r["args"],
                ]
                for i, r in enumerate(rows)
            ],
            empty="(no waiting entries)",
        )
    )


def _peek_delayed(ctx, queue, count, tenant, as_json):
    if tenant is not None:
        raise click.UsageError("--delayed shows every tenant's delayed entries; leave out --tenant")
    with broker_of(ctx).channel() as channel:
        q, _ = queue_named(channel, queue)
        found = q.delayed(count)
        now_ms = _now_ms(channel)
    rows = [{**_entry_row(e, now_ms), "due_ms": due, "due_in_seconds": (due - now_ms) / 1000} for e, due in found]
    if as_json:
        return print_json(rows)
    render.show(
        render.table(
            f"{queue}: {len(rows)} delayed, soonest due first (they join the queue when due)",
            ["#", "id", "due (UTC)", "due in", "priority", "tenant", "task", "args"],
            [
                [
                    i + 1,
                    r["id"],
                    render.when(r["due_ms"]),
                    render.age(max(r["due_in_seconds"], 0)),
                    r["priority"],
                    r["tenant"],
                    r["task"],
                    r["args"],
                ]
                for i, r in enumerate(rows)
            ],
            empty="(no delayed entries)",
        )
    )


def _now_ms(channel) -> int:
    sec, usec = channel.client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _entry_row(e, now_ms) -> dict:
    d = describe(e.payload)
    return {
        "id": e.id,
        "priority": e.priority,
        "tenant": e.tenant,
        "age_seconds": (now_ms - e.enqueued_ms) / 1000,
        "deliveries": e.deliveries,
        "task": d["task"],
        "args": d["args"],
    }


@command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=20, show_default=True, help="Entries to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def dead(ctx, queue, count, as_json):
    """The dead letters of QUEUE (QUEUE.dead): why, when, after how many deliveries."""
    with broker_of(ctx).channel() as channel:
        q, _ = queue_named(channel, queue)
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
            **describe(e.payload),
        }
        for e in entries
    ]
    if as_json:
        return print_json(rows)
    render.show(
        render.table(
            f"{queue}.dead: {total} dead letter(s), showing {len(rows)}",
            ["id", "priority", "tenant", "reason", "when (UTC)", "deliveries", "task", "args"],
            [
                [
                    r["id"],
                    r["priority"],
                    r["tenant"],
                    r["reason"],
                    render.when(r["dead_ms"]),
                    r["deliveries"],
                    r["task"],
                    r["args"],
                ]
                for r in rows
            ],
            empty="(no dead letters)",
        )
    )


@command()
@click.argument("queue")
@click.option(
    "-n",
    "count",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Leases to show, earliest deadline first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def leases(ctx, queue, count, as_json):
    """Who holds which entries of QUEUE, until when, after how many deliveries (never the
    lease tokens)."""
    with broker_of(ctx).channel() as channel:
        q, _ = queue_named(channel, queue)
        rows = q.leases(count)
    if as_json:
        return print_json(rows)
    render.show(
        render.table(
            f"{queue}: {len(rows)} lease(s)",
            ["id", "consumer", "priority", "tenant", "deliveries", "expires in"],
            [
                [r["id"], r["consumer"], r["priority"], r["tenant"], r["deliveries"], f"{r['seconds_left']:.1f}s"]
                for r in rows
            ],
            empty="(no leases)",
        )
    )


@command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def explain(ctx, queue, as_json):
    """The cost table of QUEUE's technique (Redis reads and writes per operation), with the
    queue's live figures: its size and the stale pointers a pop may have to skip."""
    with broker_of(ctx).channel() as channel:
        q, _ = queue_named(channel, queue)
        s = q.stats()
    stale = max(0, s["index_members"] - s["waiting"]) if not q.settings.fair else 0
    table = costs.explain(stale=min(stale, 64))
    data = {
        "queue": queue,
        "technique": q.mode["technique"],
        "fair": q.settings.fair,
        "priority_order": q.settings.priority_order,
        "waiting": s["waiting"],
        "leased": s["leased"],
        "delayed": s["delayed"],
        "index_members": s["index_members"],
        "stale_pointers": stale,
        "costs": {op: by_t[q.mode["technique"]] for op, by_t in table.items() if q.mode["technique"] in by_t},
    }
    if as_json:
        return print_json(data)
    head = (
        f"{queue}: technique {q.mode['technique']}, {'fair' if q.settings.fair else 'not fair'}, {q.settings.priority_order}; "
        f"waiting {s['waiting']}, leased {s['leased']}, delayed {s['delayed']}; "
        f"priority index {s['index_members']} pointer(s), {stale} stale"
    )
    render.show(
        head,
        render.table(
            f"Redis commands per operation (technique {q.mode['technique']}, {min(stale, 64)} stale pointer(s) ahead)",
            ["operation", "reads", "writes", "commands"],
            [
                [op, c["reads"], c["writes"], " ".join(f"{k}x{n}" for k, n in c["commands"].items())]
                for op, c in data["costs"].items()
            ],
        ),
    )


@command()
@click.argument("queue", metavar="QUEUE[VIEW]")
def backlog(ctx, queue):
    """One number: the due waiting entries a consumer of QUEUE (or of a priority view such as
    'default[>=200]') could take now; delayed entries and tenants held back by a cap, a rate
    or a pause are not counted. For external scalers."""
    with broker_of(ctx).channel() as channel:
        q, view = queue_named(channel, queue)
        click.echo(q.backlog(view))
