"""``pq`` commands that change a queue: remove, reprioritize, replay, recover, purge, pause, resume.
docs/operations.md."""

from __future__ import annotations

import click

from ...transport.broker import queue_and_view, queue_names
from .base import broker_of, command, confirm, queue_named, queue_of, yes_option


@command()
@click.argument("queue")
@click.argument("task_ids", nargs=-1, required=True)
@yes_option
def remove(ctx, queue, task_ids, yes):
    """Remove the waiting messages of TASK_IDs from QUEUE (REMOVE BY ID); prints how many. Asks first unless --yes."""
    with queue_of(ctx, queue) as (q, _):
        confirm(f"Remove the waiting messages of {len(task_ids)} task id(s) from {queue!r}?", yes)
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
    """Move the waiting message TASK_ID of QUEUE to PRIORITY (0..255), behind the messages already waiting there."""
    with queue_of(ctx, queue) as (q, _):
        q.change_priority(task_id, priority)
    click.echo(f"{task_id}: priority {priority}")


@command()
@click.argument("queue")
@click.argument("task_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter of QUEUE (asks first unless --yes).")
@yes_option
def replay(ctx, queue, task_ids, everything, yes):
    """Dead letters of QUEUE back to QUEUE (each atomically), keeping priority and tenant, with
    the delivery count reset. Give TASK_IDs (as 'pq dead' shows them) or --all."""
    if everything == bool(task_ids):
        raise click.UsageError("give TASK_IDs or --all (not both)")
    with queue_of(ctx, queue) as (q, _):
        if task_ids:
            result = q.replay(task_ids)
        else:
            confirm(f"Replay the {q.dead.size()} dead letter(s) of {queue!r} to it?", yes)
            result = {"replayed": {}, "missing": [], "leased": [], "refused": []}
            while ids := [e.id for e in q.dead.peek(500)]:  # a chunk at a time, in the dead-letter queue's order
                got = q.replay(ids)
                for k in ("missing", "leased", "refused"):
                    result[k] += got[k]
                result["replayed"].update(got["replayed"])
                if not got["replayed"]:
                    break
    n = len(result["replayed"])
    click.echo(f"replayed {n} dead letter(s) to {queue}")
    for why, label in (
        ("missing", "not in the dead-letter queue"),
        ("leased", f"leased by a consumer of {queue}.dead"),
        ("refused", f"left dead: {queue} is full (max_length)"),
    ):
        if result[why]:
            click.echo(f"{label}: {', '.join(result[why])}", err=True)
    if task_ids and n == 0:
        raise click.ClickException(f"nothing replayed to {queue!r}")


@command()
@click.option("--consumer", required=True, help="The consumer id (host:pid:random, as `pq leases` shows).")
@click.argument("queues", nargs=-1)
@yes_option
def recover(ctx, consumer, queues, yes):
    """Return every lease CONSUMER holds (a crashed worker's) at once, without waiting for the
    leases to expire; in QUEUES, or in every declared queue. Asks first unless --yes: a consumer
    still running would run its tasks while they are delivered again."""
    if not consumer.strip():
        raise click.BadParameter("must name a consumer", param_hint="--consumer")
    total = {"returned": 0, "dead": 0}
    with broker_of(ctx).channel() as channel:
        opened = {n: queue_named(channel, n)[0] for n in queues}
        opened = opened or {n: queue_and_view(channel, n)[0] for n in queue_names(channel)}
        names = list(opened)
        where = f"queue(s) {', '.join(names)}" if queues else f"every declared queue ({len(names)})"
        confirm(f"Return every lease consumer {consumer} holds in {where} (only for a consumer that is gone)?", yes)
        for name, q in opened.items():
            r = q.reclaim(consumer=consumer)
            for k in total:
                total[k] += int(r[k])
            if r["returned"] or r["dead"]:
                click.echo(f"{name}: {r['returned']} returned to waiting, {r['dead']} dead-lettered")
    click.echo(
        f"consumer {consumer}: {total['returned']} lease(s) returned, {total['dead']} dead-lettered "
        f"(in {len(names)} queue(s))"
    )


@command()
@click.argument("queue")
@yes_option
def purge(ctx, queue, yes):
    """Delete every waiting and delayed message of QUEUE (leased ones stay leased). Asks first unless --yes."""
    with queue_of(ctx, queue) as (q, _):
        if not yes:
            s = q.stats()
            confirm(f"Delete the {s['waiting']} waiting and {s['delayed']} delayed message(s) of {queue!r}?", yes)
        click.echo(f"purged {q.purge()} message(s) from {queue}")


def _pause_or_resume(verb: str, doc: str) -> None:
    """Register ``pq pause`` or ``pq resume``: of QUEUE, or of one tenant of it with --tenant."""

    @command(name=verb, help=doc)
    @click.argument("queue")
    @click.option("--tenant", default=None, help=f"{verb.capitalize()} only this tenant (a fair queue).")
    def run(ctx, queue, tenant):
        with queue_of(ctx, queue) as (q, _):
            getattr(q, verb)(tenant=tenant)
            state = q.recorded()
        if verb == "pause":
            said = "paused" + ("" if tenant is None else f" for tenant {tenant}")
        else:
            said = "still paused" if state["paused"] else "running"
            said += "" if tenant is None else f"; tenant {tenant} resumed"
        click.echo(f"{queue}: {said} (paused tenants: {', '.join(state['paused_tenants']) or 'none'})")


_pause_or_resume("pause", "Consumers stop receiving QUEUE (or one tenant of it); publishing goes on.")
_pause_or_resume("resume", "Consumers receive QUEUE (or the tenant) again.")
