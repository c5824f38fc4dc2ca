"""An ops world: a Celery app publishing to a queue of the session redis-server under this
test's key prefix, and ``run`` for the ``python -m celery_pq`` command line (click's CliRunner)."""

from __future__ import annotations

import json
import sys

import pytest
from celery import Celery
from click.testing import CliRunner

import celery_pq  # noqa: F401  registers pq://
from celery_pq import PriorityQueue
from celery_pq.__main__ import main
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.transport.options import Options


class World:
    def __init__(self, server, prefix, options):
        self.server = server
        self.prefix = prefix
        self.options = {"key_prefix": prefix, **options}
        self.url = f"pq://127.0.0.1:{server.port}/0"
        self.app = Celery("ops-test", broker=self.url)
        self.app.conf.broker_transport_options = self.options
        self.app.conf.task_default_queue = "q"
        self.client = server.client(decode_responses=False)

    def send(self, name="ops.work", *args, queue="q", **kw):
        return self.app.send_task(name, args=args, queue=queue, **kw).id

    def declare(self, name="q") -> None:
        """The queue's settings declared as this world's workers would when they start consuming
        (the tenants' caps are the queue's: a producer does not write them; docs/settings.md)."""
        open_queue(self.client, name, Options.from_transport_options(self.options).queue_settings(name))

    def queue(self, name="q", **kw) -> PriorityQueue:
        return open_queue(self.client, name, QueueSettings(key_prefix=self.prefix, **kw), declare=False)

    def broker_args(self) -> list[str]:
        """The command line's way to this world's broker (``--broker``, ``--transport-options``)."""
        return ["--broker", self.url, "--transport-options", json.dumps(self.options)]

    def command(self, *args) -> list[str]:
        """``python -m celery_pq ... ARGS`` as a subprocess's argv (for commands that serve)."""
        return [sys.executable, "-m", "celery_pq", *self.broker_args(), *args]

    def run(self, *args, ok=True, input=None):
        result = CliRunner().invoke(
            main,
            [*self.broker_args(), *args],
            input=input,
            catch_exceptions=False,
        )
        if ok:
            assert result.exit_code == 0, (args, result.output)
        return result

    def close(self):
        self.app.close()
        self.client.close()


@pytest.fixture
def world(redis_server, key_prefix):
    w = World(redis_server, key_prefix, {})
    yield w
    w.close()


@pytest.fixture
def fair_world(redis_server, key_prefix):
    w = World(redis_server, key_prefix, {"fair_key": "tenant", "tenant_concurrency": {"slow": 1, "*": 100}})
    w.declare()
    yield w
    w.close()
