"""``python -m celery_pq --broker URL COMMAND ...``: the ``celery pq`` commands without a Celery
app (``--help`` lists them; docs/operations.md)."""

from __future__ import annotations

import json

import click

from .ops.cli import pq
from .transport.broker import Broker


@click.group(name="celery_pq")
@click.option(
    "--broker",
    envvar="CELERY_BROKER_URL",
    required=True,
    metavar="URL",
    help="pq://[:PASSWORD@]HOST[:PORT][/DB] (or $CELERY_BROKER_URL).",
)
@click.option(
    "--transport-options",
    "options",
    default=None,
    metavar="JSON",
    help='broker_transport_options as JSON, e.g. \'{"key_prefix": "pq"}\'.',
)
@click.pass_context
def main(ctx, broker, options):
    """celery-pq: inspect and administer the prioritized queues."""
    try:
        parsed = json.loads(options) if options else {}
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--transport-options") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--transport-options")
    ctx.obj = Broker.of(broker, parsed)


for _name, _cmd in pq.commands.items():
    main.add_command(_cmd, _name)

if __name__ == "__main__":
    main()
